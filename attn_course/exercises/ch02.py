"""Checks for the exercises of chapter 02, simple self-attention.

Each check tries the answer on cases chosen so that the usual mistakes give a wrong result, and
names the mistake when it recognises one; the table of those mistakes is in
tests/test_exercises_ch02.py. They use the shared mechanism of ``attn_course.exercises``: library
softmaxes forbidden by every route in exercise 1 (``forbid=("softmax",)``, the routes that hide a
softmax inside: torch's attention, ``cross_entropy``, and ``logsumexp``, which subtracts the maximum
for the student, also reached through ``logcumsumexp`` or ``logaddexp``), the package's and torch's
attention in exercise 2, a softmax, an exponential (``exp``, ``exp2``, ``expm1``, a power, or by another
name: ``sigmoid``, ``softplus``, ``tanh`` ...) or a linear solve that recovers x (``linalg.solve``, ``inv``,
``pinv``, ``lstsq`` ...) in exercise 5, which moves numbers instead of computing them again; inputs watched for changes in place,
sizes unlike the notebook's (``other_sizes``) and scores near +-100 in float32 (``large_scores``); in
exercise 1, a row whose maximum is neither its first nor its last score and a row that is only very
negative, and a float16 row whose maximum is 20 (a shift applied only above some threshold overflows there); in
exercise 2, a Python loop over the batch (the number of torch calls must not grow with
the batch; numpy and Python lists, where such a loop would not be counted, are refused); in exercise 3,
a diagonal that is exactly 0 also where finite fills lose (scores near -100 and near -1e32, and tiny
scores near 1e-6), three tokens whose own score is far above two different others (renormalising
after the softmax loses their order), scores above 88 (where a softmax without the maximum
overflows), a repeated word, float16 in and float16 out, and one more case on another device
(:func:`attn_course.exercises.other_device`: the GPU, else PyTorch's meta device); in exercise 4, a
temperature of 0.01 (scores up to 100) and a token of length 1e-6 (an eps in the normalisation
would shorten it); in exercise 5, orders given as a tensor, a list or a numpy array of integers.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..simple import simple_self_attention
from . import (Mismatch, call, call_elsewhere, exercise, expect, expect_close, expect_same_device, expect_sequence,
               expect_tensor, forbidden, large_scores, other_device, other_sizes, randn, rng)
from ._core import _StudentCodeFailed

__all__ = [
    "check_stable_softmax",
    "check_batched_self_attention",
    "check_attention_without_self",
    "check_cosine_self_attention",
    "check_shuffled_attention",
]


def _rows_sum_to_one(weights: torch.Tensor) -> bool:
    atol = 2e-3 if weights.dtype in (torch.float16, torch.bfloat16) else 1e-5  # a row of half-precision weights
    w = weights.detach().double()
    return bool(torch.allclose(w.sum(-1), torch.ones_like(w.sum(-1)), atol=atol))


def _columns_sum_to_one(weights: torch.Tensor) -> bool:
    w = weights.detach().double()
    return bool(torch.allclose(w.sum(-2), torch.ones_like(w.sum(-2)), atol=1e-5))


def _pair(result, what: str):
    return expect_sequence(result, what=what, names=("context", "weights"))


_HIDDEN_SOFTMAX = "it computes a softmax inside, and this exercise asks you to write the softmax yourself"
_LOGSUMEXP = ("it subtracts each row's maximum for you: it computes a log-sum-exp (exp(s - logsumexp(s)) is "
              "log_softmax(s).exp() written out, and the last entry of logcumsumexp or a fold of logaddexp is the "
              "same log-sum-exp), and this exercise asks you to write that step yourself: subtract each row's own "
              "maximum")


@exercise(
    "Exercise 1, a softmax that does not overflow",
    hint="subtract each row's own maximum before exponentiating (a maximum over the last axis that keeps "
         "that axis, so that it lines up with its row), then divide by each row's sum, kept the same way",
    forbid=("softmax",),
)
def check_stable_softmax(stable_softmax) -> str:
    def run(scores: torch.Tensor, what: str) -> torch.Tensor:
        with forbidden("sdpa", F.cross_entropy, reason=_HIDDEN_SOFTMAX), \
                forbidden(torch.logsumexp, torch.logcumsumexp, torch.logaddexp, torch.logaddexp2, reason=_LOGSUMEXP):
            got = expect_tensor(call(stable_softmax, scores), what=what, shape=scores.shape, dtype="float")
        want = torch.softmax(scores, dim=-1)
        flat = got.detach().double()
        if bool(torch.isfinite(flat).all()) and bool(torch.allclose(flat, flat[..., :1].expand_as(flat), atol=1e-6)) \
                and not bool(torch.allclose(want, want[..., :1].expand_as(want))):
            raise Mismatch(f"{what}: every weight of a row is the same, which the scores do not call for. "
                           "Did you clamp the scores before torch.exp? Clamping changes their differences, "
                           "and a softmax depends only on those: subtract each row's maximum instead")
        return got

    generator = rng(1)
    # 1. A square matrix: the axis, and keepdim (without it, the row maxima or sums broadcast along the
    #    wrong axis, which only a square matrix lets run).
    square = randn(4, 4, generator=generator, scale=3.0)
    what = "stable_softmax(x) for x of shape (4, 4)"
    got = run(square, what).detach().double()
    if _columns_sum_to_one(got) and not _rows_sum_to_one(got):
        raise Mismatch(f"{what}: your columns sum to one, not your rows: normalise over the last axis, dim=-1")
    row_max = square.max(dim=-1, keepdim=True).values
    no_keepdim = {
        "max": torch.exp(square - row_max[:, 0]) / torch.exp(square - row_max[:, 0]).sum(-1, keepdim=True),
        "sum": torch.exp(square - row_max) / torch.exp(square - row_max).sum(-1),
        "max and sum": torch.exp(square - row_max[:, 0]) / torch.exp(square - row_max[:, 0]).sum(-1),
    }
    for where, wrong in no_keepdim.items():
        if torch.allclose(got, wrong.double(), atol=1e-6):
            raise Mismatch(f"{what}: without keepdim=True, the row {where} of shape (4,) broadcast along the last "
                           "axis, so row i's value was applied to column i. Keep the axis: .max(dim=-1, keepdim=True), "
                           ".sum(dim=-1, keepdim=True)")
    expect_close(got, torch.softmax(square, dim=-1), what=what)
    # 2. A matrix that is not square.
    small = randn(3, 5, generator=generator)
    expect_close(run(small, "stable_softmax(x) for x of shape (3, 5)"), torch.softmax(small, dim=-1),
                 what="stable_softmax(x) for x of shape (3, 5)")
    # 3. Any number of leading axes, and a 1-D vector.
    cube = randn(2, 3, 4, generator=generator)
    what = "stable_softmax(x) for x of shape (2, 3, 4)"
    got = run(cube, what)
    if torch.allclose(got.detach().double(), torch.softmax(cube, dim=1).double(), atol=1e-6):
        raise Mismatch(f"{what}: you normalised over axis 1, which is the last axis only for a matrix; "
                       "for a tensor of any shape use dim=-1")
    expect_close(got, torch.softmax(cube, dim=-1), what=what)
    vector = torch.tensor([1000.0, 1001.0, 1002.0])
    got = run(vector, "stable_softmax of the vector [1000, 1001, 1002]")
    expect(bool(torch.isfinite(got).all()),
           "on the vector [1000, 1001, 1002] your result contains inf or NaN: exp(1000) overflows float32; "
           "subtract the maximum before torch.exp")
    expect_close(got, torch.softmax(vector, dim=-1), what="stable_softmax of the vector [1000, 1001, 1002]")
    # 4. Rows whose maxima are far apart: one maximum for the whole tensor underflows the low row to 0 / 0.
    apart = torch.tensor([[1000.0, 1001.0], [-1000.0, -999.0]])
    what = "stable_softmax of [[1000, 1001], [-1000, -999]]"
    got = run(apart, what)
    if bool(torch.isnan(got[1]).any()) and not bool(torch.isnan(got[0]).any()):
        alone = run(apart[1:], "stable_softmax of [[-1000, -999]]")
        if not bool(torch.isfinite(alone).all()):
            raise Mismatch(f"{what}: the second row is NaN, and so is [[-1000, -999]] on its own. No score there is "
                           "large, but exp(-1000) underflows float32 to 0, so the row became 0 / 0. Subtract each "
                           "row's own maximum always, not only when a score is large: then every row has an exponent "
                           "of exactly 0")
        raise Mismatch(f"{what}: the second row is NaN. You subtracted one maximum for the whole tensor (1001): "
                       "exp(-2000) is 0 in float32, so that row became 0 / 0. Subtract each row's own maximum")
    expect(bool(torch.isfinite(got).all()),
           f"{what}: your result contains inf or NaN: exp of a large score overflows float32; "
           "subtract each row's maximum before torch.exp")
    expect_close(got, torch.softmax(apart, dim=-1), what=what)
    # 4b. A tensor whose only large scores are very negative: nothing would overflow, but e^-200 underflows to 0,
    #     so shifting only when a score is large (or only rows whose maximum is positive) still divides 0 by 0.
    low = torch.tensor([[0.0, 1.0], [-200.0, -199.0]])
    what = "stable_softmax of [[0, 1], [-200, -199]]"
    got = run(low, what)
    if not bool(torch.isfinite(got).all()):
        raise Mismatch(f"{what}: your result contains inf or NaN in the row [-200, -199]. No score here is large, but "
                       "exp(-200) underflows float32 to 0, so that row became 0 / 0. Subtract each row's own maximum "
                       "always, not only when a score is large: then every row has an exponent of exactly 0")
    expect_close(got, torch.softmax(low, dim=-1), what=what)
    # 5. A row that spans 200 with its maximum in the middle: shifting by anything but the maximum (the minimum,
    #    the first or the last score, the mean) leaves an exponent of 100 or more, above 88.
    wide = torch.tensor([[-100.0, 100.0, 0.0], [3.0, 1.0, 2.0]])
    what = "stable_softmax of [[-100, 100, 0], [3, 1, 2]]"
    got = run(wide, what)
    if not bool(torch.isfinite(got[0]).all()):
        raise Mismatch(f"{what}: the first row contains inf or NaN. Subtracting the row's minimum (or anything but its "
                       "maximum: its first or last score, its mean) leaves exp(200) or exp(100), which overflow float32 "
                       "(above exp(88.7)); subtract the maximum, so that every exponent is at most 0")
    expect_close(got, torch.softmax(wide, dim=-1), what=what)
    # 6. Scores of attention at other sizes (B, L, S), and rows near +100 and -100 in float32.
    for size in other_sizes():
        scores = randn(*size.shape("B", "L", "S"), generator=generator, scale=3.0)
        what = f"stable_softmax(scores) for scores of shape (B, L, S) = {tuple(scores.shape)}"
        expect_close(run(scores, what), torch.softmax(scores, dim=-1), what=what)
    for shape in ((4, 6), (2, 3, 5)):
        scores = large_scores(*shape, generator=generator)
        what = f"stable_softmax(scores) for scores of shape {shape} near +100 and -100 (float32)"
        got = run(scores, what)
        expect(bool(torch.isfinite(got).all()),
               f"{what}: your result contains inf or NaN: exp of a score near 100 overflows float32; "
               "subtract each row's maximum before torch.exp")
        expect_close(got, torch.softmax(scores, dim=-1), what=what)
    # 7. Half precision, with row maxima of 20 and 12: float16 overflows above 65504, that is exp(11.1), so a shift
    #    applied only when a score is large (above 50, say, where float32 would overflow) gives inf / inf here.
    half = torch.tensor([[20.0, 19.0, 0.0], [12.0, 11.5, 3.0]], dtype=torch.float16)
    what = "stable_softmax of [[20, 19, 0], [12, 11.5, 3]] in float16"
    got = run(half, what)
    if not bool(torch.isfinite(got).all()):
        raise Mismatch(f"{what}: your result contains inf or NaN. float16 overflows above 65504, so exp(20) (and "
                       "already exp(11.1)) is inf there, and the row becomes inf / inf. Did you shift by the maximum only "
                       "when a score is large (above some threshold)? Subtract each row's own maximum always, not only "
                       "when a score is large: then every exponent is at most 0, in any dtype")
    expect_close(got, torch.softmax(half.float(), dim=-1), what=what)
    return "your softmax matches torch.softmax over the last axis of any shape, also on scores of ±1000."


@exercise(
    "Exercise 2, simple self-attention for a batch",
    hint="on three axes .T reverses all of them: swap only the last two (the tokens and the features); the "
         "softmax runs over the keys, the last axis; the context is the weights times x",
    forbid=("sdpa",),
)
def check_batched_self_attention(batched_self_attention) -> str:
    generator = rng(2)
    B, T, E = 2, 4, 3
    x = randn(B, T, E, generator=generator)
    x[1] *= 2.0  # the two sequences differ in scale, so that weights that mix the batch show
    what = "weights for x of shape (B=2, T=4, E=3)"
    with _without_numpy():
        context, weights = _pair(call(batched_self_attention, x), "batched_self_attention(x)")
    expected_context, expected_weights = simple_self_attention(x)
    if isinstance(weights, torch.Tensor) and tuple(weights.shape) == (B, T, E) and \
            isinstance(context, torch.Tensor) and tuple(context.shape) == (B, T, T):
        raise Mismatch("return (context, weights) in that order: context is (B, T, E), weights (B, T, T)")
    weights = expect_tensor(weights, what=what, shape=(B, T, T))
    w = weights.detach().double()
    if _columns_sum_to_one(w) and not _rows_sum_to_one(w):
        raise Mismatch(f"{what}: your weights' columns sum to one, not their rows: the softmax ran over the queries "
                       "(dim=1 or dim=-2); normalise over the keys, dim=-1")
    if torch.allclose(w.sum(0), torch.ones(T, T, dtype=torch.float64), atol=1e-5):
        raise Mismatch(f"{what}: your weights sum to one across the batch (dim=0): each sequence must attend "
                       "only within itself; normalise over the keys, dim=-1")
    expect_close(weights, expected_weights, what=what)
    context = expect_tensor(context, what="context for x of shape (B=2, T=4, E=3)", shape=(B, T, E))
    expect_close(context, expected_context, what="context for x of shape (B=2, T=4, E=3)")
    # Other batches, lengths and widths (batch 1 and 3, B == T, odd widths): nothing may depend on B = 2,
    # T = 4 or E = 3.
    for size in other_sizes(same_length=True):
        other = randn(size.B, size.T, size.E, generator=generator)
        shape = f"(B={size.B}, T={size.T}, E={size.E})"
        with _without_numpy():
            got = _pair(call(batched_self_attention, other), f"batched_self_attention(x) for x of shape {shape}")
        expected_context, expected_weights = simple_self_attention(other)
        expect_close(got[1], expected_weights, what=f"weights for x of shape {shape}")
        expect_close(got[0], expected_context, what=f"context for x of shape {shape}")
    # Without a Python loop over the batch: batched matrix products make as many torch calls for B = 8 as for B = 1.
    calls = {size: _torch_calls(batched_self_attention, randn(size, 4, 3, generator=generator)) for size in (1, 8)}
    if calls[8] > calls[1]:
        raise Mismatch(f"your function makes more torch calls for a bigger batch ({calls[1]} for B=1, {calls[8]} for "
                       "B=8): a Python loop over the batch, which the exercise asks you to do without. Matrix "
                       "products (@, torch.matmul) and the softmax work on every sequence of a (B, T, E) tensor at "
                       "once")
    return "both the weights (B, T, T) and the context vectors (B, T, E) are right for every sequence in the batch."


def _without_numpy() -> forbidden:
    """Exercise 2 asks for torch's batched products: a loop in numpy would hide from the count of torch calls."""
    return forbidden(torch.Tensor.numpy, torch.Tensor.__array__, torch.Tensor.tolist,
                     reason="this exercise asks for torch's matrix products on the whole (B, T, E) tensor; leaving torch "
                            "for numpy or Python lists hides a loop over the batch")


