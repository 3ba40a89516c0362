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
        (lambda x, q, k, v: by_hand(x, q, k, v)[1], "pair"),
        (lambda x, q, k, v: (x @ v, by_hand(x, q, k, v)[1]), "equals the values"),
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
        (_cross_wrong(swap=True), "(B, S, L)"),
        (_cross_wrong(transpose_weights=True), "(B, S, L)"),
        (lambda xq, xc, Wq, Wk, Wv: cross_right(xq, xc, Wq, Wk, Wv)[1], "pair"),
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
    assert "transpose(-2, -1)" in str(feedback)


def test_cross_attention_scaffold_is_not_attempted():
    assert check_cross_attention(_scaffold).status == "not attempted"
