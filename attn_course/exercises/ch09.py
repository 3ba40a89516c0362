"""Checks for the exercises of chapter 09, rotary embeddings and ALiBi."""

from __future__ import annotations

import math

import torch

from ..alibi import alibi_slopes
from ..rotary import apply_rotary_embedding
from . import Mismatch, call, exercise, expect, expect_close, expect_tensor

__all__ = ["check_rotate_half_rope", "check_alibi_slopes", "check_interleaved_to_halves"]


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a.double(), b.double(), atol=1e-6, rtol=1e-5))


@exercise(
    "Exercise 1, rotary embeddings in the half layout (GPT-NeoX, Hugging Face Llama)",
    hint="theta = base ** (-torch.arange(0, D, 2) / D); angle = positions[:, None] * theta; with "
    "x1, x2 = x[..., :D//2], x[..., D//2:] return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)",
)
def check_rotate_half_rope(rope) -> str:
    generator = torch.Generator().manual_seed(9)
    D, T = 8, 6
    x = torch.randn(3, T, D, generator=generator, dtype=torch.float64)
    for positions, base in ((torch.arange(T), 10000.0), (torch.tensor([7, 3, 0, 12, 40, 5]), 500.0)):
        got = call(rope, x.clone(), positions.clone(), base)
        what = f"rope(x, positions={positions.tolist()}, base={base:g}) for x of shape {tuple(x.shape)}"
        got = expect_tensor(got, what=what, shape=x.shape).double()
        expected = apply_rotary_embedding(x, positions, base=base, interleaved=False)
        if _close(got, expected):
            continue
        if _close(got, apply_rotary_embedding(x, positions, base=base, interleaved=True)):
            raise Mismatch(f"{what}: you rotated neighbouring pairs (0, 1), (2, 3), ...: that is the interleaved "
                           "layout of the paper. The half layout pairs coordinate i with i + D/2.")
        if _close(got, apply_rotary_embedding(x, -positions, base=base, interleaved=False)):
            raise Mismatch(f"{what}: you rotate the wrong way (the sign of the sines is flipped)")
        for shift in (1, -1):
            if _close(got, apply_rotary_embedding(x, positions + shift, base=base, interleaved=False)):
                raise Mismatch(f"{what}: your positions are off by one (you rotated by positions {shift:+d}); "
                               "rotate each vector by its position as given, so that position 0 is not rotated")
        if base != 10000.0 and _close(got, apply_rotary_embedding(x, positions, interleaved=False)):
            raise Mismatch(f"{what}: you ignore the base argument and use 10000; the frequencies are base ** (-2i / D)")
        if _close(got, apply_rotary_embedding(x, torch.arange(T), base=base, interleaved=False)):
            raise Mismatch(f"{what}: you ignore the positions argument and use 0, 1, 2, ... instead")
        half_freq = base ** (-torch.arange(0, D // 2, dtype=torch.float64) / D)  # base ** (-i / D)
        angles = positions.double()[:, None] * half_freq
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        wrong_exponent = torch.cat([x1 * angles.cos() - x2 * angles.sin(), x1 * angles.sin() + x2 * angles.cos()], -1)
        if _close(got, wrong_exponent):
            raise Mismatch(f"{what}: your frequencies are base ** (-i / D); they are base ** (-2i / D), "
                           "i = 0 .. D/2 - 1 (torch.arange(0, D, 2) / D)")
        quarter_freq = base ** (-4.0 * torch.arange(0, D // 2, dtype=torch.float64) / D)  # base ** (-2i / (D/2))
        angles = positions.double()[:, None] * quarter_freq
        if _close(got, torch.cat([x1 * angles.cos() - x2 * angles.sin(), x1 * angles.sin() + x2 * angles.cos()], -1)):
            raise Mismatch(f"{what}: your frequencies are base ** (-2i / (D/2)); the exponent divides by the full "
                           "head width D: base ** (-2i / D)")
        full_angles = (positions.double()[:, None] * base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
                       ).repeat_interleave(2, dim=-1)  # (T, D): theta_0, theta_0, theta_1, theta_1, ...
        rotate_half = torch.cat([-x2, x1], dim=-1)
        if _close(got, x * full_angles.cos() + rotate_half * full_angles.sin()):
            raise Mismatch(f"{what}: you paired the halves but spread the angles in the interleaved way "
                           "(repeat_interleave: theta_0, theta_0, theta_1, ...); in the half layout coordinates i "
                           "and i + D/2 share theta_i, so the angles are torch.cat([angles, angles], dim=-1)")
        expect_close(got, expected, what=what, atol=1e-6)
    return ("your rotation equals attn_course.apply_rotary_embedding(x, positions, interleaved=False), the layout of "
            "the GPT-NeoX code and of Hugging Face's Llama.")


@exercise(
    "Exercise 2, ALiBi slopes for any number of heads",
    hint="for a power of two n the slopes are 2 ** (-8 * k / n) for k = 1 .. n; otherwise take those of "
    "n = 2 ** floor(log2(H)) and append slopes(2 * n)[0::2][: H - n]",
)
def check_alibi_slopes(slopes_fn) -> str:
    for num_heads in (8, 4, 1, 6, 12, 20, 3):
        got = call(slopes_fn, num_heads)
        what = f"slopes({num_heads})"
        if isinstance(got, (list, tuple)):
            expect(all(isinstance(s, (int, float)) for s in got), f"{what}: return numbers, got {got!r}")
            got = torch.tensor([float(s) for s in got], dtype=torch.float64)
        got = expect_tensor(got, what=what, shape=(num_heads,)).double()
        expected = alibi_slopes(num_heads, dtype=torch.float64)
        if _close(got, expected):
            continue
        if _close(got, expected.flip(0)):
            raise Mismatch(f"{what}: your slopes are in reverse order; the first head has the largest slope")
        if _close(got, -expected):
            raise Mismatch(f"{what}: your slopes are negative; the slopes are positive, and the bias subtracts them: "
                           "-m_h * (i - j)")
        if _close(got, torch.tensor([2.0 ** (-8.0 * k / num_heads) for k in range(num_heads)], dtype=torch.float64)):
            raise Mismatch(f"{what}: your first slope is 1 = 2 ** 0: the exponent counts heads from 1, "
                           f"2 ** (-8 * k / H) for k = 1 .. H, so the first slope is 2 ** (-8 / H)")
        if num_heads & (num_heads - 1) and _close(got, expected.sort(descending=True).values):
            raise Mismatch(f"{what}: you sorted the slopes; the paper keeps the {2 ** int(math.floor(math.log2(num_heads)))} "
                           "slopes of the power of two first and appends the extra ones after them")
        plain = torch.tensor([2.0 ** (-8.0 * (k + 1) / num_heads) for k in range(num_heads)], dtype=torch.float64)
        if _close(got, plain):
            raise Mismatch(f"{what}: 2 ** (-8k / H) is right only when H is a power of two; for H = {num_heads} "
                           "the paper takes the slopes of the power of two below and fills up with every other slope of twice as many heads")
        n = 2 ** int(math.floor(math.log2(num_heads)))
        odd = torch.cat([alibi_slopes(n, dtype=torch.float64), alibi_slopes(2 * n, dtype=torch.float64)[1::2][: num_heads - n]])
        if _close(got, odd):
            raise Mismatch(f"{what}: you took slopes 2, 4, 6, ... of the {2 * n}-head sequence; the paper takes 1, 3, 5, ... ([0::2])")
        above = alibi_slopes(2 * n, dtype=torch.float64)[:num_heads]
        if _close(got, above):
            raise Mismatch(f"{what}: you took the first {num_heads} slopes of {2 * n} heads (the power of two above); "
                           f"the paper starts from the {n} slopes of the power of two below")
        expect_close(got, expected, what=what, atol=1e-9)
    return "your slopes match Press et al.'s for powers of two and for every other head count tried (3, 6, 12, 20)."


def _per_head_scores(weight_q, weight_k, x, num_heads, interleaved):
    E = x.size(-1)
    D = weight_q.size(0) // num_heads
    q = (x @ weight_q.T).view(x.size(0), num_heads, D).transpose(0, 1)  # (T, H*D) -> (H, T, D)
    k = (x @ weight_k.T).view(x.size(0), num_heads, D).transpose(0, 1)
    q = apply_rotary_embedding(q, interleaved=interleaved)
    k = apply_rotary_embedding(k, interleaved=interleaved)
    return q @ k.transpose(-2, -1)  # (H, T, T)


@exercise(
    "Exercise 3, converting a checkpoint between the two layouts",
    hint="within each head, the new row order is the even rows, then the odd rows: "
    "weight.view(H, D, E)[:, order].reshape(H * D, E) with order = torch.cat([torch.arange(0, D, 2), torch.arange(1, D, 2)])",
)
def check_interleaved_to_halves(convert) -> str:
    generator = torch.Generator().manual_seed(10)
    H, D, E, T = 3, 8, 12, 7
    weight_q = torch.randn(H * D, E, generator=generator, dtype=torch.float64)
    weight_k = torch.randn(H * D, E, generator=generator, dtype=torch.float64)
    x = torch.randn(T, E, generator=generator, dtype=torch.float64)
    expected = _per_head_scores(weight_q, weight_k, x, H, interleaved=True)
    new_q = expect_tensor(call(convert, weight_q.clone(), H), what="interleaved_to_halves(weight_q, num_heads=3)", shape=(H * D, E))
    new_k = expect_tensor(call(convert, weight_k.clone(), H), what="interleaved_to_halves(weight_k, num_heads=3)", shape=(H * D, E))
    got = _per_head_scores(new_q.double(), new_k.double(), x, H, interleaved=False)
    if _close(got, expected):
        return ("with your permuted weights the half layout gives exactly the scores the interleaved model gave: "
                "the same model, stored the other way.")
    evens_odds = torch.cat([torch.arange(0, D, 2), torch.arange(1, D, 2)])
    inverse = torch.argsort(evens_odds)
    per_head_inverse = weight_q.view(H, D, E)[:, inverse].reshape(H * D, E)
    global_perm = torch.cat([torch.arange(0, H * D, 2), torch.arange(1, H * D, 2)])
    if torch.allclose(new_q.double(), per_head_inverse):
        raise Mismatch("you applied the inverse permutation (halves -> interleaved); the new row i of each head "
                       "must be the old row evens_then_odds[i]")
    if torch.allclose(new_q.double(), weight_q[global_perm]):
        raise Mismatch("you permuted all H*D rows at once; each head has its own D coordinates, so permute within every head")
    if torch.allclose(new_q.double(), weight_q):
        raise Mismatch("the weights came back unchanged: the same weights give different scores in the other layout")
    if new_q.shape == weight_q.shape and torch.allclose(new_q.double(), weight_q.view(H, D, E)[:, evens_odds].reshape(H * D, E)):
        raise Mismatch("weight_q is right but weight_k is not: convert both with the same function")
    raise Mismatch(f"the scores of the converted model differ from the original's: largest difference "
                   f"{float((got - expected).abs().max()):.3g}")