class _CountCalls(TorchFunctionMode):
    """Counts the torch calls made from Python while it is in force (functions, Tensor methods, indexing)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def _torch_calls(fn, *args) -> int:
    """How many torch calls ``call(fn, *args)`` makes (its own copies and comparisons of the inputs included:
    they do not depend on the batch)."""
    with _CountCalls() as counter:
        call(fn, *args)
    return counter.calls


def _without_self(x: torch.Tensor):
    scores = x @ x.transpose(-2, -1)  # (..., T, T)
    diagonal = torch.eye(x.size(-2), dtype=torch.bool, device=x.device)  # (T, T), True on the diagonal
    weights = torch.softmax(scores.masked_fill(diagonal, float("-inf")), dim=-1)  # (..., T, T)
    return weights @ x, weights  # (..., T, E)


def _shown(values) -> list:
    """Weights for a message: three decimals, or two significant digits when tiny but not 0."""
    return [f"{v:.1e}" if 0 < abs(v) < 1e-3 else round(v, 3) for v in values]


# --- Exercise 3 -----------------------------------------------------------------------------------

def _diagnose_without_self(weights, x: torch.Tensor, what: str) -> None:
    """Name the usual mistakes of exercise 3 on the weights of ``x`` (T, E), before any comparison of values."""
    T = x.size(-2)
    w = weights.detach().double()
    eye = torch.eye(T, dtype=torch.bool)
    off_diagonal = ~eye
    scores = (x @ x.transpose(-2, -1)).double()  # (T, T)
    plain = torch.softmax(scores, dim=-1)
    expected = _without_self(x.double())[1]
    if bool(torch.isnan(w).any()):
        renormalised = torch.softmax(x @ x.transpose(-2, -1), dim=-1) * off_diagonal  # in the input's dtype
        renormalised = renormalised / renormalised.sum(-1, keepdim=True)
        exponentials = torch.exp((x @ x.transpose(-2, -1)).masked_fill(eye, float("-inf")))  # no maximum subtracted
        naive = exponentials / exponentials.sum(-1, keepdim=True)
        if torch.equal(torch.isnan(w), torch.isnan(naive)):
            rows = sorted({int(i) for i in torch.isnan(w).nonzero()[:, 0]})
            also = (" (Or you zeroed the diagonal after the softmax and divided by what was left, which gives the "
                    "same 0 / 0 here: mask the score before the softmax.)"
                    if torch.equal(torch.isnan(w), torch.isnan(renormalised)) else "")
            raise Mismatch(f"{what}: rows {rows} are NaN. Your softmax exponentiates the masked scores without "
                           "subtracting each row's maximum (the naive softmax of section 4): in float32 exp overflows "
                           "to inf above a score of about 88, and rounds to 0 below about -103, so a row became "
                           "inf / inf or 0 / 0. Apply torch.softmax to the masked scores (it subtracts the maximum "
                           f"of what is left), or subtract the row maximum of the masked scores yourself.{also}")
        if torch.equal(torch.isnan(w), torch.isnan(renormalised)):
            rows = sorted({int(i) for i in torch.isnan(w).nonzero()[:, 0]})
            raise Mismatch(f"{what}: rows {rows} are NaN. You zeroed the diagonal after the softmax and divided by "
                           "what was left, but where a token's own score is far above the others, its weights on "
                           "them had already rounded to 0 (in float32, any weight below about 1e-45, e^-103), so "
                           "the row became 0 / 0. Give the diagonal's scores minus infinity before the softmax: the "
                           "other weights are then computed from their own scores")
        if bool(torch.isnan(w[off_diagonal]).all()):
            raise Mismatch(f"{what}: every weight is NaN. Multiplying the identity matrix by minus infinity gives "
                           "0 × (−inf) = NaN off the diagonal, and one NaN score makes its whole row NaN: put minus "
                           "infinity on the diagonal only, with masked_fill (or torch.where)")
        raise Mismatch(f"{what}: your weights contain NaN at {int(torch.isnan(w).sum())} place(s)")
    if torch.allclose(w, plain, atol=1e-5):
        raise Mismatch(f"{what}: these are plain self-attention's weights; each token must give its own position "
                       "weight 0")
    wrongly_zero = (w == 0) & (expected > 0)  # positions that must keep a weight
    diagonal = torch.diagonal(w)
    if not bool((diagonal == 0).all()):
        shown = _shown(diagonal.tolist())
        if bool((w[off_diagonal] == 0).all()):
            raise Mismatch(f"{what}: every token attends only to itself (diagonal {shown}): your mask is inverted; "
                           "hide the diagonal and keep every other position")
        if bool(wrongly_zero.any()):
            hidden = [tuple(int(i) for i in p) for p in wrongly_zero.nonzero()[:4]]
            raise Mismatch(f"{what}: the diagonal must be exactly 0, got {shown}, while you hid other positions "
                           f"(query, key) = {hidden}...: hide the positions where query and key are the same token, "
                           "those of a boolean identity matrix of size T")
        zero_score = torch.softmax(scores.masked_fill(eye, 0.0), dim=-1)
        if torch.allclose(w, zero_score, atol=1e-5):
            raise Mismatch(f"{what}: the diagonal must be exactly 0 (no token attends to itself); got {shown}. "
                           "A score of 0 is not enough, since exp(0) = 1: use float('-inf')")
        if bool((diagonal < 1e-2).all()):
            raise Mismatch(f"{what}: the diagonal must be exactly 0 (no token attends to itself); got {shown}. A "
                           "large negative score (or a large penalty) still has an exponential, a small weight that "
                           "is not 0, and it wins wherever the other scores are lower still: only minus infinity, "
                           "float('-inf'), is below every score and gives exactly 0")
        raise Mismatch(f"{what}: the diagonal must be exactly 0 (no token attends to itself); got {shown}")
    if not _rows_sum_to_one(weights):
        if torch.allclose(w[off_diagonal], plain[off_diagonal], atol=1e-5):
            raise Mismatch(f"{what}: you zeroed the diagonal after the softmax, so the rows no longer sum to one "
                           "(they lost the weight each token gave itself). Mask the score before the softmax")
        raise Mismatch(f"{what}: each row must sum to one; got row sums {[round(v, 4) for v in w.sum(-1).tolist()]}")
    if bool(wrongly_zero.any()):
        same_vector = (x.unsqueeze(-2) == x.unsqueeze(-3)).all(-1) & off_diagonal  # (T, T): other tokens equal to it
        if bool(same_vector.any()) and torch.equal(wrongly_zero, same_vector):
            pairs = [tuple(int(i) for i in p) for p in same_vector.nonzero()[:4]]
            raise Mismatch(f"{what}: you hid every token whose vector equals the query's, not the query's own "
                           f"position: the repeated word's two copies hid each other, (query, key) = {pairs}. Hide "
                           "by position, where the query's index equals the key's index")
        hidden = [tuple(int(i) for i in p) for p in wrongly_zero.nonzero()[:4]]
        raise Mismatch(f"{what}: only the diagonal may be zero; every other token keeps a positive weight, but you "
                       f"gave 0 to (query, key) = {hidden}")


def _apart(length: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Two tokens of the given length pointing apart: scores +length² with themselves, -length² with each other."""
    return torch.tensor([[length, 0.0], [-length, 0.0]], dtype=dtype)


