"""Checks for the exercises of chapter 01, why attention: encoder-decoder RNNs, Bahdanau and Luong.

Each check tries the answer on cases chosen so that the usual mistakes give a wrong result, and names
the mistake when it recognises one; the table of those mistakes is in tests/test_exercises_ch01.py.
They use the shared mechanism of ``attn_course.exercises``: torch's and the package's attention
forbidden where the exercise writes it (``forbid=("sdpa",)``), ``ac.shift_right``, the decoder's own
``step`` and its attention module forbidden where the exercise rewrites them (exercise 4 also forbids
``DotProductAttention`` and ``F.scaled_dot_product_attention``, which would take the score's last product,
v^T tanh(...)), inputs watched for
changes in place, sizes unlike the notebook's (``other_sizes``, and one source position), left padding
and a fully padded row (``padding_cases``), scores near +100 and rows alternating between about +100
and -100 (``large_scores``), scores near +1000 in exercise 1 (a softmax without its max shift overflows there
even in float64), padding that scores 112 above the real tokens (a softmax over all positions, zeroed
and renormalised afterwards, underflows) and a real token scoring -3e9 (below a -1e9 fill), inputs that require grad
(the results must carry gradients to them; exercise 4's logits to the attention's W, U and v), float64 inputs (a
result must keep their dtype; a float64 result of float32 inputs passes, as in every chapter, and only half precision
is rejected), one more case on another device (:func:`attn_course.exercises.other_device`; where that is the meta
device and an answer reads a value, which meta cannot run, the answer runs on the CPU under the shared mechanism's
DeviceWatch, which names a tensor made without device= meeting the inputs and a result left on the CPU), the exact dtype of token
ids, and numpy integers accepted as token ids. The package's ``alignment._weights_and_context`` (the softmax and the
weighted sum of its attention modules) is forbidden where the exercise writes the attention (1 and 2).
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from ..alignment import AdditiveAttention, DotProductAttention, _weights_and_context
from ..rnn import DIGIT_PAD, AttentionDecoder, shift_right
from . import (Mismatch, call, call_elsewhere, exercise, expect, expect_close, expect_on_device, expect_sequence,
               expect_tensor, large_scores, other_device, other_sizes, padding_cases, padding_mask_for, randn,
               rng, tolerance)
from ._core import _StudentCodeFailed

__all__ = ["check_general_attention", "check_luong_attention", "check_teacher_forcing_inputs",
           "check_token_query_step"]


def _pair(result, what: str):
    return expect_sequence(result, what=what, names=("context", "weights"))


def _context_shape(context, B: int, width: int, what: str) -> torch.Tensor:
    """The context must be (B, width); name the broadcast that weights @ H makes of (B, S) @ (B, S, width)."""
    if isinstance(context, torch.Tensor) and B > 1 and tuple(context.shape) == (B, B, width):
        raise Mismatch(f"{what}: expected shape {(B, width)}, got {(B, B, width)}: a matrix product of the (B, S) "
                       "weights with the (B, S, width) states multiplies the weights, as one matrix, with every "
                       "sentence's states. Each sentence's weights must meet only its own states: give the weights "
                       "a middle axis of size 1 before the product, or multiply elementwise and sum over the "
                       "source positions")
    return expect_tensor(context, what=what, shape=(B, width))


def _rows_sum_to_one(weights: torch.Tensor) -> bool:
    w = weights.detach().double()
    return bool(torch.allclose(w.sum(-1), torch.ones_like(w.sum(-1)), atol=1e-4))


_HALF = (torch.float16, torch.bfloat16)


def _not_half(got, inputs_dtype: torch.dtype, what: str) -> None:
    """Name a float16 or bfloat16 result of float32 or float64 inputs before any comparison of values, so that
    its rounding is not mistaken for another mistake (rows that seem not to sum to one, say)."""
    if isinstance(got, torch.Tensor) and got.dtype in _HALF and inputs_dtype not in _HALF:
        raise Mismatch(f"{what}: your result is {got.dtype} but the inputs were {inputs_dtype}: half precision "
                       "keeps about 3 significant digits (bfloat16 about 2), too few to check the weights; compute "
                       "in the inputs' dtype")


def _keeps_dtype(got: torch.Tensor, inputs_dtype: torch.dtype, what: str) -> None:
    """A result of float64 inputs must be float64: a buffer made without dtype= (torch.zeros(B, S)) is float32."""
    if got.dtype != inputs_dtype:
        raise Mismatch(f"{what}: the inputs are {inputs_dtype} but your result is {got.dtype}: a tensor you "
                       "create (torch.zeros, torch.empty, torch.tensor, torch.full ...) is float32 unless you give "
                       "it the inputs' dtype and device (dtype= and device= from an input, or zeros_like, "
                       "new_zeros, full_like); or compute without making new tensors. Or you cast the inputs "
                       "(.float(), .to(torch.float32)): keep their dtype")


def _trains_through(fn, inputs: dict, what: str, reference, outputs=("context", "weights")) -> None:
    """Call the answer on copies of ``inputs`` that require grad; each floating result must carry a gradient to
    every floating input (a result made under torch.no_grad(), detached, or rebuilt from numpy or .item() cannot
    be trained through, although its values are right), and that gradient must be the one ``reference`` (the
    check's own computation, called with the same inputs) gives: one use of an input detached (``H.detach()`` in
    the weighted sum) leaves a gradient that reaches the input by its other paths, but a different one."""
    if not torch.is_grad_enabled():
        return
    leaves = {name: (value.detach().clone().requires_grad_(True) if value.is_floating_point() else value)
              for name, value in inputs.items()}
    # Pass non-leaf copies, as a layer inside a model receives them (an in-place view op on a leaf that requires
    # grad raises), and ask for the gradients at the leaves.
    passed = [leaf.clone() if leaf.requires_grad else leaf for leaf in leaves.values()]
    result = expect_sequence(call(fn, *passed), what=what, names=outputs)
    floating = [leaf for leaf in leaves.values() if leaf.requires_grad]
    names = [name for name, leaf in leaves.items() if leaf.requires_grad]
    generator = rng(99)
    for output, tensor in zip(outputs, result):
        tensor = expect_tensor(tensor, what=f"{output} of {what}", dtype="float")
        reached = []
        if tensor.requires_grad:
            weights = randn(*tensor.shape, generator=generator, dtype=tensor.dtype)  # a random direction
            try:
                grads = torch.autograd.grad((tensor * weights).sum(), floating, allow_unused=True, retain_graph=True)
            except RuntimeError as error:  # the answer's graph cannot be run backwards
                first = str(error).splitlines()[0]
                raise Mismatch(f"{output} of {what}: right values, but backpropagating through them raised "
                               f"RuntimeError: {first[:160]}. "
                               + ("You wrote in place (w[...] = 0, masked_fill_, unsqueeze_ ...) into a tensor that "
                                  "autograd saved for the backward pass (the softmax's output, or an input): build a "
                                  "new tensor instead (masked_fill, torch.where, unsqueeze)"
                                  if "inplace" in first else "A layer must be trained through")) from None
            reached = [name for name, grad in zip(names, grads)
                       if grad is not None and bool(grad.nan_to_num().abs().sum() > 0)]
        missing = [name for name in names if name not in reached]
        if missing:
            how = ("it does not require grad" if not tensor.requires_grad else
                   f"no gradient reaches {', '.join(missing)} through it")
            raise Mismatch(f"{output} of {what}: right values, but nothing can be trained through them: {how}, so "
                           "part of your computation ran under torch.no_grad() or was detached (.detach(), .item(), "
                           "numpy, or torch.tensor(...) of a result). An attention layer is trained through: the "
                           "gradient must reach the decoder state, the encoder states and the layer's parameters; "
                           "only decoding at test time runs without gradients (the notebook's demonstration cells "
                           "use torch.no_grad() because they train nothing)")
        wanted = reference(*leaves.values())[outputs.index(output)]
        expected = torch.autograd.grad((wanted * weights).sum(), floating, allow_unused=True)
        _same_gradients(grads, expected, names, f"{output} of {what}")


def _same_gradients(got, expected, names, what: str) -> None:
    """Compare the gradients of the answer's result with those of the reference's, input by input (both along the
    same random direction); a difference names the input and the usual cause, a use of it that was detached.

    Local to this chapter: the shared mechanism has no helper that compares gradients."""
    for name, grad, want in zip(names, got, expected):
        want = torch.zeros(()) if want is None else want.detach()
        grad = torch.zeros_like(want) if grad is None else grad.detach()
        # Gradients are sums over the source positions and the widths: the float32 tolerance of the values,
        # ten times looser, keeps a right answer computed in another order (einsum, bmm) inside it.
        atol, rtol = tolerance(grad.dtype, want.dtype)
        close = torch.isclose(grad.double().cpu(), want.double().cpu().expand_as(grad.double()), atol=10 * atol,
                              rtol=10 * rtol)
        if not bool(close.all()):
            gap = float((grad.double() - want.double()).abs().max())
            raise Mismatch(f"{what}: right values, but the gradient that reaches {name} through them differs from "
                           f"the reference's (by up to {gap:.3g}): one use of {name} (or of a value computed from "
                           "it) in your computation was detached (.detach(), .data, or a value rebuilt from it), so "
                           "that path of the gradient is cut while the others still arrive. Training would follow a "
                           f"wrong gradient: keep every use of {name} in the graph")


def _low_precision_sums(w: torch.Tensor) -> bool:
    """Row sums off from one by the rounding of float16 or bfloat16 (2 to 3 significant digits), not more."""
    off = (w.sum(-1) - 1).abs()
    return bool((off < 2e-2).all()) and bool((off > 1e-5).any())


_LOW_PRECISION = ("each row must sum to one over the source positions, and yours are off by the rounding of half "
                  "precision: did you compute the softmax in float16 or bfloat16 and cast the result back? Half "
                  "precision keeps about 3 significant digits (bfloat16 about 2); compute in the inputs' dtype")


def _call_float64(fn, *args, what: str):
    """``call(fn, *args)`` on float64 inputs: a crash that mixes float32 and float64 is named as the dtype mistake."""
    try:
        return call(fn, *args)
    except _StudentCodeFailed as failed:
        text = str(failed.error)
        if "double" in text.lower() or "dtype" in text.lower() or "scalar type" in text.lower():
            raise Mismatch(f"{what}: with float64 inputs your code raised {type(failed.error).__name__}: "
                           f"{text.splitlines()[0]}. A tensor you create (torch.zeros, torch.empty, torch.tensor, "
                           "torch.full ...) is float32 unless you give it the inputs' dtype and device (dtype= and "
                           "device= from an input, or zeros_like, new_zeros, full_like)") from None
        raise


def _states_with_scores(query: torch.Tensor, scores: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Encoder states H (B, S, D) whose dot products with the (B, D) ``query`` are the (B, S) ``scores``.

    Random states, each moved along its sentence's query until ``query . h_j`` is the score wanted;
    computed in float64, returned as float32 (the scores then hold to float32 rounding).
    """
    q = query.double()  # (B, D)
    H = randn(*scores.shape, q.size(-1), generator=generator, dtype=torch.float64)  # (B, S, D)
    missing = scores.double() - (H @ q[:, :, None])[..., 0]  # (B, S): what each dot product lacks
    H = H + (missing / (q * q).sum(-1, keepdim=True))[:, :, None] * q[:, None, :]  # (B, S, D)
    return H.float()


