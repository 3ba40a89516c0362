"""The exercise checks of chapter 03: right, wrong, crashing and untouched answers."""

import math

import pytest
import torch
from torch import nn

from attn_course.exercises.ch03 import (
    check_score_std,
    check_self_attention_by_hand,
    check_self_attention_module,
    check_softmax_jacobian,
)


def _scaffold(*args):
    ...


# --- right answers -------------------------------------------------------------------------------

def by_hand(x, W_query, W_key, W_value, *, scale=None, dim=-1, transpose=False):
    queries, keys, values = x @ W_query, x @ W_key, x @ W_value
    scale = 1 / math.sqrt(keys.size(-1)) if scale is None else scale
    scores = queries @ keys.T * scale
    weights = torch.softmax(scores.T if transpose else scores, dim=dim)
    return weights @ values, weights


def jacobian(p):
    return torch.diag(p) - torch.outer(p, p)


class Module(nn.Module):
    def __init__(self, d_in, d_k, d_v, scale_width=None, detach=False):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_k, bias=False)
        self.W_key = nn.Linear(d_in, d_k, bias=False)
        self.W_value = nn.Linear(d_in, d_v, bias=False)
        self.scale_width, self.detach = scale_width, detach

    def forward(self, x):
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
        width = self.scale_width(q, v) if self.scale_width else q.size(-1)
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(width), dim=-1)
        out = w @ v
        return (out.detach(), w) if self.detach else (out, w)


def test_right_answers_pass():
    for feedback in (check_self_attention_by_hand(by_hand), check_softmax_jacobian(jacobian), check_self_attention_module(Module)):
        assert feedback.status == "correct", str(feedback)
        assert bool(feedback)
    assert "saturated softmax" in check_softmax_jacobian(jacobian).message


def test_float32_jacobian_passes():
    assert check_softmax_jacobian(lambda p: jacobian(p.float()))


def test_alternative_right_answers_pass():
    # The Jacobian entry by entry from the formula, and a module that calls the package.
    loops = lambda p: torch.stack([torch.stack([p[i] * (float(i == j) - p[j]) for j in range(len(p))]) for i in range(len(p))])
    assert check_softmax_jacobian(loops)

    class CallsThePackage(Module):
        def forward(self, x):
            import attn_course as ac
            return ac.scaled_dot_product_attention(self.W_query(x), self.W_key(x), self.W_value(x))

    assert check_self_attention_module(CallsThePackage)


# --- wrong answers say what is wrong -------------------------------------------------------------

@pytest.mark.parametrize(
    "answer, text",
    [
        (lambda x, q, k, v: by_hand(x, q, k, v, scale=1.0), "forgot to divide"),
        (lambda x, q, k, v: by_hand(x, q, k, v, scale=1 / 16), "divide by its square root"),
        (lambda x, q, k, v: by_hand(x, q, k, v, scale=1 / math.sqrt(6)), "width of the values"),
        (lambda x, q, k, v: by_hand(x, q, k, v, dim=0), "columns sum to one"),
        (lambda x, q, k, v: by_hand(x, q, k, v, scale=1 / math.sqrt(4)), "width of the input tokens"),
        (lambda x, q, k, v: by_hand(x, q, k, v, transpose=True), "transposed"),
        (lambda x, q, k, v: by_hand(x, q, k, v)[1], "return (context, weights)"),
        (lambda x, q, k, v: (x @ v, by_hand(x, q, k, v)[1]), "values themselves"),
        (lambda x, q, k, v: (by_hand(x, q, k, v)[0][:, :3], by_hand(x, q, k, v)[1]), "shape (5, 6)"),
        (lambda x, q, k, v: (by_hand(x, q, k, v)[0], by_hand(x, q, k, v)[1][:4]), "shape (5, 5)"),
    ],
)
def test_self_attention_by_hand_wrong_answers(answer, text):
    feedback = check_self_attention_by_hand(answer)
    assert feedback.status == "incorrect", str(feedback)
    assert text in feedback.message, feedback.message
    assert "Hint:" in str(feedback)


@pytest.mark.parametrize(
    "answer, text",
    [
        (lambda p: torch.diag(p), "your matrix is diagonal"),
        (lambda p: -torch.outer(p, p), "on the diagonal (i = j) miss a term"),
        (lambda p: torch.outer(p, p) - torch.diag(p), "signs are flipped"),
        (lambda p: torch.diag(p) - 0.5 * torch.outer(p, p), "values differ"),
        (lambda p: p, "expected shape"),
        (lambda p: torch.diag(p * (1 - p)), "entries off the diagonal are missing"),
        (lambda p: torch.diag(p) - p @ p, "dot product"),
    ],
)
def test_softmax_jacobian_wrong_answers(answer, text):
    feedback = check_softmax_jacobian(answer)
    assert feedback.status == "incorrect" and text in feedback.message, str(feedback)


class NotAModule:
    def __init__(self, *args):
        pass