@exercise(
    "Exercise 3, attention that skips itself",
    hint="hide the diagonal, where query and key are the same token (a boolean identity matrix of size T, made on "
         "the input's device), by giving those scores minus infinity before the softmax over the keys; then take the "
         "context with the new weights",
)
def check_attention_without_self(attention_without_self) -> str:
    generator = rng(4)
    x = randn(5, 3, generator=generator)
    x[2] *= 3.0  # a long vector: plain self-attention puts most of its weight on itself
    what = "weights for x of shape (T=5, E=3)"
    context, weights = _pair(call(attention_without_self, x), "attention_without_self(x)")
    weights = expect_tensor(weights, what=what, shape=(5, 5))
    _diagnose_without_self(weights, x, what)
    expected_context, expected_weights = _without_self(x)
    expect_close(weights, expected_weights, what=what)
    context = expect_tensor(context, what="context for x of shape (T=5, E=3)", shape=(5, 3))
    _, plain = simple_self_attention(x)
    if torch.allclose(context.detach().double(), (plain @ x).double(), atol=1e-5):
        raise Mismatch("context for x of shape (T=5, E=3): these are plain self-attention's context vectors: "
                       "compute them with your new weights")
    expect_close(context, expected_context, what="context for x of shape (T=5, E=3)")
    # A repeated word, "the bank the river": the two copies of "the" are equal vectors at different positions.
    the, bank, river = [0.1, 0.1, 0.1, 0.1], [0.3, 0.9, 0.0, 0.1], [0.9, 0.6, 0.0, 0.1]
    repeated = torch.tensor([the, bank, the, river])
    what = "weights for the sentence 'the bank the river' (the word 'the' twice, as equal vectors)"
    got = _pair(call(attention_without_self, repeated), "attention_without_self(x) for 'the bank the river'")
    _diagnose_without_self(expect_tensor(got[1], what=what, shape=(4, 4)), repeated, what)
    expected_context, expected_weights = _without_self(repeated)
    expect_close(got[1], expected_weights, what=what)
    expect_close(got[0], expected_context, what="context for the sentence 'the bank the river'")
    # Half precision, where -1e9 does not exist (chapter 04 shows it).
    half = randn(4, 3, generator=generator).half()
    what = "weights for x of shape (T=4, E=3) in float16"
    try:
        got = _pair(call(attention_without_self, half), "attention_without_self(x) for x in float16")
    except _StudentCodeFailed as failed:
        if isinstance(failed.error, RuntimeError) and "overflow" in str(failed.error):
            raise Mismatch(f"for x in float16 your code raised {type(failed.error).__name__}: "
                           f"{str(failed.error).splitlines()[0]}. A fill value such as -1e9 does not exist in "
                           f"float16, whose largest magnitude is {torch.finfo(torch.float16).max:.0f}: fill with "
                           "float('-inf'), which every floating dtype has") from None
        if isinstance(failed.error, RuntimeError) and "dtype" in str(failed.error).lower():
            raise Mismatch(f"for x in float16 your code raised {type(failed.error).__name__}: "
                           f"{str(failed.error).splitlines()[0]}. A tensor made without dtype= (torch.eye, torch.full, "
                           "torch.zeros ...) is float32 whatever the input, and mixing it with the float16 scores "
                           "made them float32: make new tensors with the input's dtype (dtype=x.dtype), or use "
                           "masked_fill with a boolean mask") from None
        raise
    got_weights = expect_tensor(got[1], what=what, shape=(4, 4), dtype="float")
    for item, name in ((got_weights, "weights"), (got[0], "context")):
        if isinstance(item, torch.Tensor) and item.dtype != torch.float16:
            raise Mismatch(f"for x in float16 your {name} {'are' if name == 'weights' else 'is'} {item.dtype}, not float16: you converted x, the scores "
                           "or the weights to another dtype. The exercise asks for attention in float16 (half in, "
                           "half out): compute in the input's dtype, and fill with float('-inf'), which float16 has")
    _diagnose_without_self(got_weights, half, what)
    expected_context, expected_weights = _without_self(half.double())
    expect_close(got_weights, expected_weights, what=what)
    expect_close(got[0], expected_context, what="context for x of shape (T=4, E=3) in float16")
    # Tiny vectors (scores near 1e-6): a finite penalty scaled to the scores leaves the diagonal a tiny weight, not 0.
    tiny = randn(4, 3, generator=generator, scale=1e-3)
    what = "weights for tiny vectors x of shape (T=4, E=3), entries near 0.001 (scores near 1e-6)"
    got = _pair(call(attention_without_self, tiny), "attention_without_self(x) for tiny vectors x")
    _diagnose_without_self(expect_tensor(got[1], what=what, shape=(4, 4)), tiny, what)
    expected_context, expected_weights = _without_self(tiny)
    expect_close(got[1], expected_weights, what=what)
    expect_close(got[0], expected_context, what="context for tiny vectors x of shape (T=4, E=3)")
    # Two tokens pointing the same way, long (scores 100 to 121): exp of a score above 88 overflows float32, so a
    # softmax written without subtracting the maximum gives inf / inf.
    same_way = torch.tensor([[11.0, 0.0], [10.0, 0.0]])
    what = "weights for two long tokens pointing the same way, [11, 0] and [10, 0] (scores 100 to 121)"
    got = _pair(call(attention_without_self, same_way), f"attention_without_self(x) for x = {same_way.tolist()}")
    _diagnose_without_self(expect_tensor(got[1], what=what, shape=(2, 2)), same_way, what)
    expected_context, expected_weights = _without_self(same_way)
    expect_close(got[1], expected_weights, what=what)
    expect_close(got[0], expected_context, what="context for two long tokens pointing the same way (each token must "
                                                "copy the other one)")
    # Two tokens pointing apart (scores +-121, then +-1e32): each must attend fully to the other, however low their
    # score with it. A finite fill (-100, -1e9) loses to a lower score; zeroing after the softmax divides 0 by 0.
    for length, shown in ((11.0, "±121"), (1e16, "±1e32")):
        apart = _apart(length)
        what = f"weights for two tokens pointing apart, [{length:g}, 0] and [{-length:g}, 0] (scores {shown})"
        got = _pair(call(attention_without_self, apart), f"attention_without_self(x) for x = {apart.tolist()}")
        got_weights = expect_tensor(got[1], what=what, shape=(2, 2))
        w = got_weights.detach().double()
        if not bool(torch.isnan(w).any()) and bool((torch.diagonal(w) > 0.5).all()):
            raise Mismatch(f"{what}: each token kept weight {_shown(torch.diagonal(w).tolist())} on itself. Its score "
                           f"with the other token ({-length ** 2:g}) is lower than the value you gave the diagonal, so "
                           "the diagonal still won the softmax: a finite number is not below every score. Fill with "
                           "minus infinity, float('-inf')")
        _diagnose_without_self(got_weights, apart, what)
        expected_context, expected_weights = _without_self(apart)
        expect_close(got_weights, expected_weights, what=what)
        expect_close(got[0], expected_context, what=f"context for two tokens pointing apart (scores {shown}): each "
                                                    "token must copy the other one")
    # Three tokens, one long (scores 400 with itself, 20 and 40 with the others): its weights on the other two must
    # follow their scores (about 2e-9 and 1), however small they were next to its own. Zeroing after the softmax
    # leaves 0 / 0 there, and a NaN patched to a uniform row gives 0.5 and 0.5.
    three = torch.tensor([[20.0, 0.0], [1.0, 0.0], [2.0, 0.0]])
    what = "weights for three tokens [20, 0], [1, 0] and [2, 0] (token 0 scores 400 with itself, 20 and 40 with the others)"
    got = _pair(call(attention_without_self, three), f"attention_without_self(x) for x = {three.tolist()}")
    got_weights = expect_tensor(got[1], what=what, shape=(3, 3))
    _diagnose_without_self(got_weights, three, what)
    expected_context, expected_weights = _without_self(three)
    row = got_weights.detach().double()[0]
    if bool(torch.isfinite(row).all()) and abs(float(row[1]) - float(row[2])) < 1e-3:
        raise Mismatch(f"{what}: row 0 gives tokens 1 and 2 the same weight, {_shown(row[1:].tolist())}, although their "
                       "scores with token 0 (20 and 40) differ, so its weights should be about 2e-9 and 1. Did you "
                       "zero the diagonal after the softmax, renormalise, and replace the resulting NaN (0 / 0) with "
                       "equal weights? Next to the score of 400, the other weights had already rounded to 0: give "
                       "the diagonal minus infinity before the softmax, so that the other weights come from their "
                       "own scores")
    expect_close(got_weights, expected_weights, what=what)
    expect_close(got[0], expected_context, what="context for three tokens [20, 0], [1, 0] and [2, 0]")
    # A batch, and T = 2 (each token can then attend only to the other one).
    batch = randn(3, 2, 4, generator=generator)
    got = _pair(call(attention_without_self, batch), "attention_without_self(x) for x of shape (3, 2, 4)")
    expected_context, expected_weights = _without_self(batch)
    expect_close(got[1], expected_weights, what="weights for a batch x of shape (B=3, T=2, E=4)")
    expect_close(got[0], expected_context, what="context for a batch x of shape (B=3, T=2, E=4) (each token "
                                                "must copy the other one)")
    # Other batches, lengths and widths (T >= 2: a single token has nothing else to attend to).
    for size in other_sizes(same_length=True):
        if size.T < 2:
            continue
        other = randn(size.B, size.T, size.E, generator=generator)
        shape = f"(B={size.B}, T={size.T}, E={size.E})"
        got = _pair(call(attention_without_self, other), f"attention_without_self(x) for x of shape {shape}")
        expected_context, expected_weights = _without_self(other)
        expect_close(got[1], expected_weights, what=f"weights for x of shape {shape}")
        expect_close(got[0], expected_context, what=f"context for x of shape {shape}")
    # Another device (the GPU, else the meta device): the mask must be made where x is.
    device = other_device()
    batch = randn(2, 4, 3, generator=generator)
    where = f"for x of shape (B=2, T=4, E=3) on the {device.type} device"
    got = call_elsewhere(attention_without_self, batch.to(device), device=device, what=f"attention_without_self(x) {where}",
                         made_by="torch.eye, torch.ones, torch.full ...")
    if got is not None:
        got = _pair(got, f"attention_without_self(x) {where}")
        expected_context, expected_weights = _without_self(batch.to(device))
        for item, expected, name in ((got[1], expected_weights, "weights"), (got[0], expected_context, "context")):
            item = expect_tensor(item, what=f"{name} {where}", shape=expected.shape)
            expect_same_device(item, device, what=f"{name} {where}")
            if device.type != "meta":
                expect_close(item, expected, what=f"{name} {where}")
    return ("no token attends to itself, even where its score with every other token is very low; the rows still "
            "sum to one, and it works on a batch, in float16 and on the input's device.")