# --- Another device -------------------------------------------------------------------------------

def _where(device: torch.device) -> str:
    return f"the {device.type} device"


# --- Exercise 1 -----------------------------------------------------------------------------------

def _general(s, H, W_a):
    """Reference for Luong's general score: e_j = s^T W_a h_j, softmax over j, c = sum_j a_j h_j."""
    scores = ((s @ W_a)[:, None, :] * H).sum(dim=-1)  # (B, Dk) -> (B, 1, Dk) * (B, S, Dk) -> (B, S)
    weights = torch.softmax(scores, dim=-1)  # over the source positions
    return (weights[:, :, None] * H).sum(dim=1), weights  # (B, Dk), (B, S)


def _general_mistakes(s, H, W_a) -> dict[str, torch.Tensor]:
    """The weights that the usual mistakes produce, each with what to tell the student."""
    out = {}
    if W_a.size(0) == W_a.size(1):  # only a square W_a lets these run at all
        out["you used W_a transposed: the score is s^T W_a h_j, so W_a's rows pair with the decoder state s "
            "(width Dq) and its columns with the encoder states h_j (width Dk): s times W_a has shape (B, Dk)"] = \
            torch.softmax(((s @ W_a.T)[:, None, :] * H).sum(-1), dim=-1)
        out["your scores ignore W_a: this is the plain dot product s^T h_j of section 6"] = \
            torch.softmax((s[:, None, :] * H).sum(-1), dim=-1)
    scores = ((s @ W_a)[:, None, :] * H).sum(-1)  # (B, S)
    for name, width in (("Dk", H.size(-1)), ("Dq", s.size(-1))):
        out[f"you divided the scores by sqrt({name}): Luong's general score is not scaled (the scaling by "
            "sqrt(d_k) comes with the Transformer, chapter 03)"] = torch.softmax(scores / width ** 0.5, dim=-1)
    if s.size(0) > 1:
        out["your weights sum to one down the batch (dim=0), not across the source positions (the last axis)"] = \
            torch.softmax(scores, dim=0)
    return out


_ONE_MAX = ("you subtracted one maximum for the whole batch, not each row's own: the sentences whose scores all "
            "lie near -100, far below that maximum, get exp(...) = 0 at every position, and 0/0. Subtract each "
            "row's maximum (over the last axis, keeping it), or use torch.softmax")


def _wrong_low_rows(w: torch.Tensor, expected: torch.Tensor) -> bool:
    """Right on the rows near +100 (even rows), NaN, inf or zero on the rows near -100 (odd rows)."""
    high, low = w[0::2], w[1::2]
    broken = (~torch.isfinite(low)).any(-1) | (low.nan_to_num().abs().sum(-1) == 0)
    return bool(broken.any()) and torch.allclose(high.nan_to_num(), expected[0::2].double(), atol=1e-5, rtol=1e-4)


