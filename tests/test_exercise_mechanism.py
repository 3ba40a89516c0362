"""The check mechanism of attn_course.exercises: forbidden routes, inputs changed in place, dtype and device,
inputs unlike the notebook's, right answers written differently, graded mode, assert_correct, fresh_check,
and the hints of every chapter's checks (no pasted code)."""

import math
import random
import re
import sys
from functools import partial

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import attn_course as ac
import attn_course.exercises as ex
from attn_course.exercises import (
    Feedback,
    Mismatch,
    call,
    exercise,
    expect_close,
    expect_int,
    expect_number,
    expect_same_device,
    expect_sequence,
    expect_tensor,
    forbidden,
    large_scores,
    mutable,
    other_sizes,
    padding_cases,
    padding_mask_for,
    randn,
    rng,
    set_graded,
)

X = torch.tensor([[0.5, -1.0, 2.0, 0.0], [1.0, 3.0, -2.0, 0.25], [0.0, 0.0, 1.0, -1.0]])  # (3, 4)


def _state():
    return sys.getprofile(), torch._C._len_torch_function_stack(), torch.softmax, F.softmax, "softmax" in vars(torch.Tensor)


@pytest.fixture(autouse=True)
def _nothing_left_behind():
    """Every test leaves no profile hook, no torch function mode and torch's functions as they were."""
    before = _state()
    yield
    assert _state() == before


def _checker(*forbid, reason=None):
    """A check that forbids ``forbid`` and calls the answer once on X."""

    @exercise("demo", hint="write it with plain tensor operations", forbid=forbid)
    def check(answer):
        call(answer, X.clone())
        return "fine"

    return check


# --- 1. forbidden routes --------------------------------------------------------------------------

def _q(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


q4, k2 = _q(1, 4, 3, 8), _q(1, 2, 3, 8)
from torch.nn.functional import softmax as renamed_softmax  # noqa: E402  (an alias in the student's namespace)

ROUTES = [
    # (family, route as the message names it, the student's answer)
    ("softmax", "torch.softmax", lambda x: torch.softmax(x, -1)),
    ("softmax", "torch.nn.functional.softmax", lambda x: F.softmax(x, dim=-1)),
    ("softmax", "torch.nn.functional.softmax", lambda x: renamed_softmax(x, -1)),
    ("softmax", "Tensor.softmax", lambda x: x.softmax(-1)),
    ("softmax", "Tensor.softmax", lambda x: torch.Tensor.softmax(x, -1)),
    ("softmax", "Tensor.softmax", lambda x: torch._C.TensorBase.softmax(x, -1)),
    ("softmax", "torch.special.softmax", lambda x: torch.special.softmax(x, -1)),
    ("softmax", "torch._softmax", lambda x: torch._softmax(x, -1, False)),
    ("softmax", "torch._safe_softmax", lambda x: torch._safe_softmax(x, -1)),
    ("softmax", "torch.log_softmax", lambda x: torch.log_softmax(x, -1).exp()),
    ("softmax", "torch._log_softmax", lambda x: torch._log_softmax(x, -1, False).exp()),
    ("softmax", "torch.nn.functional.log_softmax", lambda x: F.log_softmax(x, dim=-1).exp()),
    ("softmax", "Tensor.log_softmax", lambda x: x.log_softmax(-1).exp()),
    ("softmax", "torch.special.log_softmax", lambda x: torch.special.log_softmax(x, -1).exp()),
    ("softmax", "torch.nn.functional.softmin", lambda x: F.softmin(-x, dim=-1)),
    ("softmax", "torch.nn.functional.gumbel_softmax", lambda x: F.gumbel_softmax(x, tau=1.0)),
    ("softmax", "torch.nn.Softmax", lambda x: nn.Softmax(dim=-1)(x)),
    ("softmax", "torch.nn.LogSoftmax", lambda x: nn.LogSoftmax(dim=-1)(x).exp()),
    ("softmax", "torch.nn.Softmin", lambda x: nn.Softmin(dim=-1)(-x)),
    ("softmax", "torch.ops.aten._softmax", lambda x: torch.ops.aten._softmax(x, -1, False)),
    ("softmax", "torch.ops.aten._softmax.default", lambda x: torch.ops.aten._softmax.default(x, -1, False)),
    ("softmax", "torch.ops.aten.softmax.int", lambda x: torch.ops.aten.softmax.int(x, -1)),
    ("softmax", "torch.ops.aten._log_softmax", lambda x: torch.ops.aten._log_softmax(x, -1, False).exp()),
    ("softmax", "torch.masked.softmax", lambda x: torch.masked.softmax(x, -1)),
    ("softmax", "torch.sparse", lambda x: torch.sparse.softmax(x.to_sparse(), -1).to_dense()),
    ("softmax", "torch.nn.functional.softmax", lambda x: torch.distributions.Categorical(logits=x).probs),
    ("softmax", "attn_course.online_softmax", lambda x: ac.online_softmax(x)),
    ("softmax", "inside attn_course.simple_self_attention", lambda x: ac.simple_self_attention(x)[1]),
    ("softmax", "torch.softmax", lambda x: _swallowed(lambda: torch.softmax(x, -1), x)),
    ("tril", "torch.tril", lambda x: torch.tril(torch.ones(4, 4))),
    ("tril", "torch.triu", lambda x: torch.triu(torch.ones(4, 4), 1)),
    ("tril", "Tensor.tril", lambda x: torch.ones(4, 4).tril()),
    ("tril", "Tensor.triu", lambda x: torch.ones(4, 4).triu(diagonal=1)),
    ("tril", "Tensor.tril_", lambda x: torch.ones(4, 4).tril_()),
    ("tril", "Tensor.triu_", lambda x: torch.ones(4, 4).triu_()),
    ("tril", "torch.tril_indices", lambda x: torch.tril_indices(4, 4)),
    ("tril", "torch.triu_indices", lambda x: torch.triu_indices(4, 4)),
    ("tril", "torch.ops.aten.tril", lambda x: torch.ops.aten.tril(torch.ones(4, 4))),
    ("tril", "numpy.tril", lambda x: torch.from_numpy(np.tril(np.ones((4, 4))))),
    ("tril", "numpy.triu", lambda x: torch.from_numpy(np.triu(np.ones((4, 4))))),
    ("tril", "numpy.tri", lambda x: torch.from_numpy(np.tri(4))),
    ("tril", "numpy.tril_indices", lambda x: np.tril_indices(4)),
    ("tril", "torch.nn.Transformer.generate_square_subsequent_mask",
     lambda x: nn.Transformer.generate_square_subsequent_mask(4)),
    ("tril", "attn_course.causal_mask", lambda x: ac.causal_mask(4)),
    ("tril", "attn_course.sliding_window_mask", lambda x: ac.sliding_window_mask(4, 2)),
    ("sdpa", "torch.nn.functional.scaled_dot_product_attention", lambda x: F.scaled_dot_product_attention(q4, q4, q4)),
    ("sdpa", "torch.nn.functional.scaled_dot_product_attention",
     lambda x: torch._C._nn.scaled_dot_product_attention(q4, q4, q4)),
    ("sdpa", "torch.ops.aten.scaled_dot_product_attention",
     lambda x: torch.ops.aten.scaled_dot_product_attention(q4, q4, q4)),
    ("sdpa", "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu",
     lambda x: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q4, q4, q4)[0]),
    ("sdpa", "torch.nn.MultiheadAttention", lambda x: nn.MultiheadAttention(4, 2)(x, x, x)[0]),
    ("sdpa", "torch.nn.MultiheadAttention", lambda x: nn.TransformerEncoderLayer(4, 2, 8, dropout=0.0)(x[None])),
    ("sdpa", "attn_course.scaled_dot_product_attention", lambda x: ac.scaled_dot_product_attention(x, x, x)[0]),
    ("sdpa", "attn_course.simple_self_attention", lambda x: ac.simple_self_attention(x)[0]),
    ("sdpa", "attn_course.SelfAttention", lambda x: ac.SelfAttention(4, 4)(x[None])[0]),
    ("sdpa", "attn_course.MultiHeadAttention", lambda x: ac.MultiHeadAttention(4, 2)(x[None])[0]),
    ("enable_gqa", "torch.nn.functional.scaled_dot_product_attention with enable_gqa=True",
     lambda x: F.scaled_dot_product_attention(q4, k2, k2, enable_gqa=True)),
    ("enable_gqa", "torch.ops.aten.scaled_dot_product_attention with enable_gqa=True",
     lambda x: torch.ops.aten.scaled_dot_product_attention(q4, k2, k2, enable_gqa=True)),
    ("enable_gqa", "attn_course.GroupedQueryAttention", lambda x: ac.GroupedQueryAttention(4, 2, 1)(x[None])),
    ("attn_course", "attn_course.shift_right", lambda x: ac.shift_right(torch.tensor([[1, 2, 3]]), 0)),
    ("attn_course", "attn_course.padding_mask", lambda x: ac.padding_mask([2, 1], 3)),
    ("package", "attn_course.sinusoidal_positional_encoding", lambda x: ac.positional.sinusoidal_positional_encoding(4, 4)),
    ("attention", "attn_course.scaled_dot_product_attention", lambda x: ac.scaled.scaled_dot_product_attention(x, x, x)),
]