def _cosine(x: torch.Tensor, temperature: float):
    unit = x / x.norm(dim=-1, keepdim=True)  # (..., T, E), each row of length 1
    weights = torch.softmax(unit @ unit.transpose(-2, -1) / temperature, dim=-1)  # (..., T, T)
    return weights @ x, weights  # (..., T, E): the original vectors are averaged


@exercise(
    "Exercise 4, attention by direction only (cosine similarity)",
    hint="give each token's vector (the last axis, not each feature) length 1; the scores are the dot products "
         "of those unit vectors divided by the temperature, with the softmax over the keys; the context averages "
         "the original vectors",
)
def check_cosine_self_attention(cosine_self_attention) -> str:
    generator = rng(5)
    x = torch.rand(4, 3, generator=generator) + 0.1
    x[1] *= 4.0  # lengths differ a lot, so that forgetting to normalise shows
    temperature = 0.5
    what = f"weights for x of shape (T=4, E=3) at temperature {temperature}"
    context, weights = _pair(call(cosine_self_attention, x, temperature),
                             f"cosine_self_attention(x, {temperature})")
    weights = expect_tensor(weights, what=what, shape=(4, 4))
    w = weights.detach().double()
    expected_context, expected_weights = _cosine(x, temperature)
    if not torch.allclose(w, expected_weights.double(), atol=1e-5):
        unit = x / x.norm(dim=-1, keepdim=True)
        per_feature = x / x.norm(dim=-2, keepdim=True)
        candidates = {
            "you did not normalise the vectors: these are plain dot-product scores divided by the temperature":
                torch.softmax(x @ x.T / temperature, dim=-1),
            "you normalised each feature (dim=-2, down the tokens) instead of each token's vector (dim=-1)":
                torch.softmax(per_feature @ per_feature.T / temperature, dim=-1),
            "you multiplied by the temperature instead of dividing by it":
                torch.softmax(unit @ unit.T * temperature, dim=-1),
            "you left out the temperature":
                torch.softmax(unit @ unit.T, dim=-1),
            "the softmax ran over the queries (dim=0); normalise over the keys, dim=-1":
                torch.softmax(unit @ unit.T / temperature, dim=0),
        }
        for mistake, wrong in candidates.items():
            if torch.allclose(w, wrong.double(), atol=1e-5):
                raise Mismatch(f"{what}: {mistake}")
    expect_close(weights, expected_weights, what=what)
    context = expect_tensor(context, what="context for x of shape (T=4, E=3)", shape=(4, 3))
    unit_context = (expected_weights @ (x / x.norm(dim=-1, keepdim=True)))
    if torch.allclose(context.detach().double(), unit_context.double(), atol=1e-5):
        raise Mismatch("context for x of shape (T=4, E=3): you averaged the normalised vectors; the weights come "
                       "from directions, but the context averages the original vectors x")
    expect_close(context, expected_context, what="context for x of shape (T=4, E=3)")
    # Another temperature and a batch: nothing may be hard-coded.
    batch = torch.rand(2, 5, 3, generator=generator) + 0.1
    got = _pair(call(cosine_self_attention, batch, 0.1), "cosine_self_attention(x, 0.1) for x of shape (2, 5, 3)")
    expected_context, expected_weights = _cosine(batch, 0.1)
    expect_close(got[1], expected_weights, what="weights for a batch x of shape (B=2, T=5, E=3) at temperature 0.1")
    expect_close(got[0], expected_context, what="context for a batch x of shape (B=2, T=5, E=3) at temperature 0.1")
    # A low temperature, 0.01: the scores reach 1 / 0.01 = 100, where exp overflows float32 (above about 88.7).
    cold = torch.rand(4, 3, generator=generator) + 0.1
    what = "weights for x of shape (T=4, E=3) at temperature 0.01 (scores up to 100)"
    got = _pair(call(cosine_self_attention, cold, 0.01), "cosine_self_attention(x, 0.01)")
    got_weights = expect_tensor(got[1], what=what, shape=(4, 4))
    if not bool(torch.isfinite(got_weights.detach()).all()):
        raise Mismatch(f"{what}: your weights contain inf or NaN. A cosine of 1 divided by 0.01 is a score of 100, and "
                       "exp(100) overflows float32 (above exp(88.7)), so a softmax written as exp(s) / exp(s).sum() "
                       "gives inf / inf: use torch.softmax, which subtracts each row's maximum first")
    expected_context, expected_weights = _cosine(cold.double(), 0.01)
    expect_close(got_weights, expected_weights, what=what)
    expect_close(got[0], expected_context, what="context for x of shape (T=4, E=3) at temperature 0.01")
    # A short vector (length 1e-6, like a word whose features are all small): its direction counts as much as any
    # other. A guard against division by zero not far below its length (F.normalize(eps=1e-3), x / (norm + 1e-3),
    # norm.clamp(min=1e-3)) shortens its unit vector and changes its scores.
    short = torch.rand(4, 3, generator=generator) + 0.1
    short[2] *= 1e-6 / float(short[2].norm())
    what = "weights for x of shape (T=4, E=3) with token 2 of length 1e-6, at temperature 0.1"
    got = _pair(call(cosine_self_attention, short, 0.1), "cosine_self_attention(x, 0.1) with a short token")
    got_weights = expect_tensor(got[1], what=what, shape=(4, 4))
    expected_context, expected_weights = _cosine(short.double(), 0.1)
    w = got_weights.detach().double()
    if bool(torch.isfinite(w).all()) and not torch.allclose(w, expected_weights, atol=1e-4):
        raise Mismatch(f"{what}: the weights differ (token 2's weight on itself is {_shown([float(w[2, 2])])[0]}, "
                       f"it should be {_shown([float(expected_weights[2, 2])])[0]}). A vector of length 1e-6 must "
                       "still become a unit vector: did you guard the division with an eps (F.normalize(eps=...), "
                       "norm + eps, norm.clamp(min=eps)) that is not far below 1e-6? Divide by the norm itself, or "
                       "keep F.normalize's default eps=1e-12")
    expect_close(got_weights, expected_weights, what=what)
    expect_close(got[0], expected_context, what="context for x of shape (T=4, E=3) with a short token")
    # Other batches, lengths and widths, at a temperature above 1.
    for size in other_sizes(same_length=True):
        other = randn(size.B, size.T, size.E, generator=generator)
        shape = f"(B={size.B}, T={size.T}, E={size.E})"
        got = _pair(call(cosine_self_attention, other, 2.0), f"cosine_self_attention(x, 2.0) for x of shape {shape}")
        expected_context, expected_weights = _cosine(other, 2.0)
        expect_close(got[1], expected_weights, what=f"weights for x of shape {shape} at temperature 2.0")
        expect_close(got[0], expected_context, what=f"context for x of shape {shape} at temperature 2.0")
    return "your weights depend only on the directions of the vectors, for any temperature and any batch."