_FLOAT64_OVERFLOW = ("these scores reach about 1000 (float32 inputs): exp(1000) overflows float32, and float64 "
                     "too (its exp overflows above about 709), so a softmax computed in float64 without subtracting "
                     "the maximum only moves the overflow further out (and nan_to_num would hide it as zeros). Use "
                     "torch.softmax, or subtract each row's maximum before exponentiating")


def _general_values(general_attention, s, H, W_a, *, alternating: bool = False, near_1000: bool = False) -> None:
    """Run the answer on one case and compare it with the reference, naming the mistakes it recognises.
    ``near_1000``: the case whose scores reach about 1000, where any failure of the weights is an overflow."""
    B, S, Dk = H.shape
    Dq = s.size(-1)
    shapes = f"s (B={B}, Dq={Dq}), H (B={B}, S={S}, Dk={Dk}) and W_a ({Dq}, {Dk})"
    if s.dtype != torch.float32:
        shapes += f", all {s.dtype}"
    context, weights = _pair(_call_float64(general_attention, s, H, W_a, what=f"general_attention(s, H, W_a) for {shapes}"),
                             f"general_attention(s, H, W_a) for {shapes}")
    if isinstance(weights, torch.Tensor) and tuple(weights.shape) == (B, Dk) and (B, Dk) != (B, S) and \
            isinstance(context, torch.Tensor) and tuple(context.shape) == (B, S):
        raise Mismatch("return (context, weights) in that order: context is (B, Dk), weights (B, S)")
    if isinstance(weights, torch.Tensor) and B > 1 and tuple(weights.shape) == (B, B, S):
        raise Mismatch(f"weights for {shapes}: shape (B, B, S) = {(B, B, S)}: a (B, Dk) matrix times a (B, Dk, S) "
                       "batch broadcasts to every pair of sentences. Each sentence's query must meet only its "
                       "own states: give the (B, Dk) query a middle axis of size 1 first")
    what = f"weights for {shapes}"
    weights = expect_tensor(weights, what=what, shape=(B, S), dtype="float")
    _not_half(weights, s.dtype, what)
    if s.dtype == torch.float64:
        _keeps_dtype(weights, s.dtype, what)
    w = weights.detach().double()
    expected_context, expected_weights = _general(s, H, W_a)
    if alternating and _wrong_low_rows(w, expected_weights):
        raise Mismatch(f"{what}, with scores near +100 in the even rows and near -100 in the odd rows: {_ONE_MAX}")
    if near_1000 and not (bool(torch.isfinite(w).all()) and _rows_sum_to_one(w)):
        raise Mismatch(f"{what}: your weights contain inf or NaN, or rows that do not sum to one: {_FLOAT64_OVERFLOW}")
    expect(bool(torch.isfinite(w).all()),
           f"{what}: your weights contain inf or NaN. These scores reach about 100: exp(100) overflows float32. "
           "Use torch.softmax, or subtract each row's maximum before exponentiating")
    if not torch.allclose(w, expected_weights.double(), atol=1e-5, rtol=1e-4):
        for mistake, wrong in _general_mistakes(s, H, W_a).items():
            if torch.allclose(w, wrong.double(), atol=1e-5, rtol=1e-4):
                raise Mismatch(f"{what}: {mistake}")
        if not _rows_sum_to_one(w) and _low_precision_sums(w):
            raise Mismatch(f"{what}: {_LOW_PRECISION}; got row sums {[round(v, 4) for v in w.sum(-1).tolist()]}")
        if not _rows_sum_to_one(w):
            raise Mismatch(f"{what}: each row must sum to one over the source positions; got row sums "
                           f"{[round(v, 4) for v in w.sum(-1).tolist()]}. Did you return the scores, before the "
                           "softmax?")
    expect_close(weights, expected_weights, what=what)
    context = _context_shape(context, B, Dk, f"context for {shapes}")
    _not_half(context, s.dtype, f"context for {shapes}")
    if s.dtype == torch.float64:
        _keeps_dtype(context, s.dtype, f"context for {shapes}")
    expect_close(context, expected_context, what=f"context for {shapes}")


@exercise(
    "Exercise 1, Luong's general score",
    hint="first carry the decoder state into the keys' space with W_a (a (B, Dk) result); then each sentence "
         "needs the dot product of that vector with each of its own S encoder states, which gives scores of "
         "shape (B, S); the softmax runs over the source positions, the last axis; the context is the weighted "
         "sum of the states over the source positions",
    forbid=("sdpa", _weights_and_context),
)
def check_general_attention(general_attention) -> str:
    generator = rng(11)
    # A square W_a first (it lets the layout mistakes run) with Dk = 5, so that dividing by sqrt(Dk) is
    # not dividing by a round temperature; then the decoder and the encoder of different widths.
    for B, S, Dq, Dk in ((3, 4, 5, 5), (2, 7, 3, 6)):
        _general_values(general_attention, randn(B, Dq, generator=generator), randn(B, S, Dk, generator=generator),
                        randn(Dq, Dk, generator=generator))
    # Sizes unlike the notebook's: one sentence, B == S, odd widths; then one source position.
    for size in other_sizes():
        _general_values(general_attention, randn(size.B, size.E, generator=generator),
                        randn(size.B, size.S, size.D, generator=generator), randn(size.E, size.D, generator=generator))
    _general_values(general_attention, randn(2, 3, generator=generator), randn(2, 1, 4, generator=generator),
                    randn(3, 4, generator=generator))
    # Scores near +100: a softmax written with exp and no shift overflows float32.
    s = randn(2, 4, generator=generator)
    H = randn(2, 6, 4, generator=generator)
    W_a = randn(4, 4, generator=generator)
    W_a = W_a * (100.0 / float(((s @ W_a)[:, None, :] * H).sum(-1).max()))  # the largest score is +100
    _general_values(general_attention, s, H, W_a)
    # Rows alternating between about +100 and about -100: one maximum for the whole batch fails.
    s, W_a = randn(4, 3, generator=generator), randn(3, 5, generator=generator)
    H = _states_with_scores(s @ W_a, large_scores(4, 6, generator=generator), generator)
    _general_values(general_attention, s, H, W_a, alternating=True)
    # Scores near +1000, float32 inputs: torch.softmax and a softmax shifted by each row's maximum handle them; one
    # without the shift overflows even in float64 (exp(709) is float64's limit). One score leads each row by 12 or
    # more, so the weights hardly depend on the float32 rounding of the scores (which reaches 1e-4 near 1000).
    s, W_a = randn(2, 4, generator=generator), randn(4, 5, generator=generator)
    H = _states_with_scores(s @ W_a, torch.tensor([[1000.0, 985.0, 970.0, 988.0, 960.0],
                                                   [-20.0, 950.0, 936.0, 930.0, 938.0]]), generator)
    _general_values(general_attention, s, H, W_a, near_1000=True)
    # float64 inputs: the result keeps their dtype.
    _general_values(general_attention, randn(3, 4, generator=generator, dtype=torch.float64),
                    randn(3, 5, 6, generator=generator, dtype=torch.float64),
                    randn(4, 6, generator=generator, dtype=torch.float64))
    # Inputs that require grad: the context and the weights must carry a gradient to s, H and W_a.
    _trains_through(general_attention, {"s": randn(3, 4, generator=generator), "H": randn(3, 5, 6, generator=generator),
                                        "W_a": randn(4, 6, generator=generator)},
                    "general_attention(s, H, W_a) for s, H and W_a that require grad", _general)
    # Another device: the notebook's GPU, or the meta device.
    device = other_device()
    s, H, W_a = (randn(3, 4, generator=generator), randn(3, 5, 6, generator=generator),
                 randn(4, 6, generator=generator))
    shown = f"general_attention(s, H, W_a) with s, H and W_a on {_where(device)}"
    # An answer the meta device cannot run (it reads a value) runs on the CPU under a watch instead.
    result = call_elsewhere(general_attention, s.to(device), H.to(device), W_a.to(device), device=device, what=shown,
                            cpu_args=(s, H, W_a))
    if result is not None:
        context, weights = _pair(result, shown)
        weights = expect_on_device(weights, device, f"weights of {shown}")
        context = expect_on_device(context, device, f"context of {shown}")
        for name, tensor, shape in (("weights", weights, (3, 5)), ("context", context, (3, 6))):
            expect_tensor(tensor, what=f"{name} of {shown}", shape=shape, dtype="float")
            _not_half(tensor, torch.float32, f"{name} of {shown}")
        if device.type != "meta":
            expected_context, expected_weights = _general(s, H, W_a)
            expect_close(weights, expected_weights.to(device), what=f"weights of {shown}")
            expect_close(context, expected_context.to(device), what=f"context of {shown}")
    return "your weights and context vectors are right, also when the decoder and encoder widths differ."