class WithBias(Module):
    def __init__(self, d_in, d_k, d_v):
        super().__init__(d_in, d_k, d_v)
        self.W_key = nn.Linear(d_in, d_k)


class SwappedWidths(Module):
    def __init__(self, d_in, d_k, d_v):
        super().__init__(d_in, d_k, d_v)
        self.W_value = nn.Linear(d_in, d_k, bias=False)


class BatchSoftmax(Module):
    def forward(self, x):
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=0)
        return w @ v, w


class MissingKey(nn.Module):
    def __init__(self, d_in, d_k, d_v):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_k, bias=False)

    def forward(self, x):
        return x, x


@pytest.mark.parametrize(
    "answer, text",
    [
        (NotAModule, "subclass of torch.nn.Module"),
        (MissingKey, "attribute W_key"),
        (WithBias, "no bias"),
        (SwappedWidths, "W_value must map d_in=5 to 3"),
        (lambda *a: Module(*a, scale_width=lambda q, v: v.size(-1)), "width of the values"),
        (lambda *a: Module(*a, scale_width=lambda q, v: 1), "forgot to divide"),
        (lambda *a: Module(*a, detach=True), "does not require grad"),
        (lambda *a: Module(*a, scale_width=lambda q, v: 5), "width of the input tokens"),
        (BatchSoftmax, "over the batch"),
    ],
)
def test_self_attention_module_wrong_answers(answer, text):
    feedback = check_self_attention_module(answer)
    assert feedback.status == "incorrect" and text in feedback.message, str(feedback)


# --- crashing answers: an "error" feedback, no traceback ------------------------------------------

class Crashes(Module):
    def forward(self, x):
        return self.W_query(x) @ self.W_value(x)


@pytest.mark.parametrize(
    "check, answer",
    [
        (check_self_attention_by_hand, lambda x, q, k, v: (x @ q) @ (x @ k)),
        (check_softmax_jacobian, lambda p: torch.outer(p, p[:2]) - torch.diag(p)),
        (check_self_attention_module, Crashes),
        (check_self_attention_module, lambda *a: 1 / 0),
    ],
)
def test_crashing_answers_give_an_error_feedback(check, answer):
    feedback = check(answer)
    assert feedback.status == "error", str(feedback)
    assert "Your code raised" in feedback.message and "Traceback" not in str(feedback)


# --- the untouched scaffold is "not attempted" ---------------------------------------------------

class Scaffold(nn.Module):
    def __init__(self, d_in, d_k, d_v):
        super().__init__()
        ...  # your code here

    def forward(self, x):
        ...  # your code here


@pytest.mark.parametrize(
    "check, scaffold",
    [
        (check_self_attention_by_hand, _scaffold),
        (check_softmax_jacobian, _scaffold),
        (check_self_attention_module, Scaffold),
        (check_self_attention_module, ...),
    ],
)
def test_untouched_scaffold_is_not_attempted(check, scaffold):
    feedback = check(scaffold)
    assert feedback.status == "not attempted" and "Not attempted yet" in str(feedback)
    assert not feedback


# --- the shared mechanism's classes, and the answers the review tried (reviews/chapters-03-04.md) --

def _by_hand_parts(x, W_query, W_key, W_value):
    return x @ W_query, x @ W_key, x @ W_value


def by_hand_sdpa(x, W_query, W_key, W_value):  # torch's fused attention, forbidden in exercise 1
    q, k, v = _by_hand_parts(x, W_query, W_key, W_value)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v), by_hand(x, W_query, W_key, W_value)[1]


def by_hand_package(x, W_query, W_key, W_value):  # the package's attention, forbidden in exercise 1
    import attn_course as ac
    return ac.scaled_dot_product_attention(*_by_hand_parts(x, W_query, W_key, W_value))


def by_hand_in_place(x, W_query, W_key, W_value):  # right values, but the caller's x is divided in place
    x /= 1.0
    x += 1e-3
    return by_hand(x, W_query, W_key, W_value)


def by_hand_exp_without_shift(x, W_query, W_key, W_value):  # overflows on scores near 100
    q, k, v = _by_hand_parts(x, W_query, W_key, W_value)
    e = torch.exp(q @ k.T / math.sqrt(k.size(-1)))
    w = e / e.sum(-1, keepdim=True)
    return w @ v, w


def by_hand_weights_on_meta(x, W_query, W_key, W_value):  # the result on another device than the inputs
    return tuple(t.to("meta") for t in by_hand(x, W_query, W_key, W_value))


def by_hand_half(x, W_query, W_key, W_value):  # computed in float16
    return tuple(t.float() for t in by_hand(x.half(), W_query.half(), W_key.half(), W_value.half()))


def by_hand_integer_weights(x, W_query, W_key, W_value):
    context, weights = by_hand(x, W_query, W_key, W_value)
    return context, (weights * 1000).long()


