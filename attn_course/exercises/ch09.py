"""Checks for the exercises of chapter 09, rotary embeddings and ALiBi.

Each check tries the answer on cases chosen so that the usual mistakes give a wrong result, and names
the mistake when it recognises one; the table of those mistakes is in tests/test_exercises_ch09.py.
They use the shared mechanism of ``attn_course.exercises``: the package forbidden where the exercise
asks for plain torch (``forbid=("attn_course",)``), inputs watched for changes in place, sizes unlike
the notebook's (one pair, an odd number of pairs, a single position, heads as a leading axis, one head,
head counts up to BLOOM's 112), float32 as well as float64 (exercise 1 also bfloat16 and float16 inputs,
whose angles must still be computed in float32 or float64), and slopes given as a list, a numpy array
or a tensor. Exercises 1 and 4 try one case more on another device (:func:`attn_course.exercises.other_device`:
the accelerator, else PyTorch's meta device), so that a tensor made without ``device=`` is named, and so is
data copied out to the CPU (``.cpu()``, ``.tolist()``, ``.item()``, ``float(t)``: the statements ask for neither),
which on the meta device is how an answer that computes on the CPU and returns a CPU tensor shows (an answer that
reads a value, which meta cannot run, is run on the CPU under the shared mechanism's watch); exercise 3
demands the input's dtype and exactly the permuted rows. Exercise 4 measures the share of attention that goes far, for whole sequences and for cached
steps (the queries at the last L positions). The module's own reference helpers are forbidden too
(``_PRIVATE``): an answer that calls them has not done the exercise.
"""

from __future__ import annotations

import math

import torch

from ..alibi import alibi_slopes
from ..rotary import apply_rotary_embedding
from . import (Mismatch, call, call_elsewhere, exercise, expect_close, expect_on_device, expect_tensor, other_device,
               randn, rng)

__all__ = ["check_rotate_half_rope", "check_alibi_slopes", "check_interleaved_to_halves", "check_far_share"]


def _close(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-6, rtol: float = 1e-5) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a.detach().double().cpu(), b.detach().double().cpu(),
                                                      atol=atol, rtol=rtol))