# --- Exercise 2 -----------------------------------------------------------------------------------

def _tiny(values) -> list[str]:
    """Weights shown so that 1e-44 does not print as 0.0."""
    return [f"{v:.1e}" if v != 0 else "0" for v in values]


@exercise(
    "Exercise 2, Luong's dot-product attention with padding",
    hint="the scores are each sentence's dot products of s with its own S states, shape (B, S); give the "
         "padding positions (True in the mask) minus infinity before the softmax over the last axis, so that "
         "exp makes them exactly 0; a row that is all padding then comes out as 0/0 = NaN, which you replace by "
         "zeros (torch.nan_to_num, or a fill where the whole row is padding); use the mask as it is given",
    forbid=("sdpa", _weights_and_context),
)
def check_luong_attention(luong_attention) -> str:
    generator = rng(12)
    reference = DotProductAttention()

    def run(s, H, padding_mask, label):
        B, S, D = H.shape
        what = f"weights for s (B={B}, D={D}), H (B={B}, S={S}, D={D}) and {label}"
        shown = f"luong_attention(s, H, padding_mask) with {label}"
        context, weights = _pair(_call_float64(luong_attention, s, H, padding_mask, what=shown), shown)
        weights = expect_tensor(weights, what=what, shape=(B, S), dtype="float")
        _not_half(weights, s.dtype, what)
        if isinstance(context, torch.Tensor):
            _not_half(context, s.dtype, f"context with {label}")
        if s.dtype == torch.float64:
            _keeps_dtype(weights, s.dtype, what)
        expected_context, expected_weights = reference(s, H, key_padding_mask=padding_mask)
        w, real = weights.detach().double(), ~padding_mask.all(dim=-1)  # rows with at least one real token
        if bool(real.any()) and not torch.allclose(w.nan_to_num(), expected_weights.double(), atol=1e-5, rtol=1e-4) \
                and _low_precision_sums(w[real]):
            raise Mismatch(f"{what}: {_LOW_PRECISION}; got row sums {[round(v, 4) for v in w.sum(-1).tolist()]}")
        return what, context, weights, expected_context, expected_weights

    # 1. The notebook's case: five, two and no real tokens (right padding), with the named mistakes.
    B, S, D = 3, 5, 4
    s = randn(B, D, generator=generator)
    H = randn(B, S, D, generator=generator)
    padding_mask = padding_mask_for([5, 2, 0], S)
    what, context, weights, expected_context, expected_weights = run(s, H, padding_mask, "a padding mask")
    w = weights.detach().double()
    expect(not bool(torch.isnan(w[:2]).any()), f"{what}: rows with real tokens contain NaN")
    if torch.allclose(w[:2].sum(0), torch.ones(S, dtype=torch.float64), atol=1e-5) or \
            torch.allclose(w.nan_to_num().sum(0), torch.ones(S, dtype=torch.float64), atol=1e-5):
        raise Mismatch(f"{what}: your weights sum to one down the batch (dim=0), not across the source positions "
                       "(the last axis)")
    expect(not bool(torch.isnan(w[2]).any()),
           f"{what}: the fully padded row (the third) is NaN: the softmax of a row of -inf is 0/0. "
           "A row with nothing to attend to must give zero weights and a zero context")
    expect(not (bool((w[1, :2] == 0).all()) and bool((w[1, 2:] > 0).any())),
           f"{what}: your weights are zero at the real tokens and positive at the padding: "
           "in this course's convention True marks padding, the positions to ignore")
    if bool((w[1, 2:] == 0).all()) and torch.allclose(w[2], torch.full((S,), 1 / S, dtype=torch.float64), atol=1e-6):
        raise Mismatch(f"{what}: the fully padded row (the third) is uniform, {1 / S:.2f} everywhere, which is its "
                       "weight spread over padding. Either a finite fill (such as -1e9, or the dtype's lowest number "
                       "with nothing done afterwards) left all the scores of that row equal, or you replaced that row's "
                       f"NaN (the softmax of a row of -inf is 0/0) by 1/S = {1 / S:.2f}. A row with nothing to attend "
                       "to must give zero weights and a zero context")
    unmasked = torch.softmax((H @ s[:, :, None])[..., 0], dim=-1).masked_fill(padding_mask, 0.0)  # (B, S)
    if torch.allclose(w[:2], unmasked[:2].double(), atol=1e-6) and not torch.allclose(w[1].sum(), torch.ones((), dtype=torch.float64)):
        raise Mismatch(f"{what}: you zeroed the padding after the softmax, so the weights of the second row (two real "
                       "tokens) no longer sum to one. Fill the padding's scores with float('-inf') before the softmax")
    if not bool((w[padding_mask] == 0).all()):
        small = bool((w[padding_mask].abs() < 1e-6).all())
        raise Mismatch(f"{what}: padding positions must get weight exactly 0; got {_tiny(w[padding_mask].tolist())}. "
                       + ("Those are tiny but not 0: a finite fill (such as -100) only makes the padding unlikely. "
                          if small else "A fill of 0 is an ordinary score. ")
                       + "Fill the padding's scores with float('-inf') before the softmax")
    expect_close(weights, expected_weights, what=what)
    context = _context_shape(context, B, D, f"context for s (B={B}, D={D}), H (B={B}, S={S}, D={D}) and a padding mask")
    expect_close(context, expected_context, what=f"context for s (B={B}, D={D}), H (B={B}, S={S}, D={D}) and a padding mask")

    # 2. No padding, right padding, left padding, and a row of nothing but padding: the mask as given.
    for label, mask in padding_cases(batch_size=3, max_len=5, empty_row=True):
        s, H = randn(3, 4, generator=generator), randn(3, 5, 4, generator=generator)
        what, context, weights, expected_context, expected_weights = run(s, H, mask, label)
        if label.startswith("left"):
            lengths = (~mask).sum(-1)
            right = padding_mask_for(lengths.tolist(), 5)  # the same lengths, padded on the right
            _, right_weights = reference(s, H, key_padding_mask=right)
            if torch.allclose(weights.detach().double().nan_to_num(), right_weights.double(), atol=1e-5):
                raise Mismatch(f"{what}: your weights are those of right padding (tokens first, padding last), but "
                               "this mask pads on the left. Use the mask you are given, not lengths rebuilt from it")
        expect_close(weights, expected_weights, what=what)
        expect_close(_context_shape(context, 3, 4, f"context with {label}"), expected_context, what=f"context with {label}")

    # 3. Other batches, lengths and widths (one sentence, odd widths), padding on either side.
    for size in other_sizes():
        s, H = randn(size.B, size.E, generator=generator), randn(size.B, size.S, size.E, generator=generator)
        lengths = [max(1, size.S - b) for b in range(size.B)]
        mask = padding_mask_for(lengths, size.S, side="left" if size.B % 2 else "right")
        label = f"lengths {lengths}"
        what, context, weights, expected_context, expected_weights = run(s, H, mask, label)
        expect_close(weights, expected_weights, what=what)
        expect_close(_context_shape(context, size.B, size.E, f"context with {label}"), expected_context,
                     what=f"context with {label}")

    # 6. Rows alternating between about +100 and -100, with padding on either side: one maximum for the
    # whole batch leaves the low rows at exp(...) = 0.
    s = randn(4, 5, generator=generator)
    H = _states_with_scores(s, large_scores(4, 6, generator=generator), generator)
    mask = torch.stack([padding_mask_for([6], 6)[0], padding_mask_for([4], 6)[0],
                        padding_mask_for([3], 6, side="left")[0], padding_mask_for([5], 6, side="left")[0]])
    label = "scores near +100 (first and third sentences) and near -100 (second and fourth)"
    what, context, weights, expected_context, expected_weights = run(s, H, mask, label)
    w = weights.detach().double()
    if _wrong_low_rows(w, expected_weights):
        raise Mismatch(f"{what}: {_ONE_MAX}")
    expect(bool(torch.isfinite(w).all()),
           f"{what}: your weights contain inf or NaN: exp(100) overflows float32. Use torch.softmax, or subtract "
           "each row's maximum before exponentiating")
    high = [round(v, 4) for v in w[0::2].sum(-1).tolist()]
    expect(all(abs(v - 1) < 1e-4 for v in high),
           f"{what}: the sentences whose scores are near +100 sum to {high}, not 1: exp(100) overflows float32 to inf, "
           "and inf/inf is NaN (which nan_to_num turns into 0, hiding the overflow). Use torch.softmax, or subtract "
           "each row's maximum before exponentiating")
    expect_close(weights, expected_weights, what=what)
    expect_close(context, expected_context, what=f"context with {label}")

    # 4. Scores near +100: exp overflows float32 without the max shift. In the second sentence the padding
    # scores about 112 above the real tokens: a softmax (or a maximum) taken over the padding too leaves the real
    # tokens' exps at exp(-112), which underflows float32 to 0 (below about exp(-104)), so zeroing the padding
    # afterwards and renormalising, or dividing by their sum plus an epsilon, cannot recover their weights.
    s = randn(2, 4, generator=generator)
    wanted = torch.tensor([[100.0, 97.0, 95.5, 99.0, 93.0, 98.5],  # all real: the largest score is +100
                           [-12.0, -14.5, -13.0, 100.0, 99.0, 97.5]], dtype=torch.float64)  # three real, three padding
    H = _states_with_scores(s, wanted, generator)
    mask = padding_mask_for([6, 3], 6)
    what, context, weights, expected_context, expected_weights = run(s, H, mask, "scores near 100")
    expect(bool(torch.isfinite(weights).all()),
           f"{what}: your weights contain inf or NaN: exp(100) overflows float32. Use torch.softmax, or subtract "
           "each row's maximum before exponentiating")
    sums = [round(v, 4) for v in weights.detach().double().sum(-1).tolist()]
    expect(abs(sums[0] - 1) < 1e-4,
           f"{what}: the first row, whose largest score is 100, sums to {sums[0]}, not 1: exp(100) overflows float32 "
           "to inf, and inf/inf is NaN (which nan_to_num turns into 0, hiding the overflow). Use torch.softmax, or "
           "subtract each row's maximum before exponentiating")
    if not _rows_sum_to_one(weights):
        scores = (H.double() @ s.double()[:, :, None])[..., 0]  # (2, 6)
        gap = float(scores[1][mask[1]].max() - scores[1][~mask[1]].max())
        raise Mismatch(f"{what}: your weights are finite, but the rows sum to {sums}, not 1. In the second row the "
                       f"padding scores {gap:.0f} above every real token: a softmax, or a maximum taken over the "
                       f"padding too, leaves the real tokens' exps at about exp(-{gap:.0f}), which float32 rounds to 0 "
                       "(anything below about exp(-104) is 0). Zeroing the padding afterwards and renormalising, or "
                       "dividing by their sum plus a small number (such as 1e-12), cannot bring them back. Fill the "
                       "padding's scores with -inf before the softmax (before the maximum), and divide by the exact "
                       "sum (a row that is all padding is handled apart)")
    expect_close(weights, expected_weights, what=what)
    expect_close(context, expected_context, what="context with scores near 100")

    # 4b. A real token that scores below -1e9: a large finite fill is an ordinary score, and this one sentence's
    # only real token scores under it. The course fills with -inf (STYLE.md: never -1e9).
    s = randn(2, 4, generator=generator)
    wanted = torch.tensor([[-3e9, 0.5, -0.5, 1.0], [1.0, -2.0, 0.5, 3.0]], dtype=torch.float64)
    H = _states_with_scores(s, wanted, generator)
    mask = padding_mask_for([1, 3], 4)
    label = "a real token that scores about -3e9"
    what, context, weights, expected_context, expected_weights = run(s, H, mask, label)
    w = weights.detach().double()
    if bool(torch.isfinite(w[0]).all()) and float(w[0, 1:].sum()) > 0.5:
        raise Mismatch(f"{what}: the first sentence's only real token scores about -3e9 and got weight "
                       f"{float(w[0, 0]):.2f}; the padding got the rest. A large finite fill such as -1e9 is an "
                       "ordinary score, and a real token can score below it (this course never fills with -1e9: "
                       "it also overflows float16, whose lowest number is -65504). Fill the padding's scores with "
                       "float('-inf'), or with torch.finfo(scores.dtype).min")
    expect_close(weights, expected_weights, what=what)
    expect_close(_context_shape(context, 2, 4, f"context with {label}"), expected_context,
                 what=f"context with {label}")

    # 5. One source position (real in the first sentence, padding in the second), and float64 inputs, whose
    # dtype the result keeps.
    cases = [(randn(2, 3, generator=generator), randn(2, 1, 3, generator=generator), padding_mask_for([1, 0], 1),
              "one source position, lengths [1, 0]"),
             (randn(3, 4, generator=generator, dtype=torch.float64),
              randn(3, 6, 4, generator=generator, dtype=torch.float64),
              padding_mask_for([6, 4, 2], 6, side="left"), "left padding, lengths [6, 4, 2], float64")]
    for s, H, mask, label in cases:
        what, context, weights, expected_context, expected_weights = run(s, H, mask, label)
        expect_close(weights, expected_weights, what=what)
        context = _context_shape(context, H.size(0), H.size(-1), f"context with {label}")
        if s.dtype == torch.float64:
            _keeps_dtype(context, s.dtype, f"context with {label}")
        expect_close(context, expected_context, what=f"context with {label}")

    # 7. Inputs that require grad (padding on either side, no empty row): the context and the weights must
    # carry a gradient to s and H.
    _trains_through(luong_attention, {"s": randn(3, 4, generator=generator), "H": randn(3, 5, 4, generator=generator),
                                      "padding_mask": torch.stack([padding_mask_for([5], 5)[0], padding_mask_for([3], 5)[0],
                                                                   padding_mask_for([2], 5, side="left")[0]])},
                    "luong_attention(s, H, padding_mask) for s and H that require grad",
                    lambda s, H, mask: DotProductAttention()(s, H, key_padding_mask=mask))

    # 8. Another device: the notebook's GPU, or the meta device.
    device = other_device()
    s, H = randn(3, 4, generator=generator), randn(3, 5, 4, generator=generator)
    mask = padding_mask_for([5, 3, 0], 5)
    shown = f"luong_attention(s, H, padding_mask) with s, H and the mask on {_where(device)}"
    # An answer the meta device cannot run (an if on the mask's values, .item()) runs on the CPU under a watch,
    # which names a tensor made without device= that meets the inputs (it fails on a GPU) and a result left there.
    result = call_elsewhere(luong_attention, s.to(device), H.to(device), mask.to(device), device=device, what=shown,
                            cpu_args=(s, H, mask))
    if result is not None:
        context, weights = _pair(result, shown)
        weights = expect_on_device(weights, device, f"weights of {shown}")
        context = expect_on_device(context, device, f"context of {shown}")
        for name, tensor, shape in (("weights", weights, (3, 5)), ("context", context, (3, 4))):
            expect_tensor(tensor, what=f"{name} of {shown}", shape=shape, dtype="float")
            _not_half(tensor, torch.float32, f"{name} of {shown}")
        if device.type != "meta":
            expected_context, expected_weights = reference(s, H, key_padding_mask=mask)
            expect_close(weights, expected_weights.to(device), what=f"weights of {shown}")
            expect_close(context, expected_context.to(device), what=f"context of {shown}")
    return "your weights ignore the padding on either side, and the fully padded row gives zeros, not NaN."