def _swallowed(forbidden_call, x):
    """A student who hides the forbidden call in a try/except: still seen."""
    try:
        forbidden_call()
    except Exception:
        pass
    return x.exp() / x.exp().sum(-1, keepdim=True)


@pytest.mark.parametrize("family, route, answer", ROUTES, ids=[f"{r[0]}-{i}-{r[1]}" for i, r in enumerate(ROUTES)])
def test_every_route_of_every_family_is_caught_and_named(family, route, answer):
    feedback = _checker(family)(answer)
    assert feedback.status == "incorrect", str(feedback)
    assert route in feedback.message and feedback.message.startswith("you called "), feedback.message
    reason = ex.FAMILIES[family].reason
    assert reason in feedback.message


def test_torchs_python_references_are_in_the_families():
    """torch._refs and torch._decomp hold Python versions (their first call takes seconds: not called here)."""
    import inspect

    from attn_course.exercises._guards import _build_rules

    softmax, tril = _build_rules(["softmax"], None).codes, _build_rules(["tril"], None).codes
    for function, codes in ((torch._refs.softmax, softmax), (torch._refs.log_softmax, softmax),
                            (torch._refs.nn.functional.softmin, softmax), (torch._refs.tril, tril),
                            (torch._refs.triu, tril)):
        assert inspect.unwrap(function).__code__ in codes, function


ALLOWED = [
    ("softmax", lambda x: torch.exp(x - x.amax(-1, keepdim=True)) / torch.exp(x - x.amax(-1, keepdim=True)).sum(-1, keepdim=True)),
    ("softmax", lambda x: torch.exp(x - torch.logsumexp(x, -1, keepdim=True))),
    ("tril", lambda x: torch.arange(4)[None, :] <= torch.arange(4)[:, None]),
    ("sdpa", lambda x: torch.softmax(x @ x.T / 2.0, dim=-1) @ x),
    ("enable_gqa", lambda x: F.scaled_dot_product_attention(q4, k2.repeat_interleave(2, 1), k2.repeat_interleave(2, 1))),
    ("enable_gqa", lambda x: F.scaled_dot_product_attention(q4, q4, q4, enable_gqa=False)),
    ("attn_course", lambda x: torch.softmax(x, -1)),
]


@pytest.mark.parametrize("family, answer", ALLOWED, ids=[f"{a[0]}-{i}" for i, a in enumerate(ALLOWED)])
def test_what_a_family_does_not_cover_passes(family, answer):
    feedback = _checker(family)(answer)
    assert feedback.status == "correct", str(feedback)


def test_callables_added_by_a_check():
    def helper(x):
        return x.flip(-1)

    class Net(nn.Module):
        def forward(self, x):
            return x * 2

    net = Net()
    cases = [
        ((torch.roll,), lambda x: torch.roll(x, 1), "torch.roll"),
        ((torch.roll,), lambda x: x.roll(1, -1), "Tensor.roll"),
        ((helper,), lambda x: helper(x), "helper"),
        ((helper,), partial(lambda f, x: f(x), helper), "helper"),
        ((math.exp,), lambda x: x * math.exp(1.0), "math.exp"),
        ((Net,), lambda x: Net()(x), "Net"),
        ((net,), lambda x: net(x), "Net"),
        ((nn.Softmax,), lambda x: nn.Softmax(-1)(x), "torch.nn.Softmax"),
    ]
    for forbid, answer, route in cases:
        feedback = _checker(*forbid)(answer)
        assert feedback.status == "incorrect" and f"you called {route}" in feedback.message, (route, str(feedback))
        assert "this exercise asks you to do without it" in feedback.message or route == "torch.nn.Softmax"
    assert _checker(torch.roll)(lambda x: x.flip(-1)).status == "correct"


def test_unknown_family_and_bad_route_fail_where_the_check_is_written():
    with pytest.raises(ValueError, match="unknown family 'sofmax'"):
        exercise("demo", forbid=("sofmax",))
    with pytest.raises(TypeError, match="family name"):
        forbidden(3)