@pytest.mark.parametrize(
    "answer, text",
    [
        (by_hand_sdpa, "you called torch.nn.functional.scaled_dot_product_attention"),
        (by_hand_package, "you called attn_course.scaled_dot_product_attention"),
        (by_hand_in_place, "changed its input `x` in place"),
        (by_hand_exp_without_shift, "overflows float32"),
        (by_hand_weights_on_meta, "your result is on meta"),
        (by_hand_half, "values differ"),
        (by_hand_integer_weights, "floating-point"),
        # Works only at the exercise's own d_k = 16: the width is a fixed number.
        (lambda x, q, k, v: by_hand(x, q, k, v, scale=1 / 4), "the exercise's d_k"),
        # Divided by the number of tokens, and the scale applied to the weights after the softmax.
        (lambda x, q, k, v: by_hand(x, q, k, v, scale=1 / math.sqrt(x.size(0))), "number of keys"),
        (lambda x, q, k, v: (lambda w: (w @ (x @ v), w))(torch.softmax((x @ q) @ (x @ k).T, -1) / math.sqrt(k.size(1))),
         "after the softmax"),
        (lambda x, q, k, v: by_hand(x, q, k, v)[1].numpy(), "as a tuple"),
    ],
)
def test_self_attention_by_hand_mechanism_classes(answer, text):
    feedback = check_self_attention_by_hand(answer)
    assert feedback.status == "incorrect", str(feedback)
    assert text in feedback.message, feedback.message


def test_self_attention_by_hand_written_differently_passes():
    for answer in (
        lambda x, q, k, v: list(by_hand(x, q, k, v)),                                     # a list, not a tuple
        lambda x, q, k, v: by_hand(x.double(), q.double(), k.double(), v.double()),       # float64
        lambda x, q, k, v: by_hand(x, q, k, v, scale=k.shape[1] ** -0.5),                 # the width from .shape
    ):
        assert check_self_attention_by_hand(answer).status == "correct"


@pytest.mark.parametrize(
    "answer, text",
    [
        (lambda p: torch.eye(len(p), dtype=p.dtype) - p[None, :], "log-softmax"),
        (lambda p: torch.autograd.functional.jacobian(lambda s: torch.softmax(s, 0), p), "derive the Jacobian by hand"),
        (lambda p: torch.diag(p) - torch.outer(p, p.mul_(1.0001)), "changed its input `p` in place"),
        # the fifth review: values kept, version changed (exercises 1 and 3 reject this too)
        (lambda p: torch.diag(p.mul_(1.0)) - torch.outer(p, p), "changed its input `p` in place"),
        (lambda p: (lambda q: torch.diag(q) - torch.outer(q, q))(p.clamp_(0.0, 1.0)), "changed its input `p` in place"),
        (lambda p: (torch.diag(p) - torch.outer(p, p)).half(), "float16 but the inputs were"),
        (lambda p: torch.diag(p) - torch.outer(p, p) if len(p) == 5 else torch.zeros(len(p), len(p)), "values differ"),
    ],
)
def test_softmax_jacobian_mechanism_classes(answer, text):
    feedback = check_softmax_jacobian(answer)
    assert feedback.status == "incorrect" and text in feedback.message, str(feedback)


def test_softmax_jacobian_written_differently_passes():
    for answer in (
        lambda p: (torch.diag(p) - torch.outer(p, p)).cpu().numpy(),                      # a numpy array
        lambda p: torch.eye(len(p), dtype=p.dtype, device=p.device) * p - torch.outer(p, p),  # eye on p's device
        lambda p: p.diag() - p[:, None] * p[None, :],                                     # broadcasting
        lambda p: torch.diag(p) - torch.outer(p, p).T,                                    # symmetric anyway
    ):
        assert check_softmax_jacobian(answer).status == "correct"


class ModuleWith(Module):
    """A module whose forward is written one of the ways students write it."""

    mode = None

    def forward(self, x):
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
        if self.mode == "keys.T":
            scores = q @ k.T
        elif self.mode == "permute":
            scores = q @ k.permute(0, 2, 1)
        else:
            scores = q @ k.transpose(-2, -1)
        width = {"fixed": 8, "tokens": x.size(-2)}.get(self.mode, k.size(-1))
        if self.mode == "in place":
            x.mul_(1.0001)
        w = torch.softmax(scores / math.sqrt(width), dim=-1)
        if self.mode == "squeeze":
            return (w @ v).squeeze(0), w.squeeze(0)
        return w @ v, w


def _module_with(mode):
    return type(f"Module_{mode}", (ModuleWith,), {"mode": mode})


@pytest.mark.parametrize(
    "mode, status, text",
    [
        ("fixed", "incorrect", "the exercise's d_k"),          # d_k = 8 written in: wrong at other widths
        ("tokens", "incorrect", "number of keys"),
        ("in place", "incorrect", "in place"),
        ("squeeze", "incorrect", "expected shape (1, 3, 3)"),   # a batch of one loses its batch axis
        ("keys.T", "error", "last two"),                        # keys.T reverses all three axes of a batch
    ],
)
def test_self_attention_module_mechanism_classes(mode, status, text):
    feedback = check_self_attention_module(_module_with(mode))
    assert feedback.status == status and text in str(feedback), str(feedback)