def _halves(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate pair (i, i + D/2) of x (..., T, D) by angles (T, D/2), in float64."""
    half = x.size(-1) // 2
    first, second = x[..., :half].double(), x[..., half:].double()
    cos, sin = angles.cos(), angles.sin()
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


def _power_of_two_slopes(n: int) -> torch.Tensor:
    return torch.tensor([2.0 ** (-8.0 * k / n) for k in range(1, n + 1)], dtype=torch.float64)


def _per_head_scores(weight_q, weight_k, x, num_heads, interleaved):
    D = weight_q.size(0) // num_heads
    q = (x @ weight_q.T).view(x.size(0), num_heads, D).transpose(0, 1)  # (T, H*D) -> (H, T, D)
    k = (x @ weight_k.T).view(x.size(0), num_heads, D).transpose(0, 1)
    q = apply_rotary_embedding(q, interleaved=interleaved)
    k = apply_rotary_embedding(k, interleaved=interleaved)
    return q @ k.transpose(-2, -1)  # (H, T, T)


def _far_share(weights: torch.Tensor, first_query: int, far: int) -> torch.Tensor:
    """Per head, the share of the attention that queries at positions >= first_query give to keys at least
    ``far`` positions back; weights (B, H, L, S), the L queries at the last L positions of the S keys."""
    L, S = weights.shape[-2:]
    query_pos = torch.arange(S - L, S)[:, None]  # (L, 1): bottom-right aligned
    is_far = (query_pos - torch.arange(S)[None, :]) >= far  # (L, S)
    rows = query_pos[:, 0] >= first_query  # (L,)
    w = weights.detach().double().cpu()
    return (w * is_far).sum(dim=-1)[:, :, rows].mean(dim=(0, 2))  # (B, H, L) -> (H,)


def _call_elsewhere(fn, *args, device: torch.device, what: str, cpu_args: tuple):
    """:func:`call_elsewhere`, with data copied out of the inputs (``.cpu()``, ``.numpy()``, ``.tolist()``,
    ``.item()``) named as what it is here: the statements of exercises 1 and 4 ask for the work on the inputs'
    device. On the meta device this is how an answer that computes on the CPU and returns a CPU tensor shows (on a
    GPU, :func:`expect_on_device` names its result). A value read on the host (``.item()``, ``float(t)``,
    ``int(t)``, an ``if`` on a tensor, ``.tolist()``) is named on every device (``reading_values_is_a_mistake``):
    the meta device cannot run such an answer, so it runs on ``cpu_args`` (the same arguments on the CPU) under
    the shared mechanism's watch, which also names a tensor made without ``device=``. Selecting rows with a boolean
    mask reads no value on the host (the meta device cannot run it either): it passes."""
    try:
        return call_elsewhere(fn, *args, device=device, what=what, cpu_args=cpu_args,
                              reading_values_is_a_mistake=True)
    except Mismatch as mismatch:
        if "copy out" not in str(mismatch).lower():
            raise
        note = (" (the meta device stands for a GPU here: its tensors have no values, so copying them out fails)"
                if device.type == "meta" else "")
        raise Mismatch(f"{what}: your code copies data out of the inputs to the CPU (.cpu(), .numpy(), .tolist(), "
                       f".item() or float(...)){note}. Computed there, a result comes back on the CPU, not on the "
                       "inputs' device, and on a GPU every copy waits for the device. Keep the work on the inputs' "
                       "device: make new tensors there (device= from an input) and return the result there") from None


def _rope_mistakes(got: torch.Tensor, x: torch.Tensor, positions: torch.Tensor, base: float, what: str) -> None:
    """Name the mistake when ``got`` is a plausible wrong rotation of ``x``."""
    D = x.size(-1)
    p = positions.double()
    two_i = torch.arange(0, D, 2, dtype=torch.float64)  # 2i for i = 0 .. D/2 - 1
    if _close(got, apply_rotary_embedding(x, positions, base=base, interleaved=True)):
        raise Mismatch(f"{what}: you rotated neighbouring pairs (0, 1), (2, 3), ...: that is the interleaved layout "
                       "of the paper. The half layout pairs coordinate i with i + D/2.")
    if _close(got, apply_rotary_embedding(x, -positions, base=base, interleaved=False)):
        raise Mismatch(f"{what}: you rotate the wrong way (the sign of the sines is flipped)")
    theta = base ** (-two_i / D)
    swapped = x[..., : D // 2].double(), x[..., D // 2:].double()
    angles = p[:, None] * theta
    cos, sin = angles.cos(), angles.sin()
    if _close(got, torch.cat([swapped[0] * sin - swapped[1] * cos, swapped[0] * cos + swapped[1] * sin], dim=-1)):
        raise Mismatch(f"{what}: you swapped the cosines and the sines: position 0 must leave a vector unchanged "
                       "(cos 0 = 1 on the coordinate itself, sin 0 = 0 on its partner)")
    for shift in (1, -1):
        if _close(got, apply_rotary_embedding(x, positions + shift, base=base, interleaved=False)):
            raise Mismatch(f"{what}: your positions are off by one (you rotated by positions {shift:+d}); rotate each "
                           "vector by its position as given, so that position 0 is not rotated")
    if base != 10000.0 and _close(got, apply_rotary_embedding(x, positions, interleaved=False)):
        raise Mismatch(f"{what}: you ignore the base argument and use 10000; the frequencies are base ** (-2i / D)")
    if not torch.equal(positions, torch.arange(positions.numel())) and \
            _close(got, apply_rotary_embedding(x, torch.arange(x.size(-2)), base=base, interleaved=False)):
        raise Mismatch(f"{what}: you ignore the positions argument and use 0, 1, 2, ... instead")
    candidates = {
        "your frequencies are base ** (-i / D); they are base ** (-2i / D), i = 0 .. D/2 - 1":
            base ** (-two_i / 2 / D),
        "your frequencies are base ** (-2i / (D/2)); the exponent divides by the full head width D: base ** (-2i / D)":
            base ** (-2 * two_i / D),
        "your frequencies run the wrong way: pair 0 turns fastest (theta_0 = 1) and the last pair slowest":
            (base ** (-two_i / D)).flip(0),
        "your exponent divides by D - 2 instead of D: theta_i = base ** (-2i / D)":
            base ** (-two_i / max(D - 2, 1)),
    }
    for mistake, frequencies in candidates.items():
        if not torch.allclose(frequencies, theta) and _close(got, _halves(x, p[:, None] * frequencies)):
            raise Mismatch(f"{what}: {mistake}")
    spread = (p[:, None] * theta).repeat_interleave(2, dim=-1)  # (T, D): theta_0, theta_0, theta_1, theta_1, ...
    rotate_half = torch.cat([-x[..., D // 2:], x[..., : D // 2]], dim=-1).double()
    if _close(got, x.double() * spread.cos() + rotate_half * spread.sin()):
        raise Mismatch(f"{what}: you paired the halves but spread the angles in the interleaved way (theta_0, theta_0, "
                       "theta_1, ...); in the half layout coordinates i and i + D/2 share theta_i, so the angles "
                       "are the D/2 angles written twice, one copy after the other")
    _low_precision(got, x, positions, base, what)


def _low_precision(got: torch.Tensor, x: torch.Tensor, positions: torch.Tensor, base: float, what: str) -> None:
    """Name a rotation computed in float16 or bfloat16: its angles, or its values, rounded.

    Each candidate is a way of writing the rotation with a half-precision step (the frequencies, the
    angles or both rounded; the frequencies computed in that dtype; the input or the result rounded).
    The answer matches the candidate nearest to it when it is much nearer to it than the candidate is to
    the exact rotation; the message names that candidate's dtype and the angle error it measured here.
    """
    D = x.size(-1)
    p = positions.double()
    two_i = torch.arange(0, D, 2, dtype=torch.float64)
    theta = base ** (-two_i / D)
    exact_angles = p[:, None] * theta  # (T, D/2)
    exact = _halves(x, exact_angles)
    answer = got.detach().double().cpu()
    best = None  # (distance, dtype, kind, angles or None)
    for dtype in (torch.bfloat16, torch.float16):
        theta_low = (base ** (-two_i.to(dtype) / D)).double()  # the frequencies computed in that dtype
        angle_versions = [
            p[:, None] * theta.to(dtype).double(),  # the frequencies rounded
            (p[:, None] * theta).to(dtype).double(),  # the angles rounded
            (p[:, None].to(dtype) * theta.to(dtype)).double(),  # the positions, frequencies and products
            p[:, None].to(dtype).double() * theta,  # the positions alone rounded (exact up to 256 in bfloat16)
            p[:, None] * theta_low,
            (p[:, None].to(dtype) * theta_low.to(dtype)).double(),
        ]
        for angles in angle_versions:
            candidate = _halves(x, angles)
            distance = float((answer - candidate).abs().max())
            separation = float((candidate - exact).abs().max())
            if separation > 0 and distance <= 0.05 * separation and (best is None or distance < best[0]):
                best = (distance, dtype, "angles", angles)
        for candidate in (_halves(x.to(dtype), exact_angles), exact.to(dtype).double()):
            distance = float((answer - candidate.double()).abs().max())
            separation = float((candidate.double() - exact).abs().max())
            if separation > 0 and distance <= 0.05 * separation and (best is None or distance < best[0]):
                best = (distance, dtype, "values", None)
    if best is None:
        return
    _, dtype, kind, angles = best
    name = str(dtype).replace("torch.", "")
    bits = {torch.bfloat16: 8, torch.float16: 11}[dtype]
    if kind == "values":
        raise Mismatch(f"{what}: your result has the precision of {name}: the angles are right, but the numbers "
                       f"rotated (or the result) were rounded to {bits} significant bits. Keep x in its own dtype "
                       "and compute the rotation in it (or in float64, then cast the result back)")
    error = (angles - exact_angles).abs()  # (T, D/2)
    row = int(error.max(dim=-1).values.argmax())
    own = (f" x is {name} here, so frequencies and angles made in x's dtype (dtype=x.dtype, positions.to(x.dtype)) "
           f"are {name} ones: the package computes them in float32 at least, whatever x's dtype."
           if x.dtype == dtype else "")
    raise Mismatch(f"{what}: your angles lose precision: they match angles computed in {name} ({bits} significant "
                   f"bits); here the largest angle error is {float(error.max()):.2g} radian, at position "
                   f"{int(positions[row])}, and it grows with the position (section 3 measures it at position "
                   f"2,000).{own} Compute the frequencies and the angles in float32 or float64, then cast the result")


_HALF = (torch.float16, torch.bfloat16)

# The reference helpers of this module compute the answers: an answer that calls them does not count.
_PRIVATE = (_close, _halves, _power_of_two_slopes, _per_head_scores, _far_share, _rope_mistakes, _low_precision)


@exercise(
    "Exercise 1, rotary embeddings in the half layout (GPT-NeoX, Hugging Face Llama)",
    hint="pair i turns by position times base to the power of minus 2i over D, for i from 0 to D/2 - 1 (the same "
         "frequencies as the paired layout); split the last axis into its first and second halves, rotate each "
         "pair (first half, second half) with the cosine and sine of its angle, and put the two halves back "
         "together in the same order",
    forbid=("attn_course", *_PRIVATE),
)
def check_rotate_half_rope(rope) -> str:
    g = rng(9)
    cases = [  # (x shape, positions, base): the notebook's shape first, then others
        ((3, 6, 8), torch.arange(6), 10000.0),
        ((3, 6, 8), torch.tensor([7, 3, 0, 12, 40, 5]), 500.0),  # positions in any order, another base
        ((2, 4, 5, 12), torch.arange(5) * 9, 10000.0),  # (B, H, T, D), an odd number of pairs
        ((1, 3, 2), torch.tensor([0, 1, 2]), 10000.0),  # one pair
        ((2, 1, 16), torch.tensor([300]), 10000.0),  # one position, far out
        # odd positions above 256, where bfloat16 holds only even integers: 2001 is section 3's position 2,000
        ((2, 3, 16), torch.tensor([2001, 301, 298]), 10000.0),
        ((2, 5, 8), torch.tensor([0, 31, 64, 96, 127]), 10000.0),  # chapter 09's test positions
    ]
    dtypes = [torch.float64] * (len(cases) - 1) + [torch.float32]
    # Half-precision inputs, as a model run in bfloat16 or float16 gives them: the angles must still be computed in
    # float32 or float64 (the package's float32 at least), not in x's dtype; 2049 is above 2048, the last integer
    # that float16 holds exactly (positions rounded to float16 make it 2048)
    cases += [((2, 4, 64), torch.tensor([2001, 301, 298, 2049]), 10000.0)] * 2
    dtypes += [torch.bfloat16, torch.float16]
    for shape, positions, base, dtype in ((*case, dtype) for case, dtype in zip(cases, dtypes)):
        x = randn(*shape, generator=g, dtype=dtype)
        what = f"rope(x, positions={positions.tolist()}, base={base:g}) for x of shape {shape} ({dtype})"
        got = expect_tensor(call(rope, x, positions, base), what=what, shape=x.shape, dtype="float")
        expected = apply_rotary_embedding(x.double() if dtype in _HALF else x, positions, base=base, interleaved=False)
        # Angles computed in float32 (as the package does for float32 inputs) are at most about 2e-5 radian off
        # at position 300, which moves a coordinate by less than 1e-4, and about 2.5e-4 radian at 2001 (1e-3 is
        # allowed there); bfloat16 or float16 angles are off by 0.06 radian or more at 300, a position rounded to
        # bfloat16 (2001 to 2000 or 2002) by one radian in pair 0, and every mistake named above by far more.
        atol, rtol = (1e-3 if int(positions.max()) > 1000 else 1e-4), 1e-4
        if dtype in _HALF:
            # A half-precision x: the exact rotation of x (float64), to within the rounding of a result computed in
            # x's dtype with cosines and sines cast to it (at most 0.02 in bfloat16 and 0.003 in float16 on such a
            # case); angles made in bfloat16 or float16, or positions rounded to them, are off by 1 or more here.
            eps = torch.finfo(dtype).eps
            atol, rtol = 8 * eps, 4 * eps
        if not _close(got, expected, atol=atol, rtol=rtol):
            _rope_mistakes(got, x, positions, base, what)
        expect_close(got, expected, what=what, atol=atol, rtol=rtol)
    # Once more with x and the positions on another device (a GPU, or the meta device standing in for one): the
    # frequencies and angles must be made there too, and the result must come back there. On meta, an answer that
    # computes on the CPU shows as data copied out of the inputs, which the statement rules out: named. So is a
    # value read on the host (.item(), float(p) per position, int(positions.max()) to size a table: the fifth
    # review), on every device: meta cannot run it, so it runs on the CPU inputs under a watch.
    device = other_device()
    x, positions = randn(2, 5, 8, generator=g), torch.tensor([0, 3, 7, 12, 40])
    what = f"rope(x, positions={positions.tolist()}) with x (float32) and the positions on the {device.type} device"
    got = _call_elsewhere(rope, x.to(device), positions.to(device), 10000.0, device=device, what=what,
                          cpu_args=(x, positions, 10000.0))
    if got is not None:
        got = expect_on_device(got, device, what)
        expect_tensor(got, what=what, shape=x.shape, dtype="float")
        if device.type != "meta":
            expect_close(got, apply_rotary_embedding(x, positions, interleaved=False).to(device), what=what,
                         atol=1e-4, rtol=1e-4)
    return ("your rotation equals attn_course.apply_rotary_embedding(x, positions, interleaved=False), the layout of "
            "the GPT-NeoX code and of Hugging Face's Llama, for any leading axes, head width and dtype.")


@exercise(
    "Exercise 2, ALiBi slopes for any number of heads",
    hint="for a power of two n the slopes start at 2 to the power of -8/n and keep that ratio (n of them); for "
         "another count, take the slopes of the power of two just below, then append the first, third, fifth ... "
         "slopes of twice as many heads until there are enough",
    forbid=("attn_course", *_PRIVATE),
)
def check_alibi_slopes(slopes_fn) -> str:
    for num_heads in (8, 4, 1, 2, 16, 6, 12, 20, 3, 5, 7, 24, 112):
        what = f"slopes({num_heads})"
        got = expect_tensor(call(slopes_fn, num_heads), what=what, shape=(num_heads,), dtype="float", convert=True)
        low = str(got.dtype).replace("torch.", "") if got.dtype in (torch.float16, torch.bfloat16) else None
        got = got.detach().double().cpu()
        expected = alibi_slopes(num_heads, dtype=torch.float64)
        if _close(got, expected, atol=1e-9):
            continue
        if low and bool(torch.allclose(got, expected, rtol=1e-2, atol=0)):
            bits = {"bfloat16": 8, "float16": 11}[low]
            raise Mismatch(f"{what}: your slopes are {low}, rounded to {bits} significant bits (largest relative "
                           f"error {float(((got - expected) / expected).abs().max()):.1e}); a slope multiplies "
                           "distances of thousands of tokens, so return float32 or float64 (a list of Python "
                           "floats is float64)")
        n = 2 ** int(math.floor(math.log2(num_heads)))
        extra = num_heads - n
        candidates = {
            "your slopes are in reverse order; the first head has the largest slope": expected.flip(0),
            "your slopes are negative; the slopes are positive, and the bias subtracts them: -m_h * (i - j)": -expected,
            "your first slope is 1 = 2 ** 0: the exponent counts heads from 1, 2 ** (-8k / H) for k = 1 .. H, so the "
            "first slope is 2 ** (-8 / H)": torch.tensor([2.0 ** (-8.0 * k / num_heads) for k in range(num_heads)],
                                                         dtype=torch.float64),
        }
        if extra:
            twice = _power_of_two_slopes(2 * n)
            candidates.update({
                f"2 ** (-8k / H) is right only when H is a power of two; for H = {num_heads} the authors' code takes the "
                f"{n} slopes of the power of two below and fills up with every other slope of twice as many heads":
                    _power_of_two_slopes(num_heads),
                f"you took slopes 2, 4, 6, ... of the {2 * n}-head sequence; the authors' code takes the 1st, 3rd, "
                "5th, ...": torch.cat([_power_of_two_slopes(n), twice[1::2][:extra]]),
                f"you took the first {num_heads} slopes of {2 * n} heads (the power of two above); the authors' code "
                f"starts from the {n} slopes of the power of two below": twice[:num_heads],
                f"you put the {extra} extra slope(s) first; the {n} slopes of the power of two come first, the extra "
                "ones after them": torch.cat([twice[0::2][:extra], _power_of_two_slopes(n)]),
                f"you took the extra slopes from the end of every other slope of {2 * n} heads; take the first "
                f"{extra} of them": torch.cat([_power_of_two_slopes(n), twice[0::2][-extra:]]),
                f"you sorted the slopes; the {n} slopes of the power of two come first, the extra ones are appended "
                "after them": expected.sort(descending=True).values,
            })
        candidates[f"1/2, 1/4, 1/8, ... are the slopes of 8 heads; for {num_heads} head(s) the sequence starts at "
                   f"2 ** (-8 / {n}) and keeps that ratio"] = torch.tensor([2.0 ** -k for k in range(1, num_heads + 1)],
                                                                           dtype=torch.float64)
        for mistake, wrong in candidates.items():
            if not _close(wrong, expected, atol=1e-9) and _close(got, wrong, atol=1e-9):
                raise Mismatch(f"{what}: {mistake}")
        expect_close(got, expected, what=what, atol=1e-9)
    return ("your slopes match Press et al.'s geometric sequence for powers of two and the rule of the authors' code "
            "for every other head count tried (3, 5, 6, 7, 12, 20, 24 and BLOOM's 112).")


@exercise(
    "Exercise 3, converting a checkpoint between the two layouts",
    hint="within each head, the new row i must hold the coordinate that the half layout rotates as coordinate i: "
         "first the even rows of the head, then its odd rows; permute the rows of each head separately",
    forbid=_PRIVATE,
)
def check_interleaved_to_halves(convert) -> str:
    g = rng(10)
    for H, D, E, T, dtype in ((3, 8, 12, 7, torch.float64), (1, 2, 3, 4, torch.float64), (4, 6, 5, 5, torch.float64),
                              (2, 4, 6, 3, torch.float32)):
        weight_q = randn(H * D, E, generator=g, dtype=dtype)
        weight_k = randn(H * D, E, generator=g, dtype=dtype)
        x = randn(T, E, generator=g, dtype=torch.float64)
        expected = _per_head_scores(weight_q.double(), weight_k.double(), x, H, interleaved=True)
        what_q = f"interleaved_to_halves(weight_q of shape {(H * D, E)}, num_heads={H})"
        what_k = f"interleaved_to_halves(weight_k of shape {(H * D, E)}, num_heads={H})"
        new_q = expect_tensor(call(convert, weight_q, H), what=what_q, shape=(H * D, E), dtype="float", device=weight_q)
        new_k = expect_tensor(call(convert, weight_k, H), what=what_k, shape=(H * D, E), dtype="float", device=weight_k)
        for new, what in ((new_q, what_q), (new_k, what_k)):  # a permutation moves numbers: it changes no dtype
            if new.dtype != dtype:
                raise Mismatch(f"{what}: the weight is {str(dtype).replace('torch.', '')} and your result is "
                               f"{str(new.dtype).replace('torch.', '')}: moving rows changes no number, so return the "
                               "weight's own dtype (a converter that changes it shrinks or doubles the checkpoint)")
        evens_odds = torch.cat([torch.arange(0, D, 2), torch.arange(1, D, 2)])
        per_head = lambda order: weight_q.view(H, D, E)[:, order].reshape(H * D, E)  # noqa: E731
        got = _per_head_scores(new_q.double(), new_k.double(), x, H, interleaved=False)
        if _close(got, expected, atol=1e-5):
            for new, weight, what in ((new_q, weight_q, what_q), (new_k, weight_k, what_k)):
                right = weight.view(H, D, E)[:, evens_odds].reshape(H * D, E)
                if not torch.equal(new, right):
                    raise Mismatch(f"{what}: the scores agree, but your rows are not exactly the old rows moved "
                                   f"(largest change {float((new.double() - right.double()).abs().max()):.3g}): a "
                                   "permutation moves the numbers of each row and changes none of them")
            continue
        candidates = {
            "you applied the inverse permutation (halves -> interleaved); the new row i of each head must be the old "
            "row that the half layout rotates as coordinate i": per_head(torch.argsort(evens_odds)),
            "you put the odd rows first; the half layout's first half is made of the even rows (pair i's first "
            "coordinate, 2i), then come the odd rows": per_head(torch.cat([torch.arange(1, D, 2), torch.arange(0, D, 2)])),
            "you permuted all H*D rows at once; each head has its own D coordinates, so permute within every head":
                weight_q[torch.cat([torch.arange(0, H * D, 2), torch.arange(1, H * D, 2)])],
            "the weights came back unchanged: the same weights give different scores in the other layout": weight_q,
        }
        for mistake, wrong in candidates.items():
            if not _close(wrong, per_head(evens_odds), atol=0) and _close(new_q, wrong, atol=0):
                raise Mismatch(f"{what_q}: {mistake}")
        if _close(new_q, per_head(evens_odds), atol=0):
            raise Mismatch(f"{what_k}: weight_q is right but weight_k is not: convert both with the same function")
        differ = (f"with H={H}, D={D}, E={E}: the scores of the converted model differ from the original's "
                  f"(largest difference {float((got - expected).abs().max()):.3g})")
        for new, weight, what in ((new_q, weight_q, what_q), (new_k, weight_k, what_k)):
            # (H, D) True where the new row is one of the same head's old rows, unchanged
            found = (new.view(H, D, 1, E) == weight.view(H, 1, D, E)).all(dim=-1).any(dim=-1)
            if not bool(found.all()):
                h, r = (int(i) for i in (~found).nonzero()[0])
                raise Mismatch(f"{what}: {differ}. Row {h * D + r} of your result (row {r} of head {h}) is not one "
                               f"of head {h}'s rows as they were: a conversion only moves each head's rows, it "
                               "changes no number in them and leaves the columns in place")
        raise Mismatch(f"{what_q}: {differ}. Your rows are the heads' own rows, but not in the order the half layout "
                       "needs: within each head, new row i must be the row that the half layout rotates as its "
                       "coordinate i")
    return ("with your permuted weights the half layout gives exactly the scores the interleaved model gave, for every "
            "head count and width tried: the same model, stored the other way.")


def _causal_weights(B: int, H: int, L: int, S: int, g: torch.Generator, dtype: torch.dtype,
                    causal: bool = True) -> torch.Tensor:
    """Softmax weights (B, H, L, S) of random scores, the L queries at the last L positions (causal), or over
    every key (``causal=False``: an encoder's weights, where later keys have weight too)."""
    scores = randn(B, H, L, S, generator=g, dtype=torch.float64) * 2
    query_pos = torch.arange(S - L, S)[:, None]
    blocked = torch.arange(S)[None, :] > query_pos  # (L, S): future keys
    if not causal:
        return scores.softmax(dim=-1).to(dtype)
    return scores.masked_fill(blocked, float("-inf")).softmax(dim=-1).to(dtype)


@exercise(
    "Exercise 4, how much attention goes far",
    hint="row r of the weights is the query at position S - L + r (the queries are the last L positions, as in a "
         "cached step); key j is far from query i when i - j is at least far. Add up each row's weights on its far "
         "keys, keep the rows whose position is first_query or later, and average over the batch and those rows: "
         "one number per head",
    forbid=("attn_course", *_PRIVATE),
)
def check_far_share(far_share) -> str:
    import numpy as np

    g = rng(11)
    cases = [  # (B, H, L, S, first_query, far, dtype): a whole sequence first, as in section 6, then cached steps
        (2, 4, 12, 12, 6, 4, torch.float64),
        (3, 2, 3, 10, 8, 3, torch.float64),  # a cached step: three queries at positions 7, 8, 9 of 10 keys
        (1, 3, 5, 9, np.int64(5), np.int64(2), torch.float32),  # numpy integers, float32
        (2, 5, 1, 7, 6, 6, torch.float64),  # one query; only key 0 is 6 back
        (2, 3, 16, 16, 0, 1, torch.float64),  # every query; every key but the query itself
        (2, 3, 4, 10, 4, 2, torch.float64),  # a cached step whose queries (6 to 9) all come after first_query
        (2, 3, 10, 10, 3, 3, torch.float64, False),  # an encoder's weights: later keys (i - j < 0) are not far
    ]
    for B, H, L, S, first_query, far, dtype, *causal in cases:
        causal = causal[0] if causal else True
        weights = _causal_weights(B, H, L, S, g, dtype, causal)
        what = (f"far_share(weights of shape {(B, H, L, S)}{'' if causal else ' over every key, not causal'}, "
                f"first_query={int(first_query)}, far={int(far)}) ({str(dtype).replace('torch.', '')})")
        got = expect_tensor(call(far_share, weights, first_query, far), what=what, shape=(H,), dtype="float",
                            convert=True)
        expected = _far_share(weights, int(first_query), int(far)).to(dtype)
        answer = got.detach().double().cpu()
        if bool(torch.isnan(answer).any()):
            raise Mismatch(f"{what}: your shares are NaN: no row was kept. first_query is a position, and the L rows "
                           f"hold positions {S - L} to {S - 1} (the last L of the S keys), not 0 to {L - 1}")
        if not _close(answer, expected.double(), atol=1e-5):
            _far_share_mistakes(answer, weights, int(first_query), int(far), what)
        expect_close(got, expected, what=what)
    # Once more with the weights on another device (a GPU, or the meta device standing in for one): the positions
    # must be made there too. Selecting rows by a boolean mask needs values, so meta cannot run every answer: those
    # run on the CPU weights under a watch, which names a tensor made without device= and a value read on the host
    # (float(...) of a sum, .tolist() of the rows: copies to the CPU, which the statement rules out); a boolean
    # mask itself reads nothing on the host and passes.
    device = other_device()
    weights = _causal_weights(2, 3, 4, 10, g, torch.float32)
    what = f"far_share(weights of shape (2, 3, 4, 10) (float32) on the {device.type} device, first_query=7, far=2)"
    got = _call_elsewhere(far_share, weights.to(device), 7, 2, device=device, what=what, cpu_args=(weights, 7, 2))
    if isinstance(got, torch.Tensor):
        got = expect_on_device(got, device, what)
        if device.type != "meta":
            expect_close(got.cpu(), _far_share(weights, 7, 2).to(weights.dtype), what=what)
    return ("your shares match for whole sequences and for cached steps (queries at the last L positions), in "
            "float32 and float64: the measurement of section 6, for any block of queries.")


def _far_share_mistakes(answer: torch.Tensor, weights: torch.Tensor, first_query: int, far: int, what: str) -> None:
    """Name the mistake when ``answer`` is a plausible wrong share."""
    w = weights.detach().double().cpu()
    B, H, L, S = w.shape
    expected = _far_share(w, first_query, far)

    def share(query_pos, is_far, rows, reduce_keys="sum", reduce_rows="mean", batch=slice(None)):
        kept = w[batch] * is_far
        per_row = kept.sum(dim=-1) if reduce_keys == "sum" else kept.sum(dim=-1) / is_far.sum(dim=-1).clamp(min=1)
        per_row = per_row[..., rows]  # (B, H, rows)
        if reduce_rows == "sum":
            return per_row.sum(dim=-1).mean(dim=0)
        return per_row.mean(dim=-1).mean(dim=0)

    right_pos = torch.arange(S - L, S)[:, None]
    key_pos = torch.arange(S)[None, :]
    top_left = torch.arange(L)[:, None]
    rows = right_pos[:, 0] >= first_query
    candidates = {
        "your query positions start at 0 at the first row; the L queries are the last L positions, S - L to S - 1 "
        "(bottom-right aligned, as in a cached step)":
            share(top_left, (top_left - key_pos) >= far, top_left[:, 0] >= first_query),
        "you kept the keys more than `far` back; a key exactly `far` positions back counts as far too (i - j >= far)":
            share(right_pos, (right_pos - key_pos) > far, rows),
        "you kept the keys fewer than `far` positions back: that is the near share, one minus the far share":
            share(right_pos, ((right_pos - key_pos) < far) & ((right_pos - key_pos) >= 0), rows),
        "you averaged over every query; keep only the queries at positions first_query and later":
            share(right_pos, (right_pos - key_pos) >= far, torch.ones(L, dtype=torch.bool)),
        "you averaged the weights over the far keys; the share is their sum (the weights of a row add up to 1)":
            share(right_pos, (right_pos - key_pos) >= far, rows, reduce_keys="mean"),
        "you added up the shares of the queries; average them, so that the result is a share between 0 and 1":
            share(right_pos, (right_pos - key_pos) >= far, rows, reduce_rows="sum"),
        "you used the first sequence of the batch only; average over the batch too":
            share(right_pos, (right_pos - key_pos) >= far, rows, batch=slice(0, 1)),
        "your shares count keys by their position (j >= far), not by their distance from the query (i - j >= far)":
            share(right_pos, (key_pos >= far) & (key_pos <= right_pos), rows),
        "you counted the keys at least `far` positions away on either side (|i - j| >= far); only keys before the "
        "query are far back (i - j >= far): these weights are not causal, so later keys have weight too":
            share(right_pos, (right_pos - key_pos).abs() >= far, rows),
    }
    if first_query < S - L:  # rows sliced from first_query - (S - L): negative here, so Python counts from the end
        start = first_query - (S - L)
        if start > -L:
            candidates[f"you kept the rows from index first_query - (S - L) = {start}, which is negative here: Python "
                       f"counts it from the end and keeps only the last {-start} rows. When first_query is before "
                       f"the first query's position ({S - L}) every row is kept"] = \
                share(right_pos, (right_pos - key_pos) >= far, torch.arange(L) >= L + start)
    for mistake, wrong in candidates.items():
        if not _close(wrong, expected, atol=1e-7) and _close(answer, wrong, atol=1e-5):
            raise Mismatch(f"{what}: {mistake}")
    if _close(answer, expected.mean().expand(H), atol=1e-5):
        raise Mismatch(f"{what}: you averaged over the heads; return one share per head")