def test_the_checks_own_reference_computation_is_not_watched():
    @exercise("demo", forbid=("softmax", "tril"))
    def check(answer):
        got = call(answer, X)
        expected = torch.softmax(X, dim=-1) * torch.ones(3, 4).tril(1)  # outside call: allowed
        expect_close(got, expected, what="answer(X)")
        return "fine"

    def right(x):
        e = torch.exp(x - x.amax(-1, keepdim=True))
        keep = torch.arange(4)[None, :] <= torch.arange(3)[:, None] + 1
        return e / e.sum(-1, keepdim=True) * keep

    assert check(right).status == "correct"


def test_a_forbidden_call_outranks_the_error_it_caused_and_the_stub():
    def crashes_after(x):
        torch.softmax(x, -1)
        raise RuntimeError("later")

    def stub_after(x):
        x.softmax(-1)
        raise NotImplementedError

    for answer in (crashes_after, stub_after):
        feedback = _checker("softmax")(answer)
        assert feedback.status == "incorrect" and "torch.softmax" in feedback.message.replace("Tensor.", "torch."), str(feedback)


def test_guards_are_restored_after_an_exception_and_nest():
    profile, modes = sys.getprofile(), torch._C._len_torch_function_stack()
    with pytest.raises(Mismatch, match="Tensor.tril"):
        with forbidden("softmax") as outer:
            with forbidden("tril") as inner:
                assert torch._C._len_torch_function_stack() == modes + 2
                torch.ones(2, 2).tril()
                torch.softmax(X, -1)
                raise RuntimeError("the student's code failed")
    assert [v.route for v in inner.violations] == ["Tensor.tril"]
    assert [v.route for v in outer.violations] == ["torch.softmax"]
    assert sys.getprofile() is profile and torch._C._len_torch_function_stack() == modes
    # The inner guard reported its call; the outer one, left by the Mismatch, does not hide it.
    with pytest.raises(Mismatch, match="torch.softmax"):
        with forbidden("softmax"):
            with forbidden("tril"):
                torch.softmax(X, -1)
    assert sys.getprofile() is profile and torch._C._len_torch_function_stack() == modes
    torch.testing.assert_close(torch.tensor([0.0, 0.0]).softmax(-1), torch.tensor([0.5, 0.5]))


def test_call_inside_a_guard_reports_once_and_nothing_escapes_afterwards():
    @exercise("demo")
    def check(answer):
        with forbidden("tril"):
            got = call(answer, 4)
        expect_close(got, torch.ones(4, 4, dtype=torch.bool).tril(), what="mask(4)")
        return "fine"

    assert check(lambda T: torch.ones(T, T, dtype=torch.bool).tril()).message.startswith("you called Tensor.tril")
    assert check(lambda T: torch.arange(T)[None, :] <= torch.arange(T)[:, None]).status == "correct"


def test_a_profiler_that_was_running_keeps_running_and_is_restored():
    events = []

    def profiler(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "marker":
            events.append(event)

    def marker():
        return 1

    sys.setprofile(profiler)
    try:
        with forbidden("softmax"):
            marker()
        assert sys.getprofile() is profiler
    finally:
        sys.setprofile(None)
    assert events == ["call"]


# --- 2. inputs changed in place ------------------------------------------------------------------

class WithBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 2)
        self.register_buffer("count", torch.zeros(1))


def _mutation_check(*args, **kwargs):
    @exercise("demo")
    def check(answer):
        call(answer, *args, **kwargs)
        return "fine"

    return check


def _sub_(t):
    t -= 1


MUTATIONS = [
    # (arguments, answer, the name the message gives)
    ((X.clone(),), lambda scores: scores.sub_(scores.amax(-1, keepdim=True)), "scores"),
    ((X.clone(),), lambda scores: _sub_(scores), "scores"),
    ((X.clone(),), lambda scores: scores.__setitem__((0, 0), 9.0), "scores"),
    ((X.clone(),), lambda scores: scores.resize_(2), "scores"),
    ((), lambda *, scores: scores.mul_(2), "scores"),
    (([X.clone(), X.clone()],), lambda tensors: tensors[1].zero_(), "tensors[1]"),
    (((X.clone(), X.clone()),), lambda pair: pair[0].zero_(), "pair[0]"),
    (({"m": X.clone()},), lambda state: state["m"].zero_(), "state['m']"),
    (({"m": X.clone()},), lambda state: state.update(extra=1), "state"),
    (([3, 1, 2],), lambda lengths: lengths.sort(), "lengths"),
    (([3, 1, 2],), lambda lengths: lengths.append(4), "lengths"),
    ((nn.Linear(2, 2),), lambda layer: layer.weight.data.zero_(), "layer.weight"),
    ((WithBuffer(),), lambda model: model.count.add_(1), "model.count"),
    ((WithBuffer(),), lambda model: model.linear.bias.data.fill_(3), "model.linear.bias"),
    ((np.ones(3),), lambda array: array.__setitem__(0, 5.0), "array"),
    ((X.clone(), X.clone()), lambda *tensors: tensors[1].zero_(), "tensors[1]"),
]


@pytest.mark.parametrize("args, answer, name", MUTATIONS, ids=[f"{i}-{m[2]}" for i, m in enumerate(MUTATIONS)])
def test_the_message_names_the_argument_as_the_student_named_it(args, answer, name):
    def wrapped_with_names(answer):
        # Give call() the answer itself, so that its own parameter names show.
        def returning(*a, **k):
            answer(*a, **k)
            return torch.zeros(1)
        returning.__signature__ = __import__("inspect").signature(answer)
        return returning

    kwargs = {"scores": X.clone()} if not args else {}
    feedback = _mutation_check(*args, **kwargs)(wrapped_with_names(answer))
    assert f"changed its input `{name}` in place" in feedback.message, feedback.message
    assert "work on a copy" in feedback.message


def test_unchanged_inputs_pass_also_with_nan_and_mutable_opts_out():
    nan = torch.tensor([float("nan"), 1.0])
    assert _mutation_check(nan)(lambda x: x * 2).status == "correct"
    assert _mutation_check([3, 1, 2])(lambda lengths: torch.tensor(sorted(lengths))).status == "correct"
    buffer = torch.zeros(4)

    @exercise("demo")
    def check(answer):
        call(answer, mutable(buffer), torch.ones(2))
        expect_close(buffer[:2], torch.ones(2), what="buffer[:2]")
        return "fine"

    def writes(buffer, new):
        buffer[:2] = new
        return buffer

    assert check(writes).status == "correct"


# --- 3. dtype and device --------------------------------------------------------------------------