# --- Exercise 3 -----------------------------------------------------------------------------------

def _ids_like_target(got: torch.Tensor, target: torch.Tensor, what: str) -> None:
    """Token ids of the target's own dtype (the hint promises it; nn.Embedding takes int64 and int32 only)."""
    if got.dtype == target.dtype:
        return
    embedding = (" (and nn.Embedding accepts only int64 and int32 ids)" if got.dtype not in (torch.int64, torch.int32)
                 else "")
    raise Mismatch(f"{what}: expected token ids of the target's dtype, {target.dtype}, got {got.dtype}{embedding}: "
                   "a tensor made by torch.full or torch.tensor without dtype= is int64 (float32 with a float fill), "
                   "and .int(), .long() or .to(...) pick a dtype of their own. Take the dtype from the target "
                   "(full_like, new_full, or dtype= from the target)")


@exercise(
    "Exercise 3, the decoder's inputs under teacher forcing",
    hint="put one column holding bos_id in front of the target, with the target's own dtype and device, and "
         "drop the target's last column, so that the result keeps the shape (B, T); build a new tensor rather "
         "than writing into target",
    forbid=(shift_right,),
)
def check_teacher_forcing_inputs(teacher_forcing_inputs) -> str:
    target = torch.tensor([[3, 1, 4, 1], [5, 9, 2, 6]])
    bos_id = 11
    expected = torch.tensor([[11, 3, 1, 4], [11, 5, 9, 2]])
    got = call(teacher_forcing_inputs, target, bos_id)
    what = "teacher_forcing_inputs(target, 11) for target [[3, 1, 4, 1], [5, 9, 2, 6]]"
    got = expect_tensor(got, what=what)
    if tuple(got.shape) == (2, 5):
        raise Mismatch(f"{what}: expected shape (2, 4), got (2, 5): drop the last target token, which is never "
                       "an input (nothing comes after it to predict)")
    got = expect_tensor(got, what=what, shape=expected.shape)
    expect(not got.is_floating_point() and got.dtype != torch.bool,
           f"{what}: expected integer token ids (dtype torch.long, like the target), got dtype {got.dtype}: "
           "nn.Embedding accepts only integer ids. A tensor made by torch.ones or torch.zeros is float32 unless "
           "you give it the target's dtype")
    expect(not (bool((got[0] == bos_id).all()) and torch.equal(got[1], target[0])),
           f"{what}: you shifted along the batch axis (dim=0): the first row became all {bos_id}s. Shift along the "
           "time axis, dim=1: each row is one sequence")
    expect(not torch.equal(got, target),
           f"{what}: you returned the target itself; the decoder would see y_i while predicting y_i and learn to copy "
           "its input instead of translating")
    expect(not torch.equal(got, torch.roll(target, 1, dims=1)),
           f"{what}: torch.roll moved the last token to the front; the first input must be the begin-of-sequence "
           f"token {bos_id} (the last target token is never an input)")
    expect(bool((got[:, 0] == bos_id).all()),
           f"{what}: every row must start with the begin-of-sequence token {bos_id}; got first column {got[:, 0].tolist()}")
    expect(not torch.equal(got[:, 1:], target[:, 1:]),
           f"{what}: you put the begin-of-sequence token in place of y_0 but kept y_1 ... y_(T-1) where they were: "
           "step i would still see y_i. Shift the whole target one step to the right")
    expect(torch.equal(got.long(), expected), f"{what}: expected {expected.tolist()}, got {got.tolist()}")
    _ids_like_target(got, target, what)
    # A right-padded target, as real batches of unequal lengths are: the padding id is a token like any other here,
    # shifted with the rest (an answer that treats it specially, such as one replacing it by BOS, is named).
    padded = torch.tensor([[3, 1, DIGIT_PAD, DIGIT_PAD], [5, 9, 2, DIGIT_PAD]])
    want = torch.tensor([[bos_id, 3, 1, DIGIT_PAD], [bos_id, 5, 9, 2]])
    shown = f"teacher_forcing_inputs(target, {bos_id}) for the right-padded target {padded.tolist()} (padding id {DIGIT_PAD})"
    got = expect_tensor(call(teacher_forcing_inputs, padded, bos_id), what=shown, shape=(2, 4), dtype="integer")
    expect(not torch.equal(got.long(), expected),
           f"{shown}: expected {want.tolist()}, got {got.tolist()}, the answer for the first target: avoid "
           "hard-coding the length, the batch or the token id")
    expect(not torch.equal(got.long(), want.masked_fill(want == DIGIT_PAD, bos_id)),
           f"{shown}: expected {want.tolist()}, got {got.tolist()}: you replaced the padding id {DIGIT_PAD} by the "
           f"begin-of-sequence token {bos_id}. BOS belongs at the first step only; the padding is shifted right with "
           "the other tokens, unchanged")
    expect(torch.equal(got.long(), want),
           f"{shown}: expected {want.tolist()}, got {got.tolist()}: the padding id {DIGIT_PAD} is a token like any "
           "other here; shift it right with the rest, unchanged")
    # Other lengths, batches and ids (a numpy integer too, as token ids often are), T = 1, an int32 target.
    generator = rng(13)
    for B, T, bos, dtype in ((2, 7, 10, torch.long), (1, 1, np.int64(11), torch.long), (3, 2, 0, torch.long),
                             (4, 5, 7, torch.int32)):
        other = torch.randint(0, 10, (B, T), generator=generator, dtype=dtype)
        shown = f"teacher_forcing_inputs(target, {int(bos)}) for a target of shape ({B}, {T}) and dtype {dtype}"
        got = expect_tensor(call(teacher_forcing_inputs, other, bos), what=shown)
        expect(tuple(got.shape) == (B, T), f"{shown}: expected shape {(B, T)}, got {tuple(got.shape)}: avoid "
                                           "hard-coding the length, the batch or the token id")
        got = expect_tensor(got, what=shown, dtype="integer")
        want = torch.cat([torch.full((B, 1), int(bos), dtype=dtype), other[:, :-1]], dim=1)
        expect(torch.equal(got.long(), want.long()),
               f"{shown}: expected {want.tolist()}, got {got.tolist()}: avoid hard-coding the length, the batch or "
               "the token id")
        _ids_like_target(got, other, shown)
    # Another device: the notebook's GPU, or the meta device.
    device = other_device()
    other = torch.randint(0, 10, (3, 6), generator=generator)
    shown = f"teacher_forcing_inputs(target, 11) for a target of shape (3, 6) on {_where(device)}"
    # Token ids carry no gradient: a right answer may build the result on the CPU (.tolist(), numpy) and move it to
    # the target's device. The meta device cannot run such an answer (nor one with an if on the target's values):
    # it then runs on the CPU under a watch, which names a result left on the CPU (a list or numpy array never
    # moved back with device= or .to(target.device)) and a column made without device= meeting the target.
    got = call_elsewhere(teacher_forcing_inputs, other.to(device), bos_id, device=device, what=shown,
                         copy_out_is_a_mistake=False, cpu_args=(other, bos_id))
    if got is not None:
        got = expect_on_device(got, device, shown)
        expect_tensor(got, what=shown, shape=(3, 6), dtype=other.dtype)
        if device.type != "meta":
            expect(torch.equal(got.cpu(), shift_right(other, bos_id)), f"{shown}: expected the target shifted right")
    return "at step i the decoder sees y_(i-1) (BOS at the first step) and never the token it must predict."


