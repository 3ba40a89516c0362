"""Checks for the exercises of chapter 05, multi-head attention.

Each check tries sizes unlike the notebook's globals (``B, T, E, H = 2, 5, 12, 3``): a batch of 3
sequences of 7 tokens of width 24 split into 2, 3 and 6 heads, then :func:`other_sizes` (batch 1,
one token, one head, odd widths, ``L != S``), so that an answer that reads the notebook's ``B``,
``T`` or ``E`` fails, and names the usual mistakes (``view(B, H, T, D)``, interleaved heads, a merge
without the transpose, the per-head fused layout, narrowed values, the mask convention, the scale).
Exercises 1 and 2 try float64 inputs too: a split or a merge only moves numbers, so every float64 digit
must survive (a ``.float()`` on the way is named; the course's dtype rule otherwise lets a float32
result of float64 inputs pass, see ``expect_close``), and one case with the input on :func:`other_device`
(the accelerator, else the meta device), where a result moved to the CPU (``.cpu()``, ``.to("cpu")``) or made
without ``device=`` is named. Exercise 3 forbids building the layers (the
exercise asks for a formula). Exercise 4 forbids torch's and the package's attention, ``mha``'s own
forward included (``forbid=("sdpa",)``), the package's private masked softmax
``alignment._weights_and_context`` and its ``efficient.online_softmax`` (which gives a row that is all
-inf zero weights, half of the exercise), and tries left padding, a memory that is all padding (zero
context, so ``out_proj``'s bias, never NaN), scores far above 88 (where a softmax without its max
shift overflows, and a softmax over all keys renormalised after zeroing the padding underflows),
real scores far below zero (all exactly -180000, where every fixed finite fill above them, -100, -1e4 or
float16's -65504, gives the padding all the weight), float64 and float16 (where a fixed fill below -65504,
such as -1e9, overflows, so that only ``float('-inf')`` and ``finfo(dtype).min`` pass both, and where a float32
mask made without ``dtype=``, which promotes the scores, is named), and one case on :func:`other_device`
(the machine's accelerator, else the meta device),
where a tensor made without ``device=`` is named. An answer that branches on a tensor's value cannot run
on the meta device: that case then runs on the CPU under the shared ``DeviceWatch`` of
``call_elsewhere(..., cpu_args=...)``, which names a tensor of one or more dimensions made without ``device=``
that meets the inputs, or a result left on the CPU, and the success message says that
the answer has not run on a GPU (instead of "it keeps to the inputs' device"). By the
course's dtype rule a float32 result of float16 inputs passes (only a half-precision result of
full-precision inputs is rejected), and so does a float32 result of float64 inputs; so Exercise 4 judges
its float64 case at float32's tolerance whatever the result's dtype (a float64 answer that runs only its
softmax in float32 passes, as one computed wholly in float32 does). Every check but Exercise 3's ends with one
case run with autograd on, through the shared :func:`expect_gradients`: a result with the right values that cannot
be trained through is named (computed under ``torch.no_grad()``, ``.detach()``-ed, ``v`` detached so that no
gradient reaches ``v_proj``, or the softmax's output zeroed in place, which makes ``backward()`` raise). Exercise 4's
gradient case has no memory that is all padding (there the softmax's gradient is NaN for the reference too).
The table of wrong answers is in tests/test_exercises_ch05.py.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from ..alignment import _weights_and_context
from ..efficient import online_softmax
from ..multihead import MultiHeadAttention
from ._core import _StudentCodeFailed
from . import (Mismatch, call, call_elsewhere, exercise, expect, expect_close, expect_gradients, expect_int,
               expect_on_device, expect_sequence, expect_tensor, forbidden, other_device, other_sizes, padding_cases, padding_mask_for,
               randn, rng, tolerance)

__all__ = [
    "check_split_heads",
    "check_merge_heads",
    "check_split_fused_qkv",
    "check_count_parameters",
    "check_cross_attention",
]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (isinstance(a, torch.Tensor) and a.shape == b.shape
            and torch.allclose(a.detach().double().cpu(), b.detach().double().cpu(), atol=1e-5, rtol=1e-4))


def _split_cases():
    """(B, T, E, H, dtype): the notebook's globals are (2, 5, 12, 3); these are not, then the shared other
    sizes, then float64 inputs (where a ``.float()`` on the way loses digits)."""
    cases = [(3, 7, 24, H, torch.float32) for H in (2, 3, 6)]
    cases += [(s.B, s.T, s.E, s.H, torch.float32) for s in other_sizes(same_length=True)]
    cases.append((2, 3, 8, 4, torch.float64))
    return cases


def _keeps_float64(got: torch.Tensor, expected: torch.Tensor, what: str, operation: str) -> None:
    """A split or a merge only moves numbers, so float64 inputs must come out with every digit.

    The course's dtype rule lets a float32 result of float64 inputs pass (see expect_close); here the
    values themselves show the conversion: they equal the float64 answer only to float32 precision."""
    if expected.dtype != torch.float64 or got.shape != expected.shape:
        return
    exact = got.detach().to(device="cpu", dtype=torch.float64)
    want = expected.detach().cpu()
    if not torch.equal(exact, want) and torch.allclose(exact, want, atol=1e-5, rtol=1e-4):
        raise Mismatch(f"{what}: for float64 inputs your result ({got.dtype}) holds the numbers only to float32 "
                       f"precision: something on the way converted them (a .float(), or a tensor made without "
                       f"dtype=). {operation} only moves numbers, so it keeps every digit: keep the inputs' dtype")


def _heads(x: torch.Tensor, H: int) -> torch.Tensor:
    B, T, E = x.shape
    return x.view(B, T, H, E // H).transpose(1, 2)  # (B, T, E) -> (B, T, H, D) -> (B, H, T, D)


def _elsewhere(fn, args: tuple, what: str, expected, parts=lambda result: (result,)) -> None:
    """One case of Exercises 1 and 2 with the input on :func:`other_device` (the accelerator, else the meta device):
    a result moved to the CPU (``.cpu()``, ``.to("cpu")``) or made without ``device=`` is named; on an
    accelerator the values are compared too. ``parts`` turns the result into its tensors."""
    device = other_device()
    there = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)
    what = f"{what}, with the input on the {device.type} device"
    try:
        result = call_elsewhere(fn, *there, device=device, what=what, cpu_args=args)
    except Mismatch as error:
        if "cannot copy out of meta" in str(error).lower():
            raise Mismatch(f"{what}: your code copies the input's data to the CPU (.cpu(), .to('cpu'), .numpy(), "
                           ".tolist()), which the meta device (it stands for a GPU here: its tensors have shapes and "
                           "dtypes but no values) cannot do. Splitting and merging only rearrange the input: keep "
                           "the result on the input's device, never move it to a fixed one") from None
        raise
    if result is None:  # the meta device could not run it; the CPU run under the watch found nothing to name
        return
    for got, want in zip(parts(result), expected):
        got = expect_on_device(got, device, what, dtype="float")
        expect_tensor(got, what=what, shape=tuple(want.shape))
        if device.type != "meta":
            expect_close(got.detach().cpu(), want, what=what)


@exercise(
    "Exercise 1a, split the width into heads",
    hint="first regroup the last axis into (heads, head width) while the tokens stay where memory keeps them, "
         "then swap the token axis and the head axis; read every size from x and num_heads, not from the "
         "notebook's globals",
)
def check_split_heads(split_heads) -> str:
    generator = rng(51)
    for B, T, E, H, dtype in _split_cases():
        D = E // H
        x = randn(B, T, E, generator=generator, dtype=dtype)
        what = f"split_heads(x, num_heads={H}) for x of shape (B, T, E) = {(B, T, E)}, {dtype}"
        got = expect_tensor(call(split_heads, x, H), what=what, dtype="float")
        shape = tuple(got.shape)
        if H > 1 and shape == (B, T, H, D) and T != H:
            raise Mismatch(f"{what}: expected shape {(B, H, T, D)}, got {shape}: you grouped the width into heads "
                           "but left the head axis behind the token axis; swap the two")
        if len(shape) == 4 and shape[0] == B and shape[2] == T and shape[1] != H and shape[1] * shape[3] == E:
            raise Mismatch(f"{what}: expected {H} heads on axis 1, got {shape[1]} (shape {shape}): split into "
                           "num_heads heads, not a fixed number")
        expect_tensor(got, what=what, shape=(B, H, T, D))
        if H > 1 and T > 1 and _same(got, x.reshape(B, H, T, D)):
            raise Mismatch(
                f"{what}: you viewed x as (B, H, T, D) directly. The shape is right but the numbers are not: "
                "the memory of x is ordered token by token, so that view puts pieces of different tokens into "
                "one head. View as (B, T, H, D) first, then swap the T and H axes."
            )
        if H > 1 and D > 1 and _same(got, x.reshape(B, T, D, H).permute(0, 3, 1, 2)):
            raise Mismatch(
                f"{what}: your heads take every H-th column (interleaved). Head h must get the contiguous "
                f"columns h*D .. (h+1)*D - 1 of the width, here D = {D}."
            )
        if T == D and T > 1 and _same(got, _heads(x, H).transpose(-2, -1)):
            raise Mismatch(f"{what}: your last two axes are (D, T): each head must be a (T, D) matrix, one row "
                           "per token")
        _keeps_float64(got, _heads(x, H), what, "A split")
        expect_close(got, _heads(x, H), what=what)
    x = randn(2, 3, 8, generator=rng(64))
    _elsewhere(split_heads, (x, 4), "split_heads(x, num_heads=4) for x of shape (2, 3, 8)", (_heads(x, 4),))
    x = randn(2, 3, 8, generator=rng(61))
    expect_gradients(split_heads, (x, 4), _heads, what="split_heads(x, num_heads=4) for x of shape (2, 3, 8)",
                     names=("x", "num_heads"))
    return "head h of token t holds columns h*D .. (h+1)*D - 1 of token t, for every size and number of heads tried."


@exercise(
    "Exercise 1b, merge the heads back",
    hint="undo the split in the reverse order: bring the token axis back in front of the head axis first, then "
         "glue each token's heads into one width (the swapped tensor is not contiguous, so reshape rather than "
         "view); read every size from the context itself",
)
def check_merge_heads(merge_heads) -> str:
    generator = rng(52)
    for B, T, E, H, dtype in _split_cases():
        D = E // H
        context = randn(B, H, T, D, generator=generator, dtype=dtype)
        what = f"merge_heads(context) for context of shape (B, H, T, D) = {(B, H, T, D)}, {dtype}"
        got = expect_tensor(call(merge_heads, context), what=what, shape=(B, T, E), dtype="float")
        if H > 1 and T > 1 and _same(got, context.reshape(B, T, E)):
            raise Mismatch(
                f"{what}: you reshaped to (B, T, H*D) without moving the head axis first. The shape is right, "
                "but each row now mixes different tokens of one head. Transpose (B, H, T, D) to (B, T, H, D) first."
            )
        if H > 1 and D > 1 and _same(got, context.permute(0, 2, 3, 1).reshape(B, T, E)):
            raise Mismatch(f"{what}: your heads come out interleaved (column j from head j % H): put head h's D "
                           "numbers side by side, in columns h*D .. (h+1)*D - 1, by moving only the head axis")
        _keeps_float64(got, context.transpose(1, 2).reshape(B, T, E), what, "A merge")
        expect_close(got, context.transpose(1, 2).reshape(B, T, E), what=what)
        x = randn(B, T, E, generator=generator, dtype=dtype)
        round_trip = call(merge_heads, _heads(x, H))
        expect_close(round_trip, x, what=f"merge_heads of x of shape {(B, T, E)} split into {H} heads, which should "
                                         "give x back")
    context = randn(2, 4, 3, 2, generator=rng(65))
    _elsewhere(merge_heads, (context,), "merge_heads(context) for context of shape (2, 4, 3, 2)",
               (context.transpose(1, 2).reshape(2, 3, 8),))
    context = randn(2, 4, 3, 2, generator=rng(62))
    expect_gradients(merge_heads, (context,), lambda c: c.transpose(1, 2).reshape(2, 3, 8),
                     what="merge_heads(context) for context of shape (2, 4, 3, 2)", names=("context",))
    return "merging is the exact inverse of splitting: merge_heads(split_heads(x)) == x, at every size tried."


def _three(result, what: str, B: int):
    """q, k, v from a tuple or list of three tensors, or from one tensor stacked on a new first axis of 3."""
    if isinstance(result, torch.Tensor):
        if result.dim() == 5 and result.size(0) == 3 and result.size(1) == B:
            return tuple(result.unbind(0))
        if result.dim() == 5 and result.size(1) == 3 and result.size(0) == B:
            raise Mismatch(f"{what}: you stacked q, k and v on axis 1, giving (B, 3, H, T, D): return the three "
                           "tensors, or stack them on a new first axis")
        raise Mismatch(f"{what}: expected three tensors (q, k, v), got one Tensor of shape {tuple(result.shape)}")
    return expect_sequence(result, what=what, names=("q", "k", "v"))


@exercise(
    "Exercise 2, split a fused query-key-value projection",
    hint="the last axis of qkv holds all the queries, then all the keys, then all the values, E numbers each "
         "(E is a third of that axis): cut it into those three blocks first, then split each block into heads "
         "as in Exercise 1",
)
def check_split_fused_qkv(split_fused_qkv) -> str:
    generator = rng(55)
    for B, T, E, H, dtype in _split_cases():
        D = E // H
        qkv = randn(B, T, 3 * E, generator=generator, dtype=dtype)
        what = f"split_fused_qkv(qkv, num_heads={H}) for qkv of shape (B, T, 3E) = {(B, T, 3 * E)}, {dtype}"
        result = call(split_fused_qkv, qkv, H)
        got = _three(result, what, B)
        for name, tensor in zip("qkv", got):
            expect_tensor(tensor, what=f"{what}, {name}", shape=(B, H, T, D), dtype="float")
        thirds = [part.contiguous() for part in qkv.split(E, dim=-1)]  # the right layout: [queries | keys | values]
        want = [_heads(part, H) for part in thirds]
        for name, g, w in zip("qkv", got, want):
            _keeps_float64(g, w, f"{what}, {name}", "Splitting")
        if all(_same(g, w) for g, w in zip(got, want)):
            continue
        if (isinstance(result, torch.Tensor) and result.dim() == 5 and result.size(1) == 3
                and all(_same(g, w) for g, w in zip(result.unbind(1), want))):
            raise Mismatch(f"{what}: you stacked q, k and v on axis 1, giving (B, 3, H, T, D) (here B = 3 too, so it "
                           "read as (3, B, H, T, D)): return the three tensors, or stack them on a new first axis")
        found = [next((j for j, w in enumerate(want) if _same(g, w)), None) for g in got]
        if sorted(j for j in found if j is not None) == [0, 1, 2]:
            order = ", ".join("qkv"[j] for j in found)
            raise Mismatch(f"{what}: you return the right three tensors in the wrong order ({order}). "
                           "The fused projection puts the queries first, then the keys, then the values.")
        per_head = qkv.view(B, T, H, 3 * D).transpose(1, 2).split(D, dim=-1)  # [q_h | k_h | v_h] per head
        if H > 1 and all(_same(g, w) for g, w in zip(got, per_head)):
            raise Mismatch(
                f"{what}: you read the last axis as H blocks of [q_h | k_h | v_h] (each head's query, key and "
                "value side by side, the layout of some other codebases). Here, as in nn.MultiheadAttention's "
                "in_proj_weight and GPT-2's c_attn, it is [all queries | all keys | all values]: split it into "
                "three blocks of E first, then split each into heads."
            )
        if H > 1 and T > 1 and all(_same(g, part.reshape(B, H, T, D)) for g, part in zip(got, thirds)):
            raise Mismatch(
                f"{what}: you split q, k and v right, then viewed each as (B, H, T, D) directly: the right shape "
                "with pieces of different tokens in one head. View as (B, T, H, D) first, then transpose."
            )
        if H > 1 and D > 1 and all(_same(g, part.reshape(B, T, D, H).permute(0, 3, 1, 2)) for g, part in zip(got, thirds)):
            raise Mismatch(f"{what}: your heads take every H-th column (interleaved); head h must get the "
                           f"contiguous columns h*D .. (h+1)*D - 1 of its block, here D = {D}.")
        for name, g, w in zip("qkv", got, want):
            expect_close(g, w, what=f"{what}, {name}")
    stacked = isinstance(result, torch.Tensor)  # one (3, B, H, T, D) tensor: the reference gives one too
    qkv = randn(2, 3, 24, generator=rng(66))
    what = "split_fused_qkv(qkv, num_heads=4) for qkv of shape (2, 3, 24)"
    _elsewhere(split_fused_qkv, (qkv, 4), what, [_heads(part, 4) for part in qkv.split(8, dim=-1)],
               parts=lambda result: _three(result, what, 2))

    def reference(qkv, num_heads):
        parts = tuple(_heads(part, num_heads) for part in qkv.split(qkv.size(-1) // 3, dim=-1))
        return torch.stack(parts) if stacked else parts

    expect_gradients(split_fused_qkv, (randn(2, 3, 24, generator=rng(63)), 4), reference,
                     what="split_fused_qkv(qkv, num_heads=4) for qkv of shape (2, 3, 24)", names=("qkv", "num_heads"))
    return ("q, k and v each come out as (B, H, T, D), from the [queries | keys | values] layout of "
            "nn.MultiheadAttention's in_proj_weight and GPT-2's c_attn, at every size tried.")


_LAYERS = (MultiHeadAttention.__init__, nn.Linear.__init__, nn.MultiheadAttention.__init__)  # building them counts for you


def _parameter_count(embed_dim: int, num_heads: int, bias: bool, qk_head_dim: int | None = None) -> int:
    module = MultiHeadAttention(embed_dim, num_heads, bias=bias, qk_head_dim=qk_head_dim)
    return sum(p.numel() for p in module.parameters())


def _count(E: int, H: int, bias: bool, qk: int, v: int, out: int) -> int:
    """Parameters of projections to widths qk (query and key), v (value) and of an output projection
    from width out: a helper for naming wrong answers."""
    weights = E * qk * 2 + E * v + out * E
    return weights + ((2 * qk + v + E) if bias else 0)


@exercise(
    "Exercise 3, count the parameters when d_k differs",
    hint="count each projection's weight (its inputs times its outputs) and, with bias=True, one bias per output; "
         "the query and key projections have num_heads * qk_head_dim outputs each, the value and output projections "
         "E; qk_head_dim=None means the default head width",
)
def check_count_parameters(count_parameters) -> str:
    cases = [(768, 12, True, None), (768, 12, False, None), (512, 8, False, 16), (512, 8, True, 32),
             (64, 1, True, None), (64, 16, False, None), (32, 4, True, 2), (12, 3, True, 8), (6, 3, True, None),
             (24, 6, False, 1), (10, 5, True, 3), (15, 5, True, None)]   # the last: an odd default head width, 3
    for E, H, bias, qk_head_dim in cases:
        call_text = f"count_parameters(embed_dim={E}, num_heads={H}, bias={bias}, qk_head_dim={qk_head_dim})"
        with forbidden(*_LAYERS, reason="the exercise asks for a formula: count the weights and biases without building "
                                        "the layers"):
            got = expect_int(call(count_parameters, E, H, bias, qk_head_dim), what=call_text)
        want = _parameter_count(E, H, bias, qk_head_dim)
        if got == want:
            continue
        dk = E // H if qk_head_dim is None else qk_head_dim
        # a default head width off by one (E / H rounded up or down the wrong way), seen only when E / H is odd
        off_by_one = ({_count(E, H, bias, H * d, E, E): d for d in (dk - 1, dk + 1) if d > 0}
                      if qk_head_dim is None else {})
        message = f"{call_text}: expected {want:,}, got {got:,}."
        if qk_head_dim is not None and got == _parameter_count(E, H, bias):
            message += (" You left qk_head_dim out: with it the query and key projections become (E, H * qk_head_dim),"
                        " smaller or larger than (E, E).")
        elif got == _count(E, H, bias, H * dk, H * dk, H * dk):
            message += (" You narrowed the values and the output projection too; only queries and keys take "
                        "qk_head_dim. The values keep width D = E / H (the paper's d_v), so the output is still E wide.")
        elif got == _count(E, H, bias, H * dk, H * dk, E):
            message += " You narrowed the values too; only queries and keys take qk_head_dim (d_v stays E / H)."
        elif H > 1 and got == _count(E, H, bias, dk, E, E):
            message += (" qk_head_dim is the width of one head's queries and keys: the projection is "
                        "(E, num_heads * qk_head_dim), not (E, qk_head_dim).")
        elif got == _count(E, H, bias, H * dk, E, E) - (E * E + (E if bias else 0)):
            message += " You counted the query, key and value projections but not the output projection."
        elif H > 1 and got == H * want:
            message += " The count does not grow with the number of heads: the H heads share out the width."
        elif bias and got == _parameter_count(E, H, False, qk_head_dim):
            message += " You left out the four bias vectors."
        elif bias and got == want - E:
            message += (" You left out the output projection's bias (E entries): with bias=True each of the four "
                        "projections has one bias per output.")
        elif not bias and got == _parameter_count(E, H, True, qk_head_dim):
            message += " With bias=False the projections have no biases: count only the weights."
        elif bias and qk_head_dim is not None and got == _count(E, H, False, H * dk, E, E) + 4 * E:
            message += " The query and key biases have H * qk_head_dim entries each, not E."
        elif got in off_by_one:
            message += (f" With qk_head_dim=None the queries and keys take the default head width E // num_heads = {dk}; "
                        f"your count fits a width of {off_by_one[got]}.")
        raise Mismatch(message)
    return "your count matches the module's parameters at every size tried, with and without biases and narrower keys."


def _module(E: int, H: int, generator: torch.Generator, *, dtype=torch.float32, device=None) -> MultiHeadAttention:
    """An ac.MultiHeadAttention whose weights come from ``generator`` (biases included, so that they count)."""
    mha = MultiHeadAttention(E, H).eval()
    with torch.no_grad():
        for parameter in mha.parameters():
            parameter.copy_(randn(*parameter.shape, generator=generator, scale=0.5))
    return mha.to(dtype=dtype, device=device)


def _by_hand(mha, queries, memory, blocked, *, scale=None, after_softmax=False, fill=float("-inf"),
             renormalise=False):
    """Cross-attention written out, with the mistakes the diagnoses need; blocked is (B, S), True = padding.
    A query whose memory is all padding gets NaN here with ``fill=-inf`` (the diagnoses compare only
    where that matters) and the uniform average of the padding with a finite ``fill``."""
    B, L, E = queries.shape
    S, H, D = memory.size(1), mha.num_heads, mha.head_dim
    q = mha.q_proj(queries).view(B, L, H, D).transpose(1, 2)  # (B, H, L, D)
    k = mha.k_proj(memory).view(B, S, H, D).transpose(1, 2)  # (B, H, S, D)
    v = mha.v_proj(memory).view(B, S, H, D).transpose(1, 2)  # (B, H, S, D)
    scores = q @ k.transpose(-2, -1) / math.sqrt(D if scale is None else scale)  # (B, H, L, S)
    where = None if blocked is None else blocked[:, None, None, :]  # (B, 1, 1, S): along the keys
    if where is not None and not after_softmax:
        scores = scores.masked_fill(where, fill)
    weights = torch.softmax(scores, dim=-1)  # (B, H, L, S)
    if where is not None and after_softmax:
        weights = weights.masked_fill(where, 0.0)
        if renormalise:
            weights = weights / weights.sum(-1, keepdim=True).clamp_min(1e-30)
    context = (weights @ v).transpose(1, 2).reshape(B, L, E)  # (B, H, L, D) -> (B, L, E)
    return mha.out_proj(context)  # (B, L, E)


def _largest_score(mha, queries, memory) -> float:
    """The largest scaled score of any head: above 88.7, exp overflows in float32."""
    B, L, E = queries.shape
    H, D = mha.num_heads, mha.head_dim
    with torch.no_grad():
        q = mha.q_proj(queries).view(B, L, H, D).transpose(1, 2)  # (B, H, L, D)
        k = mha.k_proj(memory).view(B, -1, H, D).transpose(1, 2)  # (B, H, S, D)
        return float((q @ k.transpose(-2, -1) / math.sqrt(D)).max())


_FAR_BELOW = "real scores far below any finite fill"


def _real_score_range(mha, queries, memory, blocked) -> tuple[float, float]:
    """The smallest and largest scaled score of the keys that are not padding, over every head."""
    B, L, E = queries.shape
    H, D = mha.num_heads, mha.head_dim
    with torch.no_grad():
        q = mha.q_proj(queries).view(B, L, H, D).transpose(1, 2)  # (B, H, L, D)
        k = mha.k_proj(memory).view(B, -1, H, D).transpose(1, 2)  # (B, H, S, D)
        scores = q @ k.transpose(-2, -1) / math.sqrt(D)  # (B, H, L, S)
        real = scores[(~blocked)[:, None, None, :].expand_as(scores)]
        return float(real.min()), float(real.max())


def _far_below_cases():
    """A padded batch whose real keys all score exactly -180000: the query and key projections have zero weights
    and biases -300 and +300 (every query points away from every key; heads of width 4, so the scores
    -300 * 300 * 4 / 2 are exact in float32 whatever the order of the operations, and every real key gets the same
    weight). Every fixed finite fill above that (-100, -1e4, float16's smallest number -65504) gives the padding
    all the weight, and every one below -65504 does not exist in float16 (named in the float16 case): only
    float('-inf') and the smallest number of the scores' own dtype (torch.finfo(dtype).min) pass both. Its own
    generator, so the other cases keep their numbers."""
    generator = rng(57)
    mha = _module(8, 2, generator)
    with torch.no_grad():
        for projection, bias in ((mha.q_proj, -300.0), (mha.k_proj, 300.0)):
            projection.weight.zero_()
            projection.bias.fill_(bias)
    queries, memory = randn(2, 3, 8, generator=generator), randn(2, 6, 8, generator=generator)
    mask = padding_mask_for([6, 4], 6, side="left", convention="blocked")  # not [6, 3]: with every real score
    # equal, attending to the 3 padded keys of [6, 3] gives what the mask read as right padding gives
    low, high = _real_score_range(mha, queries, memory, mask)
    return (f"{_FAR_BELOW} (every real key scores {high:.0f}), B=2, L=3, S=6, E=8, 2 heads, left padding "
            "(lengths [6, 4])"), mha, queries, memory, mask


def _cross_cases(generator: torch.Generator):
    """(description, mha, queries, memory, key_padding_mask): unlike the notebook's (E = 12, 3 heads); a
    memory that is all padding, scores far above 88 (where exp overflows in float32), float64 and float16.
    The case on another device is run apart, by :func:`_check_elsewhere`."""
    mha = _module(24, 6, generator)
    queries, memory = randn(3, 4, 24, generator=generator), randn(3, 7, 24, generator=generator)
    for padding, mask in padding_cases(batch_size=3, max_len=7, convention="blocked", empty_row=True):
        yield f"B=3, L=4, S=7, E=24, 6 heads, {padding}", mha, queries, memory, mask
    for n, size in enumerate(other_sizes()):
        mha = _module(size.E, size.H, generator)
        queries = randn(size.B, size.L, size.E, generator=generator)
        memory = randn(size.B, size.S, size.E, generator=generator)
        lengths = [max(1, size.S - b) for b in range(size.B)]  # the first sequence full, the others padded
        side = "left" if n % 2 else "right"
        mask = padding_mask_for(lengths, size.S, side=side, convention="blocked")
        yield f"{size}, {side} padding (lengths {lengths})", mha, queries, memory, mask
    mask = padding_mask_for([6, 4], 6, side="left", convention="blocked")
    mha = _module(16, 2, generator)
    queries, memory = randn(2, 3, 16, generator=generator, scale=8.0), randn(2, 6, 16, generator=generator, scale=8.0)
    yield (f"large scores (up to {_largest_score(mha, queries, memory):.0f}), B=2, L=3, S=6, E=16, 2 heads, "
           "left padding (lengths [6, 4])"), mha, queries, memory, mask
    yield _far_below_cases()
    mask = padding_mask_for([5, 2], 5, side="right", convention="blocked")
    for dtype in (torch.float64, torch.float16):
        mha = _module(8, 2, generator, dtype=dtype)
        queries, memory = randn(2, 3, 8, generator=generator, dtype=dtype), randn(2, 5, 8, generator=generator,
                                                                                   dtype=dtype)
        yield f"{dtype} inputs and module, B=2, L=3, S=5, E=8, 2 heads, right padding (lengths [5, 2])", \
            mha, queries, memory, mask


def _cross_expected(mha, queries, memory, key_padding_mask) -> torch.Tensor:
    """ac.MultiHeadAttention's output; for float16, that of its float32 copy on the same inputs (the exact
    answer, which a float16 computation approaches within float16's rounding)."""
    with torch.no_grad():
        if queries.dtype == torch.float16:
            exact = copy.deepcopy(mha).float()
            return exact(queries.float(), memory.float(), memory.float(), key_padding_mask=key_padding_mask)[0]
        return mha(queries, memory, memory, key_padding_mask=key_padding_mask)[0]


def _check_gradients(cross_attention) -> None:
    """One case with autograd on (no memory all padding, where the softmax's gradient is NaN for the reference
    too): a gradient must reach the queries, the memory and every parameter of ``mha``, as it does through
    ac.MultiHeadAttention, and ``backward()`` must run. Names an answer under ``torch.no_grad()``, a
    ``.detach()`` (of the result, or of k or v), and an in-place write into the softmax's output
    (``weights.masked_fill_``, ``weights[empty] = 0``), which autograd saved for the backward pass."""
    generator = rng(58)
    mha = _module(8, 2, generator)
    queries, memory = randn(2, 3, 8, generator=generator), randn(2, 5, 8, generator=generator)
    mask = padding_mask_for([5, 3], 5, side="left", convention="blocked")
    expect_gradients(cross_attention, (queries, memory, mha, mask),
                     lambda q, m, module, blocked: module(q, m, m, key_padding_mask=blocked)[0],
                     what="cross_attention(queries, memory, mha, key_padding_mask) for B=2, L=3, S=5, E=8, 2 heads, "
                          "left padding (lengths [5, 3])",
                     names=("queries", "memory", "mha", "key_padding_mask"))


def _check_elsewhere(cross_attention, generator: torch.Generator) -> bool:
    """One case with the module, the inputs and the mask on :func:`other_device` (the accelerator, else the meta
    device, whose tensors have shapes but no values): a tensor made without ``device=`` (a mask or a fill built
    on the CPU) is named. On an accelerator the values are compared too; on meta an answer that needs values
    (``bool(...)`` of a tensor) cannot run there: then the case runs on the CPU under the shared DeviceWatch, which
    names a tensor made without ``device=`` that meets the inputs. Returns False on that path (the device itself
    was not tried), else True."""
    device = other_device()
    mha = _module(8, 2, generator)
    queries, memory = randn(3, 3, 8, generator=generator), randn(3, 5, 8, generator=generator)
    mask = padding_mask_for([5, 2, 0], 5, side="right", convention="blocked")
    what = (f"cross_attention(queries, memory, mha, key_padding_mask) with the inputs, the module and the mask on "
            f"the {device.type} device, B=3, L=3, S=5, E=8, 2 heads, right padding (lengths [5, 2, 0])")
    expected = _cross_expected(mha, queries, memory, mask)
    here = (queries, memory, copy.deepcopy(mha), mask)  # CPU copies, for the watch below
    mha, queries, memory, mask = mha.to(device), queries.to(device), memory.to(device), mask.to(device)
    got = call_elsewhere(cross_attention, queries, memory, mha, mask, device=device, what=what,
                         made_by="torch.full, torch.zeros, torch.tensor ...", cpu_args=here)
    if got is None and device.type == "meta":  # run on the CPU under the shared DeviceWatch instead
        return False
    got = expect_on_device(got, device, what, dtype="float")
    expect(tuple(got.shape) == (3, 3, 8), f"{what}: expected shape (3, 3, 8), got {tuple(got.shape)}")
    if device.type != "meta":
        expect_close(got.detach().cpu(), expected, what=what)
    return True


@exercise(
    "Exercise 4, cross-attention with padding",
    hint="project the queries with q_proj and the memory with k_proj and v_proj, split each into heads, scale "
         "the scores by the square root of one head's width, give the padded keys minus infinity before the "
         "softmax (the mask is True at the padding, and the keys are the last axis of the scores), give the "
         "queries of a sequence whose memory is all padding zero weights instead of the softmax's NaN, then merge "
         "the heads and apply out_proj",
    forbid=("sdpa", _weights_and_context, online_softmax),
)
def check_cross_attention(cross_attention) -> str:
    generator = rng(54)
    for description, mha, queries, memory, key_padding_mask in _cross_cases(generator):
        B, L, E = queries.shape
        S, H = memory.size(1), mha.num_heads
        what = f"cross_attention(queries, memory, mha, key_padding_mask) for {description}"
        try:
            got = call(cross_attention, queries, memory, mha, key_padding_mask)
        except _StudentCodeFailed as failed:
            if queries.dtype == torch.float16 and "overflow" in str(failed.error):
                raise Mismatch(f"{what}: your code raised {type(failed.error).__name__} in float16: a fill value such "
                               "as -1e9 does not exist in float16 (largest magnitude 65504): fill the padded keys' "
                               "scores with float('-inf'), or with the smallest number of the scores' own dtype") \
                    from None
            text = str(failed.error)
            if queries.dtype == torch.float16 and "half" in text.lower() and "float" in text.lower():
                raise Mismatch(f"{what}: your code raised {type(failed.error).__name__}: {text.splitlines()[0]}. A "
                               "tensor made without dtype= is float32 whatever the inputs (torch.where(mask, "
                               "float('-inf'), 0.0), torch.zeros(...), ac.blocked_to_additive(mask) with its default "
                               "dtype): added to the float16 scores it promotes them to float32, and the float32 "
                               "weights then meet the float16 values. Make the mask in the scores' dtype "
                               "(dtype=scores.dtype), or block the scores with masked_fill") from None
            raise
        if isinstance(got, (tuple, list)) and len(got) == 2 and isinstance(got[0], torch.Tensor):
            raise Mismatch(f"{what}: return only the output (B, L, E), not a pair")
        got = expect_tensor(got, what=what, shape=(B, L, E), dtype="float")
        if not bool(key_padding_mask.any()) and bool(torch.isnan(got).any()):
            raise Mismatch(f"{what}: with no padding at all your output is NaN, so every key was blocked: you read "
                           "key_padding_mask as True = may attend. It is True at the padding: block where it is True")
        if L == S and bool(key_padding_mask.any()) and torch.equal(torch.isnan(got).any(-1).cpu(),
                                                                   key_padding_mask.cpu()):
            raise Mismatch(f"{what}: the rows of the padded positions came out NaN: you masked the padded *queries* "
                           "(the rows of the scores); the mask is along the keys, the last axis")
        expected = _cross_expected(mha, queries, memory, key_padding_mask)
        empty = key_padding_mask.all(-1).cpu()  # (B,): sequences whose memory is all padding
        not_finite = (~torch.isfinite(got.detach())).any(-1).any(-1).cpu()  # (B,)
        if bool(not_finite.any()):
            if bool(empty.any()) and torch.equal(not_finite, empty):
                which = ", ".join(str(b) for b in empty.nonzero().flatten().tolist())
                raise Mismatch(
                    f"{what}: the memory of sequence {which} is all padding, and your output is NaN there: every score "
                    "of those rows is minus infinity, and the softmax divides 0 by 0. A query with nothing to attend "
                    "to gets zero weights, hence zero context, so its output is out_proj's bias (as in "
                    "ac.MultiHeadAttention): set those rows' weights to zero")
            if description.startswith("large scores"):
                raise Mismatch(
                    f"{what}: your output has NaN or infinite values where the scores are large: exp of a score "
                    "above 88.7 overflows float32 to inf, and inf / inf is NaN. Subtract each row's maximum before "
                    "exponentiating (torch.softmax does it for you)")
        with torch.no_grad():
            padded = bool(key_padding_mask.any())
            wrong = {}
            if bool(empty.any()):
                smallest = torch.finfo(queries.dtype).min
                wrong["the queries of a sequence whose memory is all padding averaged the padding's values (a fill with a "
                      "finite number gives such a row equal scores, hence equal weights). They must get zero weights, "
                      "hence zero context: their output is out_proj's bias"] = \
                    _by_hand(mha, queries, memory, key_padding_mask, fill=smallest)
            if padded:
                wrong["the padding mask had no effect: the queries still attend to the padding keys"] = \
                    _by_hand(mha, queries, memory, None)
                wrong["you attended only to the padding. key_padding_mask is True at the padding (nn.MultiheadAttention's "
                      "convention): block where it is True"] = _by_hand(mha, queries, memory, ~key_padding_mask)
                wrong["you took the softmax over all the keys, zeroed the padding's weights and renormalised: where the "
                      "padding's scores are far above the real keys', the real keys' weights underflow to 0 in the "
                      "softmax, and no renormalising brings them back. Block the scores before the softmax"] = \
                    _by_hand(mha, queries, memory, key_padding_mask, after_softmax=True, renormalise=True)
                wrong["you zeroed the padding's weights after the softmax, so each row no longer sums to one: block "
                      "the scores before the softmax"] = _by_hand(mha, queries, memory, key_padding_mask,
                                                                   after_softmax=True)
                if "left padding" in description:
                    lengths = (~key_padding_mask).sum(-1).tolist()
                    as_right = padding_mask_for(lengths, S, side="right", convention="blocked",
                                                device=key_padding_mask.device)
                    wrong["your mask blocks the last keys of each sequence, as if it were padded on the right; this "
                          "batch is padded on the left: use key_padding_mask itself"] = \
                        _by_hand(mha, queries, memory, as_right)
            if description.startswith(_FAR_BELOW):
                wrong["the padding keys took the weight: the real keys' scores here (-180000) lie far below your fill "
                      "value, so a fixed finite fill (-100, -1e4, even float16's smallest number -65504) does not "
                      "block the padding: scores can be any number, and a fixed fill below -65504 does not exist in "
                      "float16. Fill the padded keys' scores with float('-inf'), or with "
                      "torch.finfo(scores.dtype).min, the smallest number of the scores' own dtype"] = \
                    _by_hand(mha, queries, memory, key_padding_mask, fill=-100.0)
            if H < E:
                wrong[f"you divided the scores by sqrt(E) = {math.sqrt(E):.2f}; each head's dot product runs over its "
                      f"own width D = {E // H}, so divide by sqrt(D) = {math.sqrt(E // H):.2f}"] = \
                    _by_hand(mha, queries, memory, key_padding_mask, scale=E)
            if mha.out_proj.bias is not None:
                wrong["you multiplied by out_proj's weight but left out its bias: apply the whole out_proj layer"] = \
                    _by_hand(mha, queries, memory, key_padding_mask) - mha.out_proj.bias
            if E // H > 1:
                wrong["you did not scale the scores: divide them by sqrt(D), the square root of one head's width"] = \
                    _by_hand(mha, queries, memory, key_padding_mask, scale=1)
        if not _same(got, expected):
            for mistake, answer in wrong.items():
                if _same(got, answer):
                    raise Mismatch(f"{what}: {mistake}")
        # float16: the output is compared with the exact (float32) answer. float16's rounding of the projections,
        # scores and context adds up to 1.4e-3 here (outputs up to 6), within 3e-4 of float16's default tolerance
        # (1e-3 + 1e-3 |x|): a right answer that rounds in another order must not fail. The mistakes are named
        # at full precision in the other cases.
        # float64: judged at float32's tolerance, whatever the result's dtype. The course's dtype rule lets an
        # answer computed wholly in float32 pass (a float32 result of float64 inputs); one that runs only a step
        # in float32 (the common softmax in float32) and returns float64 is no less precise, so it passes too.
        if queries.dtype == torch.float16:
            tolerances = {"atol": 1e-2, "rtol": 1e-2}
        elif queries.dtype == torch.float64:
            atol, rtol = tolerance(torch.float32)
            tolerances = {"atol": atol, "rtol": rtol}
        else:
            tolerances = {}
        expect_close(got, expected, what=what, **tolerances)
    _check_gradients(cross_attention)
    matches = ("your cross-attention matches ac.MultiHeadAttention(queries, memory, memory, key_padding_mask=...) "
               "with right and left padding, a memory that is all padding, large scores, float64 and float16, at "
               "every size tried")
    if not _check_elsewhere(cross_attention, generator):
        # The meta device could not run the answer: say what was checked instead, never "keeps to the device".
        return (f"{matches}. Your code reads a tensor's value (an if or bool() on a tensor), so it could not run on "
                "the meta device that stands in for a GPU here; on the CPU, no tensor it made without device= met "
                "the inputs, but it has not run on a GPU.")
    return f"{matches}, and it keeps to the inputs' device."