def test_expect_tensor_checks_kind_exact_dtype_and_device():
    ids = torch.tensor([1, 2, 3])
    assert expect_tensor(ids, what="ids", dtype="integer") is ids
    with pytest.raises(Mismatch, match="expected integers .*got dtype torch.float32"):
        expect_tensor(ids.float(), what="ids", dtype="integer")
    with pytest.raises(Mismatch, match="expected a bool tensor"):
        expect_tensor(ids, what="mask", dtype="bool")
    with pytest.raises(Mismatch, match="expected floating-point numbers"):
        expect_tensor(ids, what="weights", dtype="float")
    with pytest.raises(Mismatch, match="expected dtype torch.float64, got torch.float32"):
        expect_tensor(X, what="x", dtype=torch.float64)
    expect_tensor(X, what="x", dtype=(torch.float32, torch.float64))
    with pytest.raises(Mismatch, match="is on meta, but the inputs are on cpu"):
        expect_tensor(torch.empty(2, device="meta"), what="x", device=X)
    expect_same_device(X, torch.device("cpu"), what="x")
    with pytest.raises(Mismatch, match="expected shape"):
        expect_tensor(X, what="x", shape=(4, 3))


def test_expect_close_checks_the_kind_of_dtype_and_the_device_but_not_float_width():
    expect_close(X.double(), X, what="x")  # float64 for float32: only when the check asks
    with pytest.raises(Mismatch, match="expected dtype torch.float32"):
        expect_close(X.double(), X, what="x", dtype=torch.float32)
    ids = torch.tensor([[4, 1, 2]])
    with pytest.raises(Mismatch, match="expected integers"):
        expect_close(ids.float(), ids, what="decoder inputs")  # a float where token ids are needed
    with pytest.raises(Mismatch, match="expected a bool tensor"):
        expect_close(torch.ones(2, 2), torch.ones(2, 2, dtype=torch.bool), what="mask")
    with pytest.raises(Mismatch, match="expected floating-point"):
        expect_close(torch.ones(2, dtype=torch.long), torch.ones(2), what="weights")
    with pytest.raises(Mismatch, match="is on meta"):
        expect_close(torch.empty(3, 4, device="meta"), X, what="x")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_result_left_on_the_cpu_for_cuda_inputs_is_named():  # pragma: no cover - GPU machines
    x = X.cuda()
    with pytest.raises(Mismatch, match="is on cpu, but the inputs are on cuda"):
        expect_close(x.cpu(), x * 1, what="x")
    expect_close(x * 1, x, what="x")


# --- 5. right answers written differently; tolerance ----------------------------------------------

def test_numbers_written_differently_are_accepted():
    assert expect_int(np.int64(7), what="n") == 7 and type(expect_int(np.int64(7), what="n")) is int
    assert expect_int(np.int32(7), what="n") == 7 and expect_int(7, what="n") == 7
    assert expect_int(torch.tensor(7), what="n") == 7
    assert expect_int(np.prod([2, 3, 4]), what="n") == 24
    for wrong in (True, 7.0, "7", torch.tensor(7.0), [7], None):
        with pytest.raises(Mismatch, match="return an integer"):
            expect_int(wrong, what="n")
    assert expect_number(np.float32(1.5), what="x") == 1.5 and expect_number(np.int64(3), what="x") == 3
    assert expect_number(torch.tensor([2.5]), what="x") == 2.5 and expect_number(2, what="x") == 2
    for wrong in (False, "1", 1j, [1.0]):
        with pytest.raises(Mismatch, match="return a number"):
            expect_number(wrong, what="x")
    assert expect_sequence([1, 2], what="pair", names=("context", "weights")) == (1, 2)
    assert expect_sequence((1, 2), what="pair", length=2) == (1, 2)
    with pytest.raises(Mismatch, match=r"return \(context, weights\) as a tuple; got Tensor"):
        expect_sequence(X, what="pair", names=("context", "weights"))
    with pytest.raises(Mismatch, match="got 3 item"):
        expect_sequence((1, 2, 3), what="pair", length=2)
    assert torch.equal(expect_tensor([1, np.int64(2)], what="slopes", convert=True), torch.tensor([1, 2]))


def test_default_tolerance_accepts_float32_rounding_and_rejects_a_loose_answer():
    scores = torch.tensor([[1000.0, 1001.0, 999.5], [-3.0, 0.5, 2.0]])
    right = torch.softmax(scores, dim=-1)
    other_order = torch.exp(scores - torch.logsumexp(scores, -1, keepdim=True))  # float32 rounding differs
    assert not torch.equal(right, other_order)
    expect_close(other_order, right, what="softmax")
    expect_close(other_order, right.double(), what="softmax")
    expect_close(torch.softmax(scores.double(), -1).float(), right, what="softmax")
    for wrong in (right * (1 + 1e-3), right + 1e-4, torch.softmax(scores.half(), -1).float(),
                  torch.softmax(scores.bfloat16(), -1).float()):
        with pytest.raises(Mismatch, match="values differ"):
            expect_close(wrong, right, what="softmax")
    assert ex.tolerance(torch.float32, torch.float64) == ex.tolerance(torch.float32)
    assert ex.tolerance(torch.float64)[1] < ex.tolerance(torch.float32)[1] < ex.tolerance(torch.float16)[1]
    with pytest.raises(Mismatch):
        expect_close(right.double() + 1e-6, right.double(), what="softmax in float64")


# --- 4. inputs unlike the notebook's; the random state ----------------------------------------------

def test_other_sizes_cover_the_awkward_cases():
    sizes = other_sizes()
    assert {s.B for s in sizes} >= {1, 3}
    assert any(s.L < s.S for s in sizes) and any(s.L > s.S for s in sizes) and any(s.L == 1 for s in sizes)
    assert any(s.B == s.L == s.S for s in sizes)
    assert any(s.E % 2 == 1 for s in sizes) and any(s.H == 1 for s in sizes) and any(s.D == 1 for s in sizes)
    assert all(s.E % s.H == 0 for s in sizes)
    assert all(s.L == s.S for s in other_sizes(same_length=True))
    assert all(s.H <= 2 for s in other_sizes(max_heads=2))
    s = sizes[0]
    assert s.shape("B", "H", "L", "D") == (s.B, s.H, s.L, s.D) and "B=" in str(s)
    with pytest.raises(ValueError, match="axes"):
        s.shape("X")


def test_padding_masks_on_both_sides_and_both_conventions():
    right = padding_mask_for([3, 1], 4)
    assert right.tolist() == [[False, False, False, True], [False, True, True, True]]
    left = padding_mask_for([3, 1], 4, side="left", convention="allowed")
    assert left.tolist() == [[False, True, True, True], [False, False, False, True]]
    cases = dict(padding_cases(3, 5, empty_row=True))
    assert len(cases) == 4
    descriptions = list(cases)
    assert descriptions[0] == "no padding" and not cases["no padding"].any()
    right_case, left_case = cases[descriptions[1]], cases[descriptions[2]]
    assert "right" in descriptions[1] and "left" in descriptions[2]
    assert torch.equal(right_case.sum(-1), left_case.sum(-1)) and not torch.equal(right_case, left_case)
    assert bool(cases[descriptions[3]].all(-1).any())  # one sequence is all padding
    with pytest.raises(ValueError, match="side"):
        padding_mask_for([1], 2, side="middle")