# --- Exercise 4 -----------------------------------------------------------------------------------

def _token_decoder(E: int, D: int, A: int, generator: torch.Generator) -> AttentionDecoder:
    """A decoder of the exercise's kind with parameters drawn from ``generator`` (the global RNG untouched)."""
    decoder = AttentionDecoder(12, E, D, attention="additive", attention_dim=A, token_in_query=True)
    with torch.no_grad():
        for parameter in decoder.parameters():
            parameter.copy_(randn(*parameter.shape, generator=generator, scale=0.5))
    return decoder


def _token_step_variants(decoder, tokens, state, states):
    """What the plausible mistakes compute: name -> (logits, new state, weights)."""
    y = decoder.embedding(tokens)  # (B, E)

    def finish(query, cell_input_order="y,c", output_from="new", output_order="s,c"):
        context, weights = decoder.attention(query, states)
        cell_input = torch.cat([y, context] if cell_input_order == "y,c" else [context, y], dim=-1)
        new = decoder.cell(cell_input, state)
        used = new if output_from == "new" else state
        logits = decoder.output(torch.cat([used, context] if output_order == "s,c" else [context, used], dim=-1))
        return logits, new, weights

    return {
        "the query must be the state first, then the embedded token, [s_(i-1); y_(i-1)]: you put the token first":
            finish(torch.cat([y, state], dim=-1)),
        "the GRU's input is [y_(i-1); c_i], the embedded token first, then the context: you swapped them":
            finish(torch.cat([state, y], dim=-1), cell_input_order="c,y"),
        "the prediction is W_o [s_i; c_i] with the new state s_i, the GRU's output: you used the old state s_(i-1)":
            finish(torch.cat([state, y], dim=-1), output_from="old"),
        "the output layer reads [s_i; c_i], the new state first, then the context: you swapped them":
            finish(torch.cat([state, y], dim=-1), output_order="c,s"),
    }