def test_self_attention_module_written_differently_passes():
    assert check_self_attention_module(_module_with("permute")).status == "correct"


# --- the answers the second review found accepted (reviews/chapter-03.md), and their classes -------

def _hand_softmax(s):
    e = (s - s.max()).exp()
    return e / e.sum()


def _jacobian_by_backward(p):  # autograd row by row, through a hand-written softmax
    rows = []
    for i in range(len(p)):
        s = p.log().clone().requires_grad_()
        _hand_softmax(s)[i].backward()
        rows.append(s.grad)
    return torch.stack(rows)


def _jacobian_by_forward_mode(p):  # one column per tangent, through a hand-written softmax
    columns = []
    with torch.autograd.forward_ad.dual_level():
        for j in range(len(p)):
            dual = torch.autograd.forward_ad.make_dual(p.log(), torch.eye(len(p), dtype=p.dtype)[j])
            columns.append(torch.autograd.forward_ad.unpack_dual(_hand_softmax(dual)).tangent)
    return torch.stack(columns, dim=1)


def _jacobian_by_forward_mode_from_p(p):  # forward mode without any log or exp: the tangent of p itself
    columns = []
    with torch.autograd.forward_ad.dual_level():
        for j in range(len(p)):
            dual = torch.autograd.forward_ad.make_dual(p.clone(), torch.eye(len(p), dtype=p.dtype)[j])
            columns.append(torch.autograd.forward_ad.unpack_dual(dual * 1).tangent * p[j])
    return torch.stack(columns, dim=1) - torch.outer(p, p)


def _jacobian_by_linearize(p):
    _, tangent = torch.func.linearize(lambda s: s.exp() / s.exp().sum(), p.log())
    return torch.stack([tangent(e) for e in torch.eye(len(p), dtype=p.dtype)], dim=1)


def _jacobian_by_finite_differences(p, h=1e-6):  # central differences in float64, through a hand-written softmax
    s = p.double().log()
    columns = [(_hand_softmax(s + h * e) - _hand_softmax(s - h * e)) / (2 * h) for e in torch.eye(len(p), dtype=torch.float64)]
    return torch.stack(columns, dim=1).to(p.dtype)


def _jacobian_by_finite_differences_in_base_2(p, h=1e-6):  # exp2 and log2 instead of exp and log
    s = p.double().log2()

    def softmax(z):
        e = torch.exp2(z - z.max())
        return e / e.sum()

    columns = [(softmax(s + h * e) - softmax(s - h * e)) / (2 * h * math.log(2)) for e in torch.eye(len(p), dtype=torch.float64)]
    return torch.stack(columns, dim=1).to(p.dtype)


def _jacobian_by_finite_differences_in_math(p, h=1e-6):  # the same with the math module, on Python floats
    s = [math.log(x) for x in p.tolist()]

    def softmax(z):
        e = [math.exp(x - max(z)) for x in z]
        return [x / sum(e) for x in e]

    columns = []
    for j in range(len(s)):
        up, down = list(s), list(s)
        up[j] += h
        down[j] -= h
        columns.append([(a - b) / (2 * h) for a, b in zip(softmax(up), softmax(down))])
    return torch.tensor(columns, dtype=p.dtype).T


@pytest.mark.parametrize(
    "answer, text",
    [
        # Autograd instead of the derivation, by every route (the review: accepted, and blessed by the tests).
        (lambda p: torch.autograd.functional.jacobian(lambda s: torch.softmax(s, dim=0), p.log()), "derive the Jacobian by hand"),
        (lambda p: torch.func.jacrev(lambda s: torch.softmax(s, 0))(p.log()), "derive the Jacobian by hand"),
        (lambda p: torch.autograd.functional.jacobian(_hand_softmax, p.log()), "derive the Jacobian by hand"),
        (lambda p: torch.func.jacfwd(_hand_softmax)(p.log()), "derive the Jacobian by hand"),
        (_jacobian_by_backward, "derive the Jacobian by hand"),
        # The review's other wrong Jacobians.
        (lambda p: torch.diag(p * (1 - p)) - torch.outer(p, p), "counts the product p_i p_i twice"),
        (lambda p: torch.eye(len(p), dtype=p.dtype) - torch.outer(p, p), "starts from 1"),
        (lambda p: torch.diag(p) + torch.outer(p, p), "values differ"),
        (lambda p: (lambda q: torch.diag(q) - torch.outer(q, q))(p.clamp(min=1e-3)), "values differ"),
        (lambda p: torch.diag(p) - torch.outer(p, p) / p.sum() * (1 + 1e-4), "close to the Jacobian"),
        # The second review: autograd's forward mode, torch.func.linearize and finite differences (accepted), and a
        # Jacobian built on the CPU whatever p's device (accepted: no case ran elsewhere).
        (_jacobian_by_forward_mode, "derive the Jacobian by hand"),
        (_jacobian_by_forward_mode_from_p, "derive the Jacobian by hand"),
        (_jacobian_by_linearize, "derive the Jacobian by hand"),
        (lambda p: torch.autograd.functional.jvp(_hand_softmax, p.log(), p)[1], "derive the Jacobian by hand"),
        (_jacobian_by_finite_differences, "is not a derivation"),
        (_jacobian_by_finite_differences_in_math, "is not a derivation"),
        (_jacobian_by_finite_differences_in_base_2, "is not a derivation"),
        (lambda p: torch.eye(len(p)) * p - torch.outer(p, p), "works only with CPU tensors"),
        (lambda p: torch.eye(len(p), dtype=p.dtype) * p - torch.outer(p, p), "works only with CPU tensors"),
        (lambda p: torch.from_numpy(torch.diag(p).numpy() - torch.outer(p, p).numpy()), "numpy holds only CPU data"),
    ],
)
def test_softmax_jacobian_review_wrong_answers(answer, text):
    feedback = check_softmax_jacobian(answer)
    assert feedback.status == "incorrect" and text in feedback.message, str(feedback)