def test_large_scores_break_a_softmax_without_its_max_shift():
    scores = large_scores(4, 6, generator=rng(0))
    assert scores.dtype == torch.float32 and bool((scores[0] > 80).all()) and bool((scores[1] < -80).all())
    naive = torch.exp(scores) / torch.exp(scores).sum(-1, keepdim=True)
    assert not bool(torch.isfinite(naive).all())
    global_max = torch.exp(scores - scores.max()) / torch.exp(scores - scores.max()).sum(-1, keepdim=True)
    assert not bool(torch.isfinite(global_max).all())
    shifted = torch.exp(scores - scores.amax(-1, keepdim=True))
    expect_close(shifted / shifted.sum(-1, keepdim=True), torch.softmax(scores, -1), what="softmax")


def test_seeded_helpers_are_reproducible_and_leave_the_global_generator_alone():
    torch.manual_seed(0)
    state = torch.get_rng_state()
    a = randn(3, 4, generator=rng(5))
    b = randn(3, 4, generator=rng(5), dtype=torch.float64)
    assert a.dtype == torch.float32 and b.dtype == torch.float64
    assert torch.equal(randn(3, generator=rng(5)), randn(3, generator=rng(5)))
    large_scores(2, 3, generator=rng(1))
    assert torch.equal(torch.get_rng_state(), state)
    with pytest.raises(TypeError, match="seed must be an int"):
        rng(1.5)


def test_a_check_leaves_the_notebooks_random_state_as_it_was():
    @exercise("demo")
    def check(answer):
        torch.rand(1)  # a check that (wrongly) draws from the global generator
        call(answer, X)
        return "fine"

    def draws(x):  # a student's answer that draws from every global generator
        torch.rand(5), random.random(), np.random.rand()
        return x

    torch.manual_seed(0), random.seed(0), np.random.seed(0)
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(0), random.seed(0), np.random.seed(0)
    assert check(draws).status == "correct"
    assert check(lambda x: 1 / 0).status == "error"
    got = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(got[0], expected[0]) and got[1:] == expected[1:]


def test_chapter_checks_leave_the_random_state_as_it_was():
    from attn_course.exercises.ch02 import check_batched_self_attention, check_stable_softmax

    torch.manual_seed(123)
    state = torch.get_rng_state()
    check_stable_softmax(lambda s: torch.exp(s - s.amax(-1, keepdim=True)) / torch.exp(s - s.amax(-1, keepdim=True)).sum(-1, keepdim=True))
    check_batched_self_attention(lambda x: (x, x))
    assert torch.equal(torch.get_rng_state(), state)


# --- 6. graded mode and hints ---------------------------------------------------------------------

@pytest.fixture
def graded_off(monkeypatch):
    monkeypatch.delenv("ATTN_COURSE_GRADED", raising=False)
    set_graded(None)
    yield monkeypatch
    set_graded(None)


@exercise("demo", hint="add one to every value")
def _check_add_one(fn):
    expect_close(call(fn, torch.tensor([1.0])), torch.tensor([2.0]), what="fn([1.0])")
    return "fine"


def test_graded_mode_omits_the_hint_and_keeps_the_named_mistake(graded_off):
    wrong = _check_add_one(lambda t: t + 2)
    assert "Hint: add one" in str(wrong) and wrong.hint
    graded_off.setenv("ATTN_COURSE_GRADED", "1")
    for answer, status in ((lambda t: t + 2, "incorrect"), (lambda t: 1 / 0, "error")):
        feedback = _check_add_one(answer)
        assert feedback.status == status and "Hint" not in str(feedback) and feedback.hint is None
        assert ("expected 2.0000, got 3.0000" in str(feedback)) or ("ZeroDivisionError" in str(feedback))
    assert "Hint" not in str(wrong)  # made before, printed now: graded mode applies at printing too
    set_graded(False)  # the switch outranks the environment
    assert "Hint: add one" in str(_check_add_one(lambda t: t + 2))
    graded_off.delenv("ATTN_COURSE_GRADED")
    set_graded(True)
    assert "Hint" not in str(_check_add_one(lambda t: t + 2)) and ex.is_graded()
    set_graded(None)
    assert not ex.is_graded()
    with pytest.raises(TypeError, match="graded"):
        set_graded("yes")


# Hints point the way in words. These patterns are pasted code.
CODE_PATTERNS = {
    "an assignment": re.compile(r"\b[A-Za-z_]\w*(?:\[[^\]]*\])?\s=\s(?!=)"),
    "a call chain": re.compile(r"\w\([^()]*\)\.\w"),
    "a library call with arguments": re.compile(r"\b(?:torch|F|np|nn|math|ac|attn_course)\.[\w.]*\w\((?!\))"),
    "a method call with arguments": re.compile(r"\b[a-z_]\w*\.[a-z_]\w*\((?!\))"),
    "slicing": re.compile(r"\w\[[^\]]*:[^\]]*\]"),
}


def pasted_code(text):
    """The kinds of pasted code found in ``text`` (empty when it reads as words)."""
    return [kind for kind, pattern in CODE_PATTERNS.items() if text and pattern.search(text)]


def test_the_code_detector_tells_code_from_words():
    assert pasted_code("m = scores.max(dim=-1, keepdim=True).values") == ["an assignment", "a call chain", "a method call with arguments"]
    assert "a library call with arguments" in pasted_code("then torch.exp(scores - m)")
    assert "slicing" in pasted_code("compare outputs[:, :t + 1]")
    for words in ("subtract each row's own maximum before exponentiating, and keep the axis (keepdim)",
                  "the softmax runs over the keys, the last axis; use torch.exp and .sum",
                  "shape (B, T, E) -> (B, E, T); qk_head_dim=None means E // num_heads"):
        assert pasted_code(words) == [], words


def _all_checks():
    return list(ex.iter_checks())


# Hints that paste code today, by check. Chapter engineers: rewrite the hint in words, then delete its
# entry here (the strict xfail fails once the hint is clean).
PASTED_HINTS: set[str] = set()  # none today: every hint points the way in words


def _hint_params():
    params = []
    for module, name, check in _all_checks():
        key = f"{module}.{name}"
        marks = [pytest.mark.xfail(strict=True, reason="the hint pastes code: rewrite it in words")] \
            if key in PASTED_HINTS else []
        params.append(pytest.param(check, id=key, marks=marks))
    return params