def _step_gradients(token_query_step, decoder, tokens, state, states, shapes: str, generator) -> None:
    """Call the answer on a state and encoder states that require grad; the gradients that its logits and new
    state send to the state, the encoder states and every parameter of the decoder (the embedding, W, U, v, the
    GRU, the output layer) must be those of ``decoder.step``. A use of one of them detached (``state.detach()`` in
    the query, as truncated backpropagation would, ``y.detach()``, ``states.detach()`` in the weighted sum) leaves
    right values and a gradient that still arrives by the other paths, but a different one."""
    leaf_state = state.detach().clone().requires_grad_(True)
    leaf_states = states.detach().clone().requires_grad_(True)
    named = [("the state s_(i-1)", leaf_state), ("the encoder states", leaf_states)]
    named += [(f"decoder.{name}", parameter) for name, parameter in decoder.named_parameters()]
    names, inputs = [name for name, _ in named], [tensor for _, tensor in named]
    what = f"token_query_step(decoder, ...) for {shapes}, with a state and encoder states that require grad"
    # Non-leaf copies, as a layer inside a model receives them (an in-place op on a leaf that requires grad raises).
    result = expect_sequence(call(token_query_step, decoder, tokens, leaf_state.clone(), leaf_states.clone()),
                             what=what, names=("logits", "state", "weights"))
    wanted = decoder.step(tokens, leaf_state, leaf_states, leaf_state)
    for name, got, want in (("logits", result[0], wanted[0]), ("new state", result[1], wanted[1])):
        got = expect_tensor(got, what=f"{name} of {what}", shape=want.shape, dtype="float")
        expect(got.requires_grad, f"{name} of {what}: right values, but nothing can be trained through them: they "
                                  "do not require grad, so your step ran under torch.no_grad() (or detached them)")
        direction = randn(*want.shape, generator=generator, dtype=want.dtype)
        try:
            grads = torch.autograd.grad((got * direction).sum(), inputs, allow_unused=True, retain_graph=True)
        except RuntimeError as error:
            raise Mismatch(f"{name} of {what}: right values, but backpropagating through them raised "
                           f"RuntimeError: {str(error).splitlines()[0][:160]}") from None
        expected = torch.autograd.grad((want * direction).sum(), inputs, allow_unused=True, retain_graph=True)
        _same_gradients(grads, expected, names, f"{name} of {what}")