# --- the third review: finite differences through numpy's exp, math.e ** h and sigmoid (accepted: the guards do
# not see them, and their values agree to 1e-10), and an in-place no-op on x in exercise 3 (a raw autograd error) --

def _jacobian_by_finite_differences_in_numpy(p, h=1e-6):
    import numpy as np
    s = np.log(p.detach().cpu().numpy())

    def softmax(z):
        e = np.exp(z - z.max())
        return e / e.sum()

    columns = [(softmax(s + h * e) - softmax(s - h * e)) / (2 * h) for e in np.eye(len(s))]
    return torch.from_numpy(np.stack(columns, axis=1)).to(p.dtype)


def _jacobian_by_finite_differences_without_exp(p, h=1e-5, e_to=lambda x: math.e ** x):
    # softmax(ω ± h e_j) written in p: multiply p_j by e^(±h) and renormalise; no exp or log of a tensor
    columns = []
    for j in range(len(p)):
        moved = []
        for sign in (1, -1):
            f = p.detach().double().clone()
            f[j] = f[j] * e_to(sign * h)
            moved.append(f / f.sum())
        columns.append((moved[0] - moved[1]) / (2 * h))
    return torch.stack(columns, dim=1).to(p.dtype)


def _e_by_sigmoid(x):
    s = torch.sigmoid(torch.tensor(x, dtype=torch.float64))
    return float(s / (1 - s))


@pytest.mark.parametrize(
    "answer",
    [
        _jacobian_by_finite_differences_in_numpy,
        _jacobian_by_finite_differences_without_exp,
        lambda p: _jacobian_by_finite_differences_without_exp(p, h=1e-6, e_to=_e_by_sigmoid),
        lambda p: _jacobian_by_finite_differences_in_numpy(p, h=1e-4),
    ],
)
def test_softmax_jacobian_finite_differences_by_any_route_are_rejected(answer):
    feedback = check_softmax_jacobian(answer)
    assert feedback.status == "incorrect" and "lost to rounding" in feedback.message, str(feedback)


class InPlaceNoOp(Module):
    """x.div_(1.0) (or clamp_, nan_to_num_): values unchanged, but x's version moves and backward failed."""

    def __init__(self, d_in, d_k, d_v, op=lambda x: x.div_(1.0)):
        super().__init__(d_in, d_k, d_v)
        self.op = op

    def forward(self, x):
        self.op(x)
        return super().forward(x)


@pytest.mark.parametrize("op", [lambda x: x.div_(1.0), lambda x: x.clamp_(-1e9, 1e9), lambda x: x.nan_to_num_()])
def test_self_attention_module_in_place_no_op_is_named(op):
    feedback = check_self_attention_module(lambda d_in, d_k, d_v: InPlaceNoOp(d_in, d_k, d_v, op))
    assert feedback.status == "incorrect" and ("changed x in place" in feedback.message or "changed its input `x` in place" in feedback.message), str(feedback)


def test_softmax_jacobian_hint_and_messages_do_not_give_the_formula_away():
    hint = check_softmax_jacobian(lambda p: torch.diag(p)).hint
    assert "outer product" not in hint and "diagonal matrix of p" not in hint and "p_i p_j" not in hint
    for answer in (lambda p: torch.diag(p), lambda p: -torch.outer(p, p)):
        message = check_softmax_jacobian(answer).message
        assert "p pᵀ" not in message and "diag(p)" not in message, message


def test_softmax_jacobian_tiny_entries_are_shown_with_significant_digits():
    # The nearly one-hot case: entries of 1e-5; a fixed four decimals showed "expected 0.0000, got 0.0000".
    def off_where_tiny(p):
        jacobian = torch.diag(p) - torch.outer(p, p)
        if len(p) == 4:
            jacobian[1, 1] += 2e-6
        return jacobian

    feedback = check_softmax_jacobian(off_where_tiny)
    assert feedback.status == "incorrect" and "0.0000" not in feedback.message, str(feedback)
    assert "e-0" in feedback.message, feedback.message