@pytest.mark.parametrize("check", _hint_params())
def test_hints_point_the_way_without_pasting_code(check):
    hint = check.__exercise__.hint or ""
    assert hint, "every check has a hint"
    assert pasted_code(hint) == [], hint


def test_every_listed_hint_exists():
    keys = {f"{m}.{n}" for m, n, _ in _all_checks()}
    assert PASTED_HINTS <= keys, PASTED_HINTS - keys
    assert len(keys) >= 40  # ten chapters, about four checks each


def test_the_mechanisms_own_messages_paste_no_code():
    messages = [ex.NOT_ATTEMPTED_MESSAGE]
    messages += [family.reason for family in ex.FAMILIES.values()]
    messages.append(_checker("softmax")(lambda x: x.log_softmax(-1).exp()).message)
    messages.append(_mutation_check(X.clone())(lambda scores: scores.zero_()).message)
    for raising in (lambda: expect_tensor(torch.empty(1, device="meta"), what="x", device=X),
                    lambda: expect_tensor(X, what="ids", dtype="integer"),
                    lambda: expect_int(1.5, what="n"), lambda: expect_number("x", what="n"),
                    lambda: expect_sequence(X, what="pair", length=2), lambda: expect_close(X + 1, X, what="x")):
        with pytest.raises(Mismatch) as caught:
            raising()
        messages.append(str(caught.value))
    for message in messages:
        assert pasted_code(message) == [], message


# --- 9. the guide's worked example runs -----------------------------------------------------------

def test_the_worked_example_of_the_guide_works():
    doc = ex.__doc__
    code = doc[doc.index("Worked example::") + len("Worked example::"):doc.index("Families for ``forbid``")]
    namespace = {}
    exec("import torch\nfrom attn_course.exercises import *\n" + __import__("textwrap").dedent(code), namespace)
    check = namespace["check_stable_softmax"]
    assert check(_right_softmax).status == "correct"
    assert "you called torch.softmax" in check(lambda s: torch.softmax(s, -1)).message
    assert "first axis" in check(lambda s: torch.exp(s) / torch.exp(s).sum(0, keepdim=True)).message
    naive = check(lambda s: torch.exp(s) / torch.exp(s).sum(-1, keepdim=True))
    assert naive.status == "incorrect" and "NaN" in naive.message
    assert "families" not in ex._guards.describe_families() and ex._guards.describe_families().count("\n") == 4


# --- 7. assert_correct and fresh_check -----------------------------------------------------------

def test_assert_correct_passes_only_a_correct_answer():
    right = _check_add_one(lambda t: t + 1)
    assert right.assert_correct() is right
    for answer in (lambda t: t + 2, lambda t: 1 / 0, ..., lambda t: None):
        feedback = _check_add_one(answer)
        with pytest.raises(AssertionError) as caught:
            feedback.assert_correct()
        assert str(caught.value) == str(feedback) and feedback.status != "correct"


def _right_softmax(s):
    e = torch.exp(s - s.amax(dim=-1, keepdim=True))
    return e / e.sum(dim=-1, keepdim=True)


def test_fresh_check_cannot_be_fooled_by_redefinitions_or_patches():
    import attn_course.exercises.ch02 as ch02

    old_check = ch02.check_stable_softmax
    notebook = {}
    exec("from attn_course.exercises.ch02 import check_stable_softmax\n"
         "import attn_course.exercises, attn_course.exercises.ch02\n"
         "check_stable_softmax = lambda f: 'correct'\n"
         "attn_course.exercises.ch02.check_stable_softmax = lambda f: 'correct'\n"
         "attn_course.exercises.call = lambda fn, *a, **k: torch.softmax(*a, dim=-1)\n"
         "import torch\n"
         "def stable_softmax(s):\n"
         "    return torch.softmax(s, dim=-1)\n", notebook)
    assert notebook["check_stable_softmax"](None) == "correct" and ch02.check_stable_softmax(None) == "correct"
    real = ex.fresh_check("ch02", "check_stable_softmax")
    feedback = real(notebook["stable_softmax"])
    assert isinstance(feedback, Feedback) and feedback.status == "incorrect" and "torch.softmax" in feedback.message
    assert real(_right_softmax).status == "correct"
    import attn_course.exercises as reloaded
    assert reloaded.call is not None and ch02.check_stable_softmax is not old_check
    # Checks imported before the reload keep working (the exception classes kept their identity).
    assert old_check(_right_softmax).status == "correct" and old_check(notebook["stable_softmax"]).status == "incorrect"
    assert _check_add_one(lambda t: t + 2).status == "incorrect"
    from attn_course.exercises.ch08 import check_cache_attention_step  # uses mutable(), imported before the reload

    def cache_attention_step(query, key, value, cache_keys, cache_values, length):
        T = query.size(2)
        cache_keys[:, :, length:length + T], cache_values[:, :, length:length + T] = key, value
        allowed = ac.causal_mask(T, length + T, align="bottom_right", device=query.device)
        return F.scaled_dot_product_attention(query, cache_keys[:, :, :length + T], cache_values[:, :, :length + T],
                                              attn_mask=allowed)

    assert check_cache_attention_step(cache_attention_step).status == "correct"
    for chapter in ("02", 2, "attn_course.exercises.ch02"):
        assert ex.fresh_check(chapter, "check_stable_softmax")(_right_softmax)
    with pytest.raises(ValueError, match="no check named"):
        ex.fresh_check("ch02", "check_nothing")
    with pytest.raises(ValueError, match="chapter must be"):
        ex.fresh_check("two", "check_stable_softmax")


def test_fresh_check_keeps_graded_mode(graded_off):
    set_graded(True)
    import importlib

    fresh = importlib.reload(importlib.import_module("attn_course.exercises")).fresh_check("ch02", "check_stable_softmax")
    feedback = fresh(lambda s: torch.exp(s) / torch.exp(s).sum(-1, keepdim=True))
    assert feedback.status == "incorrect" and feedback.hint is None and "Hint" not in str(feedback)


