"""The exercise checks of chapter 03: right, wrong, crashing and untouched answers."""

import math

import pytest
import torch
from torch import nn

from attn_course.exercises.ch03 import (
    check_cross_attention,
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
    # The Jacobian by autograd, entry by entry from the formula, and a module that calls the package.
    autograd_jacobian = lambda p: torch.autograd.functional.jacobian(lambda s: torch.softmax(s, dim=0), p.log())
    loops = lambda p: torch.stack([torch.stack([p[i] * (float(i == j) - p[j]) for j in range(len(p))]) for i in range(len(p))])
    assert check_softmax_jacobian(autograd_jacobian) and check_softmax_jacobian(loops)

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
        (lambda p: torch.diag(p), "diag(p); the term - p pᵀ is missing"),
        (lambda p: -torch.outer(p, p), "diagonal term diag(p) is missing"),
        (lambda p: torch.outer(p, p) - torch.diag(p), "signs are flipped"),
        (lambda p: torch.diag(p) - 0.5 * torch.outer(p, p), "values differ"),
        (lambda p: p, "expected shape"),
        (lambda p: torch.diag(p * (1 - p)), "off-diagonal entries"),
        (lambda p: torch.diag(p) - p @ p, "outer product"),
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


# --- exercise 4, cross-attention on a batch: right answers, and a table of wrong ones -------------

def cross(x_query, x_context, W_query, W_key, W_value, *, scale_width=None, dim=-1, swap=False, transpose_weights=False):
    queries = x_query @ W_query                                       # (B, L, d_k)
    keys, values = x_context @ W_key, x_context @ W_value             # (B, S, d_k), (B, S, d_v)
    if swap:                                                          # K Qᵀ instead of Q Kᵀ
        scores = keys @ queries.transpose(-2, -1)
    else:
        scores = queries @ keys.transpose(-2, -1)
    divisor = {None: math.sqrt(keys.size(-1)), "d_k": keys.size(-1), "values": math.sqrt(values.size(-1)),
               "query tokens": math.sqrt(x_query.size(-1)), "one": 1.0}[scale_width]
    weights = torch.softmax(scores / divisor, dim=dim)
    if transpose_weights:
        weights = weights.transpose(-2, -1)
    return weights @ values if not (swap or transpose_weights) else None, weights


def cross_right(xq, xc, Wq, Wk, Wv):
    return cross(xq, xc, Wq, Wk, Wv)


def cross_einsum(xq, xc, Wq, Wk, Wv):
    # Another way to write it: einsum, the batch-matrix transpose .mT and torch's own attention.
    q, k, v = xq @ Wq, xc @ Wk, xc @ Wv
    weights = torch.einsum("bld,bsd->bls", q, k).div(k.size(-1) ** 0.5).softmax(dim=-1)
    torch.testing.assert_close(weights, torch.softmax(q @ k.mT / k.size(-1) ** 0.5, dim=-1))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v), weights


def test_cross_attention_right_answers_pass():
    for answer in (cross_right, cross_einsum):
        feedback = check_cross_attention(answer)
        assert feedback.status == "correct", str(feedback)


def _cross_wrong(**kwargs):
    def answer(xq, xc, Wq, Wk, Wv):
        weights = cross(xq, xc, Wq, Wk, Wv, **kwargs)[1]
        return weights @ (xc @ Wv) if weights.shape[-1] == xc.size(1) else torch.zeros(xq.size(0), xq.size(1), Wv.size(1)), weights
    return answer