def test_softmax_jacobian_review_right_answers_pass():
    import numpy as np
    for answer in (
        lambda p: np.diag(p.cpu().numpy()) - np.outer(p.cpu().numpy(), p.cpu().numpy()),
        lambda p: (torch.diag(p) - torch.outer(p, p)).tolist(),
        lambda p: [[float(p[i]) * ((i == j) - float(p[j])) for j in range(len(p))] for i in range(len(p))],
        lambda p: torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2),
        lambda p: p[:, None] * (torch.eye(len(p), dtype=p.dtype, device=p.device) - p[None, :]),
        lambda p: torch.diag(p) - torch.outer(p, p) / p.sum(),
    ):
        feedback = check_softmax_jacobian(answer)
        assert feedback.status == "correct", str(feedback)


class SharedQueryKey(Module):
    """W_query and W_key one layer under two names: symmetric scores (the review: accepted)."""

    def __init__(self, d_in, d_k, d_v):
        super().__init__(d_in, d_k, d_v)
        self.W_query = self.W_key = nn.Linear(d_in, d_k, bias=False)


class SharedWeight(Module):
    """Two layers, one weight tensor."""

    def __init__(self, d_in, d_k, d_v):
        super().__init__(d_in, d_k, d_v)
        self.W_key.weight = self.W_query.weight


class LayersInForward(nn.Module):
    """New, untrained layers at every call (the review: accepted)."""

    def __init__(self, d_in, d_k, d_v):
        super().__init__()
        self.sizes = (d_in, d_k, d_v)
        self.W_query = nn.Linear(d_in, d_k, bias=False)
        self.W_key = nn.Linear(d_in, d_k, bias=False)
        self.W_value = nn.Linear(d_in, d_v, bias=False)

    def forward(self, x):
        d_in, d_k, d_v = self.sizes
        self.W_query, self.W_key, self.W_value = (nn.Linear(d_in, d, bias=False) for d in (d_k, d_k, d_v))
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_k), dim=-1)
        return w @ v, w


class FreshWeightsInForward(Module):
    """The same layers, but their weights drawn anew at every call."""

    def forward(self, x):
        with torch.no_grad():
            for layer in (self.W_query, self.W_key, self.W_value):
                layer.weight.normal_()
        return super().forward(x.clone())


class ExpWithoutShift(Module):
    """A softmax written out without its maximum shift: NaN on large scores (the review: accepted)."""

    def forward(self, x):
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
        e = torch.exp(q @ k.transpose(-2, -1) / math.sqrt(k.size(-1)))
        w = e / e.sum(-1, keepdim=True)
        return w @ v, w


class HalfOutputs(Module):
    """Float16 results of float32 inputs (the review: accepted, and the tolerance loosened)."""

    def forward(self, x):
        return tuple(t.half() for t in super().forward(x))


@pytest.mark.parametrize(
    "answer, text",
    [
        (SharedQueryKey, "W_query and W_key are one layer"),
        (SharedWeight, "W_query and W_key are one layer"),
        (LayersInForward, "replaced W_query, W_key, W_value with a new layer"),
        (ExpWithoutShift, "overflows float32"),
        (HalfOutputs, "float16 but the inputs were torch.float32"),
    ],
)
def test_self_attention_module_review_wrong_answers(answer, text):
    feedback = check_self_attention_module(answer)
    assert feedback.status == "incorrect" and text in feedback.message, str(feedback)


def test_self_attention_module_fresh_weights_are_caught():
    # Weights drawn anew in forward: caught, whichever of the comparisons sees it first.
    feedback = check_self_attention_module(FreshWeightsInForward)
    assert feedback.status == "incorrect", str(feedback)


class ZeroQueries(Module):
    """W_query set to zeros (the second review: blamed on .detach()): constant scores, no gradient for W_key."""

    def __init__(self, d_in, d_k, d_v):
        super().__init__(d_in, d_k, d_v)
        nn.init.zeros_(self.W_query.weight)


def test_self_attention_module_zero_queries_are_named():
    feedback = check_self_attention_module(ZeroQueries)
    assert feedback.status == "incorrect" and "W_query.weight is all zeros" in feedback.message, str(feedback)
    assert "detach" not in feedback.message


def test_self_attention_by_hand_half_results_are_named():
    half = lambda x, q, k, v: tuple(t.half() for t in by_hand(x, q, k, v))
    feedback = check_self_attention_by_hand(half)
    assert feedback.status == "incorrect" and "float16 but the inputs were" in feedback.message, str(feedback)


# --- exercise 4, the size of the scores at initialisation -------------------------------------------

def score_std(d_model, d_k, std_query, std_key):
    return math.sqrt(d_k) * d_model * std_query * std_key