@pytest.mark.parametrize("patch", ["assert_correct", "__init__", "__bool__", "is_graded"])
def test_fresh_check_refuses_a_mechanism_changed_in_memory(patch):
    """_core is never reloaded; a notebook that patched it must not pass a grader's test cell."""
    import attn_course.exercises as ex
    from attn_course.exercises import _core

    target, name = (_core, patch) if patch == "is_graded" else (_core.Feedback, patch)
    original = vars(target)[name]
    ex.fresh_check("ch02", "check_stable_softmax")  # untouched: fine
    replacement = (lambda *args, **kwargs: True) if patch != "__init__" else (lambda self, *a, **k: original(self, *a, **k))
    setattr(target, name, replacement)
    try:
        with pytest.raises(RuntimeError, match=name):
            ex.fresh_check("ch02", "check_stable_softmax")
    finally:
        setattr(target, name, original)
    ex.fresh_check("ch02", "check_stable_softmax")  # restored: fine again


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_a_half_precision_result_of_float32_inputs_is_named(half):
    """Its looser tolerance would hide other mistakes (review of chapter 03: a scale off by 3e-4)."""

    @exercise("Scale")
    def check_scale(fn):
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
        expect_close(call(fn, x), x * 0.5, what="scale(x)")
        return "ok"

    wrong = check_scale(lambda x: (x * 0.5).to(half))
    assert wrong.status == "incorrect" and str(half) in wrong.message and "float32" in wrong.message
    assert check_scale(lambda x: x * 0.5), "float32 in, float32 out"
    assert check_scale(lambda x: x.double() * 0.5), "more precise than the inputs is not a mistake"


# --------------------------------------------------------------------------------------------------
# The checks' own code: an answer that calls a check module's reference is named; what the check hands over runs

_FAKE_CHECK_SOURCE = '''
import torch
from torch import nn
from attn_course.exercises import call

def _reference(x):
    return _helper(x) * 2

def _helper(x):
    return x + 1

class Doubler(nn.Module):
    def forward(self, x):
        return _helper(x) * 2

def run(fn, *args):
    return call(fn, *args)
'''


def _fake_check_module():
    module = type(sys)("attn_course.exercises.ch99")
    exec(compile(_FAKE_CHECK_SOURCE, "<ch99>", "exec"), module.__dict__)
    return module


def test_an_answer_that_calls_the_checks_reference_is_named():
    ch99 = _fake_check_module()
    x = torch.arange(3.0)
    with pytest.raises(ex.Mismatch, match=r"attn_course\.exercises\.ch99\._reference: that is the check's own code"):
        ch99.run(lambda t: ch99._reference(t), x)
    with pytest.raises(ex.Mismatch, match=r"ch99\._helper"):
        ch99.run(lambda t: ch99._helper(t) * 2, x)
    # the student's own code, and what the check passed in (a module whose forward calls the check's helper), run
    assert torch.equal(ch99.run(lambda t: (t + 1) * 2, x), torch.tensor([2.0, 4.0, 6.0]))
    assert torch.equal(ch99.run(lambda model, t: model(t), ch99.Doubler(), x), torch.tensor([2.0, 4.0, 6.0]))
    assert torch.equal(ch99.run(lambda f, t: f(t), ch99._reference, x), torch.tensor([2.0, 4.0, 6.0]))


def test_a_real_check_names_an_answer_built_on_its_reference():
    from attn_course.exercises import ch01
    feedback = ch01.check_general_attention(lambda s, H, W_a: ch01._general(s, H, W_a))
    assert feedback.status == "incorrect" and "check's own code" in str(feedback), str(feedback)


def test_call_elsewhere_names_tensors_made_on_the_cpu():
    meta = torch.device("meta")
    x = torch.randn(2, 3, device=meta)
    what = "f(x) on the meta device"
    got = ex.call_elsewhere(lambda t: t * 2, x, device=meta, what=what)
    assert ex.expect_on_device(got, meta, what).shape == (2, 3)
    with pytest.raises(ex.Mismatch, match="It works only with CPU tensors: a tensor made without device="):
        ex.call_elsewhere(lambda t: t + torch.zeros(2, 3), x, device=meta, what=what)
    with pytest.raises(ex.Mismatch, match="numpy holds only CPU data"):
        ex.call_elsewhere(lambda t: torch.from_numpy(t.numpy()), x, device=meta, what=what)
    assert ex.call_elsewhere(lambda t: t * t.sum().item(), x, device=meta, what=what) is None  # needs values: not judged
    with pytest.raises(ex.Mismatch, match="your result is on cpu"):
        ex.expect_on_device(torch.zeros(2, 3), meta, what)
    with pytest.raises(ex.NotAttempted):
        ex.call_elsewhere(lambda t: ..., x, device=meta, what=what)
    assert ex.other_device().type in ("meta", "cuda", "mps")


def test_call_elsewhere_watches_on_the_cpu_what_the_meta_device_cannot_run():
    # An answer that reads a value cannot run on meta; with cpu_args it runs on the CPU under a DeviceWatch,
    # which names a tensor made without device= that meets the inputs, and a result left on the CPU.
    meta, x = torch.device("meta"), torch.randn(2, 3)
    what = "f(x) on the meta device"

    def elsewhere(fn, **options):
        return ex.call_elsewhere(fn, x.to(meta), device=meta, what=what, cpu_args=(x,), **options)

    assert elsewhere(lambda t: t * t.sum().item()) is None  # reads a value, keeps to the device: not named
    assert elsewhere(lambda t: torch.full((2, 3), float(t.max()), device=t.device)) is None
    assert elsewhere(lambda t: torch.tensor(t.tolist()).to(t.device), copy_out_is_a_mistake=False) is None
    assert elsewhere(lambda t: t[t > 0].sum() * torch.ones_like(t)) is None
    with pytest.raises(ex.Mismatch, match="mixed a tensor made without device="):
        elsewhere(lambda t: t + torch.zeros(2, 3) if t.sum() > -1e9 else t)  # a branch hides the CPU tensor
    with pytest.raises(ex.Mismatch, match="your result is made without device="):
        elsewhere(lambda t: torch.full((2, 3), float(t.max())))
    with pytest.raises(ex.Mismatch, match="your result is made without device="):
        elsewhere(lambda t: torch.tensor(t.tolist()), copy_out_is_a_mistake=False)  # never moved back
    with pytest.raises(ex.Mismatch, match="your result is made without device="):
        elsewhere(lambda t: (t * 2, torch.zeros(3)) if bool(t.any()) else None)  # one of two results
    with pytest.raises(ex.Mismatch, match="your result is made without device="):
        elsewhere(lambda t: (t * 2).cpu(), copy_out_is_a_mistake=False)  # .cpu() of a CPU tensor is itself: still named