def _shuffled(x: torch.Tensor, order: torch.Tensor):
    """Reference: simple self-attention of the shuffled sentence x[order], computed afresh."""
    return simple_self_attention(x[order])


# Exponentials under other names: exp(s) = 1 / sigmoid(-s) - 1 = exp(softplus(s)) - 1 = (1 + tanh(s/2)) / (1 - tanh(s/2))
# = cosh(s) + sinh(s) = elu(s) + 1 (s <= 0) = ldexp(1, s / ln 2) ...
_EXPONENTIALS = (torch.exp, torch.exp2, torch.expm1, torch.pow, torch.float_power, torch.Tensor.__rpow__, torch.ldexp,
                 torch.sigmoid, torch.special.expit, torch.nn.functional.softplus, torch.nn.functional.logsigmoid,
                 torch.nn.functional.silu, torch.nn.functional.elu, torch.nn.functional.celu, torch.nn.functional.selu,
                 torch.tanh, torch.sinh, torch.cosh)
# Routes that recover x from context = weights @ x (then attention could be computed again from x).
_SOLVERS = (torch.linalg.solve, torch.linalg.solve_ex, torch.linalg.inv, torch.linalg.inv_ex, torch.inverse,
            torch.linalg.pinv, torch.pinverse, torch.linalg.lstsq, torch.linalg.tensorsolve, torch.linalg.tensorinv,
            torch.linalg.solve_triangular, torch.triangular_solve, torch.cholesky_solve, torch.linalg.lu_solve,
            torch.lu_solve, torch.linalg.lu_factor, torch.linalg.lu, torch.linalg.qr, torch.linalg.svd, torch.svd,
            torch.linalg.cholesky, torch.cholesky_inverse)