def test_score_std_right_answers_pass():
    import numpy as np
    for answer in (
        score_std,
        lambda d_model, d_k, sq, sk: (d_k * (d_model * sq ** 2) * (d_model * sk ** 2)) ** 0.5,   # variance, then root
        lambda d_model, d_k, sq, sk: torch.tensor(float(d_k)).sqrt() * d_model * sq * sk,       # a 0-d tensor
        lambda d_model, d_k, sq, sk: np.sqrt(np.int64(d_k)) * np.float32(d_model) * sq * sk,   # numpy numbers
    ):
        feedback = check_score_std(answer)
        assert feedback.status == "correct", str(feedback)


@pytest.mark.parametrize(
    "answer, text",
    [
        (lambda m, d, q, k: d * m ** 2 * q ** 2 * k ** 2, "that is the variance"),
        (lambda m, d, q, k: math.sqrt(d) * q * k, "sums d_model products"),
        (lambda m, d, q, k: math.sqrt(d * m) * q * k, "a factor d_model, not √d_model"),
        (lambda m, d, q, k: d * m * q * k, "√d_k in the standard deviation"),
        (lambda m, d, q, k: math.sqrt(d) * m * q ** 2 * k ** 2, "to the first power"),
        (lambda m, d, q, k: math.sqrt(m) * d * q * k, "swapped d_model and d_k"),
        (lambda m, d, q, k: m * q * k, "after the division by √d_k"),
        # The second review: σ_Q = σ_K assumed was named "after the division by √d_k" (the two agree at one case).
        (lambda m, d, q, k: math.sqrt(d) * m * q ** 2, "as if σ_K = σ_Q"),
        (lambda m, d, q, k: math.sqrt(d) * m * k ** 2, "as if σ_Q = σ_K"),
        (lambda m, d, q, k: math.sqrt(d) * m * math.sqrt(q ** 2 + k ** 2), "do not add"),
        (lambda m, d, q, k: math.sqrt(d) * m * (q + k), "do not add"),
        (lambda m, d, q, k: score_std(m, d, q, k) * 1.03, "within 10% of the exact value"),
        (lambda m, d, q, k: score_std(512, 64, q, k), "not the standard deviation"),        # the notebook's sizes only
        (lambda m, d, q, k: 1.0, "not the standard deviation"),
        (lambda m, d, q, k: "8/3", "return a number"),
        (lambda m, d, q, k: [score_std(m, d, q, k)], "return a number"),
    ],
)
def test_score_std_wrong_answers(answer, text):
    feedback = check_score_std(answer)
    assert feedback.status == "incorrect" and text in feedback.message, str(feedback)
    assert "Hint:" in str(feedback)


def test_score_std_measured_answer_is_not_enough():
    def measured(d_model, d_k, std_query, std_key):
        g = torch.Generator().manual_seed(0)
        q = torch.randn(4000, d_model, generator=g) @ (torch.randn(d_model, d_k, generator=g) * std_query)
        k = torch.randn(4000, d_model, generator=g) @ (torch.randn(d_model, d_k, generator=g) * std_key)
        return float((q * k).sum(-1).std())
    feedback = check_score_std(measured)
    assert feedback.status == "incorrect", str(feedback)


def test_score_std_crash_and_scaffold():
    assert check_score_std(_scaffold).status == "not attempted"
    feedback = check_score_std(lambda m, d, q, k: 1 / 0)
    assert feedback.status == "error" and "Traceback" not in str(feedback)