def test_call_elsewhere_names_a_value_read_where_the_statement_forbids_it():
    meta, x = torch.device("meta"), torch.randn(2, 3)
    for fn in (lambda t: t * float(t.max()), lambda t: t * t.max().item(), lambda t: t if bool(t.any()) else -t,
               lambda t: torch.stack([t[i] * 2 for i in range(int(t.new_ones(()).sum()) + 1)])):
        with pytest.raises(ex.Mismatch, match="brings a value from the device to the host"):
            ex.call_elsewhere(fn, x.to(meta), device=meta, what="f", cpu_args=(x,), reading_values_is_a_mistake=True)
        with pytest.raises(ex.Mismatch, match="brings a value from the device to the host"):  # no CPU copy given
            ex.call_elsewhere(fn, x.to(meta), device=meta, what="f", reading_values_is_a_mistake=True)
    got = ex.call_elsewhere(lambda t: t * t.amax(), x.to(meta), device=meta, what="f", cpu_args=(x,),
                            reading_values_is_a_mistake=True)
    assert got.device.type == "meta"
    # The watch itself, as a GPU run uses it: a read of a value on the device is recorded, other work is not.
    from attn_course.exercises._device import DeviceWatch
    with DeviceWatch(x) as watch:
        y = x * 2 + torch.zeros((), dtype=x.dtype)
    assert watch.read is None and watch.mixed is None and watch.off_device(y) == 0
    with DeviceWatch(x) as watch:
        y = x * float(x.sum())
    assert watch.read == "__float__" and watch.off_device(y) == 0


def test_expect_close_shows_the_digits_where_two_numbers_differ():
    with pytest.raises(ex.Mismatch, match=r"expected 2\.0000, got 3\.0000"):
        ex.expect_close(torch.tensor([3.0]), torch.tensor([2.0]), what="x")
    with pytest.raises(ex.Mismatch) as raised:
        ex.expect_close(torch.tensor([0.0045013], dtype=torch.float64), torch.tensor([0.0044812], dtype=torch.float64), what="x")
    assert "expected 0.004481, got 0.004501" in str(raised.value)
    with pytest.raises(ex.Mismatch) as raised:  # tiny values: decimals would print 0.0000 twice
        ex.expect_close(torch.tensor([2e-5], dtype=torch.float64), torch.tensor([1e-5], dtype=torch.float64), what="x")
    assert "expected 1e-05, got 2e-05" in str(raised.value)


def test_expect_gradients_names_an_answer_that_cannot_be_trained_through():
    x, layer = torch.randn(2, 3), nn.Linear(3, 4)

    def reference(x, layer):
        return torch.softmax(layer(x), dim=-1)

    def run(answer):
        ex.expect_gradients(answer, (x, layer), reference, what="f(x, layer)", names=("x", "layer"))

    def under_no_grad(x, layer):
        with torch.no_grad():
            return reference(x, layer)

    def zeroed_in_place(x, layer):
        weights = reference(x, layer)
        weights[:, 0] = 0.0  # writes into the softmax's output, which autograd saved
        return weights

    run(reference)
    run(lambda x, layer: torch.exp(layer(x)) / torch.exp(layer(x)).sum(-1, keepdim=True))  # right, written otherwise
    for answer, words in ((lambda x, layer: reference(x, layer).detach(), "carries no gradient"),
                          (under_no_grad, "carries no gradient"),
                          (lambda x, layer: reference(x.detach(), layer), "no gradient reaches x"),
                          (lambda x, layer: torch.softmax(x @ layer.weight.T + layer.bias.detach(), -1),
                           "no gradient reaches layer.bias"),
                          (lambda x, layer: torch.softmax(layer(x) + 0 * x.detach().sum(), -1) * 1.0, None),
                          (zeroed_in_place, "backpropagating through them raised"),
                          (lambda x, layer: reference(x, layer) * (x.sum() / x.detach().sum()),  # same values
                           "differs from the reference's")):
        if words is None:
            run(answer)  # an extra detached term that adds 0 changes no gradient: right
            continue
        with pytest.raises(ex.Mismatch, match=words):
            run(answer)
    assert layer.weight.grad is None and not x.requires_grad  # the caller's tensors and module are left alone


def test_call_names_an_in_place_write_that_keeps_the_values():
    x = torch.randn(3)
    for answer in (lambda t: t.mul_(1.0), lambda t: t.clamp_(-1e9, 1e9), lambda t: t.unsqueeze_(0).squeeze_(0)):
        with pytest.raises(ex.Mismatch, match="changed its input `t` in place .*even though its values came out the same"):
            ex.call(answer, x)
    assert torch.equal(ex.call(lambda t: t.clone().mul_(2.0), x), x * 2)  # a copy may be written in place
    layer = nn.Linear(3, 3)

    class Doubles(nn.Module):
        def forward(self, inputs):
            return inputs.mul_(1.0) * 2

    with pytest.raises(ex.Mismatch, match="changed its input `inputs` in place"):  # named by the module's forward
        ex.call(Doubles(), x)
    assert ex.call(layer, x).shape == (3,)


def test_device_watch_keeps_the_original_of_a_move_on_the_cpu():
    from attn_course.exercises._device import DeviceWatch
    x, loose = torch.randn(3), torch.randn(3)
    with DeviceWatch(x) as watch:
        moved = loose.to(x.device)  # on the CPU .to returns the tensor itself; on a GPU a new one
        y = x + moved
    assert watch.mixed is None and watch.off_device(y) == 0 and watch.off_device(loose) == 1
    with DeviceWatch(x) as watch:
        loose.to(x.device)
        x + loose  # the original was not moved: on a GPU this fails
    assert watch.mixed in ("add", "__add__")


def test_device_watch_reads_where_a_move_goes():
    from attn_course.exercises._device import DeviceWatch
    x, loose = torch.randn(3), torch.randn(3)
    cases = [  # (code, whether the result is on the device)
        (lambda: loose.to(x.device), True), (lambda: loose.to(x), True), (lambda: loose.type_as(x), True),
        (lambda: loose.to(device=x.device, dtype=torch.float64), True), (lambda: loose.to(torch.float64), False),
        (lambda: loose.to(x.dtype), False), (lambda: x.to(torch.float64), True), (lambda: x.to("cpu"), False),
        (lambda: torch.zeros(3, device="cpu"), False), (lambda: torch.zeros(3, device=x.device), True),
        (lambda: torch.zeros(3).to(x.dtype), False),
    ]
    for code, on_device in cases:
        with DeviceWatch(x) as watch:
            out = code()
        assert (watch.off_device(out) == 0) == on_device, code


def test_device_watch_keeps_a_move_to_a_cpu_tensors_device_on_the_cpu():
    from attn_course.exercises._device import DeviceWatch
    x, scores, ids = torch.randn(3), torch.randn(3), torch.tensor([0, 2])
    with DeviceWatch(x) as watch:
        picked = scores[ids.to(scores.device)]  # scores made without device=: on a GPU all of this is on the CPU
        moved = ids.to(x.device)
        made = torch.zeros(2, device=scores.device)
    assert watch.off_device(picked) == 1 and watch.off_device(moved) == 0 and watch.off_device(made) == 1