def _moved(shuffled_attention, context, weights, order, *, what: str) -> tuple:
    """The student's (context, weights), with no softmax, exponential or linear solve allowed: the exercise
    moves numbers."""
    with forbidden(*_SOLVERS, np.linalg.solve, np.linalg.inv, np.linalg.pinv, np.linalg.lstsq, np.linalg.tensorsolve,
                   np.linalg.tensorinv,
                   reason="this exercise asks you to move the numbers you are given, without computing attention "
                          "again: recovering x by solving context = weights @ x (an inverse, a pseudo-inverse, a "
                          "least-squares fit or a factorisation) is the first step of computing it again"), \
            forbidden("softmax", *_EXPONENTIALS,
                      reason="this exercise asks you to move the numbers you are given, without computing attention "
                             "again (an exponential by another name is still an exponential)"):
        return _pair(call(shuffled_attention, context, weights, order), what)


@exercise(
    "Exercise 5, shuffle the words",
    hint="token k of the shuffled sentence is the old token number order[k]; a row of the weights belongs to a "
         "query and a column to a key, and both are tokens, so both axes are reordered by order (not by its "
         "inverse); the context vectors have one row per token",
    forbid=("sdpa",),
)
def check_shuffled_attention(shuffled_attention) -> str:
    generator = rng(6)
    T, E = 5, 3
    x = randn(T, E, generator=generator, scale=1.5)
    context, weights = simple_self_attention(x)
    order = torch.tensor([3, 0, 4, 1, 2])  # not its own inverse, so that order and its inverse differ
    inverse = torch.argsort(order)
    what = "shuffled_attention(context, weights, order) for a sentence of T=5 tokens and order [3, 0, 4, 1, 2]"
    got = _moved(shuffled_attention, context, weights, order, what=what)
    expected_context, expected_weights = _shuffled(x, order)
    if isinstance(got[1], torch.Tensor) and tuple(got[1].shape) == (T, E) and \
            isinstance(got[0], torch.Tensor) and tuple(got[0].shape) == (T, T):
        raise Mismatch("return (context, weights) in that order: context is (T, E), weights (T, T)")
    new_weights = expect_tensor(got[1], what=f"weights of {what}", shape=(T, T), dtype="float")
    w = new_weights.detach().double()
    candidates = {
        "you reordered the rows (the queries) but not the columns (the keys): a column belongs to a token too, "
        "and the keys were shuffled with the queries": weights[order],
        "you reordered the columns (the keys) but not the rows (the queries)": weights[:, order],
        "you used the inverse of the order: token k of the shuffled sentence is the old token order[k], so "
        "its row is the old row order[k]": weights[inverse][:, inverse],
        "these are the weights of the sentence before shuffling: shuffling the tokens moves their rows and "
        "columns": weights,
    }
    if not torch.allclose(w, expected_weights.double(), atol=1e-6):
        for mistake, wrong in candidates.items():
            if torch.allclose(w, wrong.double(), atol=1e-6):
                raise Mismatch(f"weights of {what}: {mistake}")
    expect_close(new_weights, expected_weights, what=f"weights of {what}")
    new_context = expect_tensor(got[0], what=f"context of {what}", shape=(T, E), dtype="float")
    c = new_context.detach().double()
    if torch.allclose(c, context[inverse].double(), atol=1e-6):
        raise Mismatch(f"context of {what}: you used the inverse of the order: token k of the shuffled sentence is "
                       "the old token order[k]")
    if torch.allclose(c, context.double(), atol=1e-6):
        raise Mismatch(f"context of {what}: these are the context vectors of the sentence before shuffling; each "
                       "token keeps its context vector, but the tokens move")
    expect_close(new_context, expected_context, what=f"context of {what}")
    # Other lengths and widths (one token, two tokens, the reversed order, an order that changes nothing),
    # and orders given as a list or a numpy array of integers.
    cases = [(1, 4, torch.tensor([0])), (2, 3, [1, 0]), (7, 5, np.array([6, 5, 4, 3, 2, 1, 0])),
             (4, 2, torch.arange(4)), (6, 4, torch.randperm(6, generator=generator))]
    for T, E, order in cases:
        x = randn(T, E, generator=generator)
        context, weights = simple_self_attention(x)
        index = torch.as_tensor(np.asarray(order), dtype=torch.long)
        shown = f"shuffled_attention(context, weights, order) for T={T}, E={E} and order {index.tolist()} " \
                f"(given as a {type(order).__name__})"
        got = _moved(shuffled_attention, context, weights, order, what=shown)
        expected_context, expected_weights = _shuffled(x, index)
        expect_close(got[1], expected_weights, what=f"weights of {shown}")
        expect_close(got[0], expected_context, what=f"context of {shown}")
    return ("the shuffled sentence's weights are the old ones with rows and columns reordered, and its context "
            "vectors the old ones reordered: simple self-attention does not see word order.")