def test_keys_projected_with_the_query_matrix_are_named():
    typo = lambda x, q, k, v: by_hand(x, q, q, v)
    feedback = check_self_attention_by_hand(typo)
    assert feedback.status == "incorrect" and "project the keys with W_query" in feedback.message, str(feedback)

    class Typo(Module):
        def forward(self, x):
            q, v = self.W_query(x), self.W_value(x)
            w = torch.softmax(q @ q.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
            return w @ v, w

    feedback = check_self_attention_module(Typo)
    assert feedback.status == "incorrect" and "project the keys with W_query" in feedback.message, str(feedback)


def test_softmax_jacobian_diag_embed_passes_in_a_fresh_process():
    # The third revision: torch.diag_embed's first torch._check imports sympy, whose mpmath calls math.log at
    # import: a right answer was blamed for a logarithm when it was the first thing the kernel ran.
    import subprocess
    import sys
    code = ("import torch\nfrom attn_course.exercises.ch03 import check_softmax_jacobian\n"
            "print(check_softmax_jacobian(lambda p: torch.diag_embed(p) - p[:, None] * p[None, :]).status)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().endswith("correct") and "incorrect" not in out.stdout, out.stdout + out.stderr


# --- the fourth review: a scale made on the CPU (exercise 1) or kept as a plain tensor attribute of the module
# (exercise 3) was accepted, since no case ran on another device; an in-place no-op on x in exercise 1 too -------

def _by_hand_scale_on_cpu(x, W_query, W_key, W_value):  # a 1-element CPU tensor: fails next to GPU tensors
    q, k, v = x @ W_query, x @ W_key, x @ W_value
    w = torch.softmax(q @ k.T / torch.sqrt(torch.tensor([float(k.shape[-1])])), -1)
    return w @ v, w


def _by_hand_zeros_on_cpu(x, W_query, W_key, W_value):
    context, weights = by_hand(x, W_query, W_key, W_value)
    return context, weights + torch.zeros(1)


def _by_hand_in_place(name):
    def answer(x, W_query, W_key, W_value):
        {"x": x, "W_query": W_query, "W_key": W_key, "W_value": W_value}[name].mul_(1.0)  # values as they were
        return by_hand(x, W_query, W_key, W_value)
    return answer


@pytest.mark.parametrize(
    "answer, text",
    [
        (_by_hand_scale_on_cpu, "works only with CPU tensors"),
        (_by_hand_zeros_on_cpu, "works only with CPU tensors"),
        (_by_hand_in_place("x"), "changed its input `x` in place"),
        (_by_hand_in_place("W_key"), "changed its input `W_key` in place"),
    ],
)
def test_self_attention_by_hand_fourth_review_wrong_answers(answer, text):
    feedback = check_self_attention_by_hand(answer)
    assert feedback.status == "incorrect" and text in feedback.message, str(feedback)


def test_self_attention_by_hand_0_dim_scale_passes():
    # A 0-dimensional CPU tensor is a scalar to PyTorch: CUDA (and meta) accept it next to their tensors.
    def answer(x, W_query, W_key, W_value):
        q, k, v = x @ W_query, x @ W_key, x @ W_value
        w = torch.softmax(q @ k.T / torch.tensor(float(k.shape[-1])).sqrt(), -1)
        return w @ v, w
    assert check_self_attention_by_hand(answer).status == "correct"


class _ScaleAttribute(Module):
    """The scale stored on the module, as a plain tensor, a buffer, a 0-dim tensor or a float."""

    kind = "plain"

    def __init__(self, d_in, d_k, d_v):
        super().__init__(d_in, d_k, d_v)
        if self.kind == "plain":
            self.scale = torch.tensor([d_k ** -0.5])  # not a buffer: .to(device) leaves it on the CPU
        elif self.kind == "buffer":
            self.register_buffer("scale", torch.tensor([d_k ** -0.5]))
        elif self.kind == "0-dim":
            self.scale = torch.tensor(d_k ** -0.5)
        else:
            self.scale = d_k ** -0.5

    def forward(self, x):
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
        w = torch.softmax(q @ k.mT * self.scale, dim=-1)
        return w @ v, w


def _scale_attribute(kind):
    return type(f"Scale_{kind}", (_ScaleAttribute,), {"kind": kind})


class ScaleMadeOnCpu(Module):
    def forward(self, x):
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
        w = torch.softmax(q @ k.transpose(-2, -1) / torch.tensor([k.size(-1)]).sqrt(), dim=-1)
        return w @ v, w


def test_self_attention_module_plain_tensor_scale_is_named():
    feedback = check_self_attention_module(_scale_attribute("plain"))
    assert feedback.status == "incorrect", str(feedback)
    assert "keeps `scale` as a plain tensor attribute" in feedback.message and "register_buffer" in feedback.message


def test_self_attention_module_scale_made_on_cpu_is_named():
    feedback = check_self_attention_module(ScaleMadeOnCpu)
    assert feedback.status == "incorrect" and "works only with CPU tensors" in feedback.message, str(feedback)


@pytest.mark.parametrize("kind", ["buffer", "0-dim", "float"])
def test_self_attention_module_scale_that_follows_passes(kind):
    assert check_self_attention_module(_scale_attribute(kind)).status == "correct"


def test_self_attention_module_in_place_mul_is_named():
    feedback = check_self_attention_module(lambda d_in, d_k, d_v: InPlaceNoOp(d_in, d_k, d_v, lambda x: x.mul_(1.0)))
    assert feedback.status == "incorrect" and ("changed x in place" in feedback.message or "changed its input `x` in place" in feedback.message), str(feedback)


def _jacobian_by_complex_step(p):  # numerical, but exact to rounding: no case can tell it from the formula by value
    import numpy as np
    s = np.log(p.detach().cpu().numpy()).astype(complex)
    n, h = len(s), 1e-30
    J = np.zeros((n, n))

    def softmax(z):
        e = np.exp(z - z.real.max())
        return e / e.sum()

    for j in range(n):
        d = np.zeros(n, complex)
        d[j] = 1j * h
        J[:, j] = softmax(s + d).imag / h
    return torch.tensor(J, dtype=p.dtype, device=p.device)


def test_softmax_jacobian_complex_step_is_accepted_and_the_statement_says_so():
    # The fourth review: the statement promised that finite differences fail "by any route"; a complex-step
    # derivative in numpy passes (the guards do not see numpy, and its values are exact). The statement now says so.
    assert check_softmax_jacobian(_jacobian_by_complex_step).status == "correct"
    import json
    from pathlib import Path
    notebook = json.loads((Path(__file__).parents[1] / "chapters" / "03_scaled_dot_product_attention.ipynb").read_text())
    statement = next("".join(c["source"]) for c in notebook["cells"] if "### Exercise 2" in "".join(c["source"]))
    assert "complex-step" in statement