@pytest.mark.parametrize(
    "answer, text",
    [
        (_cross_wrong(scale_width="one"), "forgot to divide"),
        (_cross_wrong(scale_width="d_k"), "divide by its square root"),
        (_cross_wrong(scale_width="values"), "width of the values"),
        (_cross_wrong(scale_width="query tokens"), "width of the query tokens"),
        (_cross_wrong(dim=-2), "columns sum to one"),
        (_cross_wrong(dim=1), "columns sum to one"),
        (_cross_wrong(dim=0), "over the batch"),
        (_cross_wrong(swap=True), "not K Qᵀ"),
        (_cross_wrong(transpose_weights=True), "one row per key"),
        (lambda xq, xc, Wq, Wk, Wv: cross_right(xq, xc, Wq, Wk, Wv)[1], "return (context, weights)"),
        (lambda xq, xc, Wq, Wk, Wv: (cross_right(xq, xc, Wq, Wk, Wv)[1] @ (xc @ Wv) * 2, cross_right(xq, xc, Wq, Wk, Wv)[1]), "values differ"),
        (lambda xq, xc, Wq, Wk, Wv: (cross_right(xq, xc, Wq, Wk, Wv)[0][:, :, :1], cross_right(xq, xc, Wq, Wk, Wv)[1]), "expected shape (3, 4, 2)"),
    ],
)
def test_cross_attention_wrong_answers(answer, text):
    feedback = check_cross_attention(answer)
    assert feedback.status == "incorrect", str(feedback)
    assert text in feedback.message, feedback.message


@pytest.mark.parametrize(
    "answer",
    [
        # keys.T on a batch reverses all three axes: the matmul fails.
        lambda xq, xc, Wq, Wk, Wv: (None, torch.softmax((xq @ Wq) @ (xc @ Wk).T, dim=-1)),
        # queries taken from the context sequence: the widths do not fit.
        lambda xq, xc, Wq, Wk, Wv: cross_right(xc, xq, Wq, Wk, Wv),
    ],
)
def test_cross_attention_crashing_answers_give_an_error_feedback(answer):
    feedback = check_cross_attention(answer)
    assert feedback.status == "error", str(feedback)
    assert "last two" in str(feedback) and "Traceback" not in str(feedback)


def test_cross_attention_scaffold_is_not_attempted():
    assert check_cross_attention(_scaffold).status == "not attempted"


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
        (lambda p: torch.autograd.functional.jacobian(lambda s: torch.softmax(s, 0), p), "taken at the scores s = p"),
        (lambda p: torch.diag(p) - torch.outer(p, p.mul_(1.0001)), "changed its input `p` in place"),
        (lambda p: (torch.diag(p) - torch.outer(p, p)).half(), "float16 but the inputs were"),
        (lambda p: torch.diag(p) - torch.outer(p, p) if len(p) == 5 else torch.zeros(len(p), len(p)), "values differ"),
    ],
)
def test_softmax_jacobian_mechanism_classes(answer, text):
    feedback = check_softmax_jacobian(answer)
    assert feedback.status == "incorrect" and text in feedback.message, str(feedback)


def test_softmax_jacobian_written_differently_passes():
    for answer in (
        lambda p: (torch.diag(p) - torch.outer(p, p)).numpy(),                            # a numpy array
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


def _cross_with(mode):
    def answer(x_query, x_context, W_query, W_key, W_value):
        q, k, v = x_query @ W_query, x_context @ W_key, x_context @ W_value
        width = {"queries": x_query.size(1), "keys": x_context.size(1), "fixed": 8}.get(mode, k.size(-1))
        if mode == "in place":
            x_query += 0.1
        if mode == "batch of 3":
            q = q.reshape(3, -1, q.size(-1))
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(width), dim=-1)
        return w @ v, w
    return answer


@pytest.mark.parametrize(
    "mode, status, text",
    [
        ("queries", "incorrect", "number of queries"),
        ("keys", "incorrect", "number of keys"),
        ("fixed", "incorrect", "the exercise's d_k"),
        ("in place", "incorrect", "changed its input `x_query` in place"),
        ("batch of 3", "incorrect", "expected shape (1, 3, 5)"),   # code that assumes B = 3
    ],
)
def test_cross_attention_mechanism_classes(mode, status, text):
    feedback = check_cross_attention(_cross_with(mode))
    assert feedback.status == status and text in str(feedback), str(feedback)


def test_cross_attention_success_message_does_not_give_the_shapes_away():
    # Exercise 4 asks the reader to predict the shapes: the verdict of the solution must not print them.
    message = check_cross_attention(cross_right).message
    assert "(3, 4, 6)" not in message and "(3, 4, 2)" not in message