def _close(got, wanted) -> bool:
    return all(torch.allclose(g, w.double(), atol=1e-5, rtol=1e-4) for g, w in zip(got, wanted))


@exercise(
    "Exercise 4, Bahdanau's query with the previous token",
    hint="follow section 8's Bahdanau step, with the score written out as in section 5 from the three layers of "
         "the decoder's attention module (W, U and v): only the query changes, the previous state and the embedded "
         "previous token joined along the last axis, state first (width D + E), which W now reads; softmax over "
         "the source positions and the weighted sum of the states give the context; the GRU's input, the new "
         "state and the output layer are as in Bahdanau's step; return the logits, the new state and the weights",
    # DotProductAttention and F.scaled_dot_product_attention ("sdpa") too: with v as their query and
    # tanh(W q + U H) as their keys, they would compute the last product of the score, v^T tanh(...), which the
    # exercise asks the student to write.
    forbid=(AttentionDecoder.step, AdditiveAttention, DotProductAttention, "sdpa"),
)
def check_token_query_step(token_query_step) -> str:
    generator = rng(14)
    cases = [(5, 8, 6, 3, 4, torch.float32)]  # E, D, A, B, S, dtype
    for size in other_sizes():  # one sentence, B == S, odd widths
        cases.append((size.H + 6, size.E, size.D + 1, size.B, size.S, torch.float32))
    cases.append((3, 5, 4, 2, 1, torch.float32))  # one source position: every weight is 1
    cases.append((4, 6, 5, 3, 5, torch.float64))  # float64: the result keeps the dtype
    for number, (E, D, A, B, S, dtype) in enumerate(cases):
        decoder = _token_decoder(E, D, A, generator).to(dtype)
        tokens = torch.randint(0, 12, (B,), generator=generator)
        if number == 0:
            tokens[0] = 11  # the begin-of-sequence token at the first step
        state = randn(B, D, generator=generator, dtype=dtype)
        states = randn(B, S, D, generator=generator, dtype=dtype)
        shapes = f"previous_tokens ({B},), state ({B}, {D}) and states ({B}, {S}, {D}), with E={E}"
        if dtype != torch.float32:
            shapes += f", decoder and states {dtype}"
        shown = f"token_query_step(decoder, ...) for {shapes}"
        result = expect_sequence(_call_float64(token_query_step, decoder, tokens, state, states, what=shown),
                                 what=shown, names=("logits", "state", "weights"))
        with torch.no_grad():
            want_logits, want_state, want_weights = decoder.step(tokens, state, states, state)
            variants = _token_step_variants(decoder, tokens, state, states)
        logits = expect_tensor(result[0], what=f"logits for {shapes}", shape=(B, 12), dtype="float")
        new_state = expect_tensor(result[1], what=f"new state for {shapes}", shape=(B, D), dtype="float")
        weights = expect_tensor(result[2], what=f"weights for {shapes}", shape=(B, S), dtype="float")
        for name, tensor in (("logits", logits), ("new state", new_state), ("weights", weights)):
            _not_half(tensor, dtype, f"{name} for {shapes}")
            if dtype == torch.float64:
                _keeps_dtype(tensor, dtype, f"{name} for {shapes}")
        got = [t.detach().double() for t in (logits, new_state, weights)]
        wanted = (want_logits, want_state, want_weights)
        if not _close(got, wanted):
            for mistake, wrong in variants.items():
                if _close(got, wrong) and not _close([w.double() for w in wrong], wanted):
                    raise Mismatch(f"token_query_step for {shapes}: {mistake}")
        if torch.allclose(got[1], state.double(), atol=1e-6):
            raise Mismatch(f"new state for {shapes}: you returned the state you were given; return s_i, the GRU's output")
        expect_close(weights, want_weights, what=f"weights for {shapes}")
        expect_close(new_state, want_state, what=f"new state for {shapes}")
        expect_close(logits, want_logits, what=f"logits for {shapes}")
        if torch.is_grad_enabled():
            expect(logits.requires_grad and new_state.requires_grad,
                   f"logits for {shapes}: right values, but nothing can be trained through them: they do not "
                   "require grad, so your step ran under torch.no_grad() (or detached them). A decoder step is "
                   "trained through; only decoding at test time runs without gradients")
        if torch.is_grad_enabled() and S > 1:
            # The alignment model must learn too: a gradient from the logits must reach W, U and v (with one
            # source position every weight is 1, and none does).
            layers = {"W": decoder.attention.W.weight, "U": decoder.attention.U.weight, "v": decoder.attention.v.weight}
            direction = randn(*logits.shape, generator=generator, dtype=logits.dtype)
            try:
                grads = torch.autograd.grad((logits * direction).sum(), list(layers.values()), allow_unused=True,
                                            retain_graph=True)
            except RuntimeError as error:
                raise Mismatch(f"logits for {shapes}: right values, but backpropagating through them raised "
                               f"RuntimeError: {str(error).splitlines()[0][:160]}") from None
            missing = [name for name, grad in zip(layers, grads) if grad is None or not bool(grad.abs().sum() > 0)]
            expect(not missing,
                   f"logits for {shapes}: right values, but no gradient reaches the attention's "
                   f"{', '.join(missing)}: the weights were computed under torch.no_grad() or detached, so the "
                   "alignment model would never learn where to look. Only the finished step's outputs leave the "
                   "graph, and only at test time")
            if number == 0:  # every gradient, to the state, the encoder states and the decoder's parameters
                _step_gradients(token_query_step, decoder, tokens, state, states, shapes, generator)
    # Another device: the notebook's GPU, or the meta device.
    device = other_device()
    decoder = _token_decoder(5, 8, 6, generator)
    tokens = torch.randint(0, 12, (3,), generator=generator)
    state, states = randn(3, 8, generator=generator), randn(3, 4, 8, generator=generator)
    shown = f"token_query_step(decoder, ...) with the decoder, tokens and states on {_where(device)}"
    moved = copy.deepcopy(decoder).to(device)
    result = call_elsewhere(token_query_step, moved, tokens.to(device), state.to(device), states.to(device),
                             device=device, what=shown, cpu_args=(decoder, tokens, state, states))
    if result is not None:
        result = expect_sequence(result, what=shown, names=("logits", "state", "weights"))
        for name, tensor, shape in zip(("logits", "new state", "weights"), result, ((3, 12), (3, 8), (3, 4))):
            tensor = expect_on_device(tensor, device, f"{name} of {shown}")
            expect_tensor(tensor, what=f"{name} of {shown}", shape=shape, dtype="float")
            _not_half(tensor, torch.float32, f"{name} of {shown}")
        if device.type != "meta":
            with torch.no_grad():
                wanted = decoder.step(tokens, state, states, state)
            for name, tensor, want in zip(("logits", "new state", "weights"), result, wanted):
                expect_close(tensor, want.to(device), what=f"{name} of {shown}")
    return "your step equals the package's decoder.step for a decoder with token_in_query=True, at every size tried."
