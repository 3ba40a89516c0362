"""The exercise checks of chapter 09: right, wrong, crashing and untouched answers."""

import math
import re

import numpy as np
import pytest
import torch

from attn_course.exercises import ch09
from attn_course.exercises.ch09 import check_alibi_slopes, check_far_share, check_interleaved_to_halves, check_rotate_half_rope


def _scaffold(*args):
    ...


# --- right answers, and variants of them ----------------------------------------------------------

def rope(x, positions, base=10000.0, *, layout="halves", sign=1.0, offset=0, exponent=2.0, use_positions=True,
         spread="cat", theta_order="forward", divisor="D"):
    D = x.size(-1)
    if not use_positions:
        positions = torch.arange(x.size(-2), device=x.device)
    theta = base ** (-exponent * torch.arange(0, D // 2, dtype=torch.float64, device=x.device) /
                     (D - 2 if divisor == "D - 2" else D))
    if theta_order == "reversed":
        theta = theta.flip(0)
    angles = (positions.double() + offset)[:, None] * theta * sign
    cos, sin = angles.cos(), angles.sin()
    if spread == "swap":
        cos, sin = sin, cos
    if spread == "repeat_interleave":  # the rotate_half formula with the angles laid out for the interleaved pairs
        full = angles.repeat_interleave(2, dim=-1)  # (T, D)
        rotated_half = torch.cat([-x[..., D // 2:], x[..., : D // 2]], dim=-1)
        return x * full.cos() + rotated_half * full.sin()
    if layout == "halves":
        first, second = x[..., : D // 2], x[..., D // 2:]
        return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)
    first, second = x[..., 0::2], x[..., 1::2]
    return torch.stack([first * cos - second * sin, first * sin + second * cos], dim=-1).flatten(-2)


def rope_complex(x, positions, base=10000.0):
    """Another formulation: the pairs as complex numbers, multiplied by e^{i m theta}."""
    D = x.size(-1)
    theta = base ** (-torch.arange(0, D, 2, dtype=torch.float64, device=x.device) / D)
    rotation = torch.polar(torch.ones(positions.size(0), D // 2, dtype=torch.float64, device=x.device),
                           positions.double()[:, None] * theta)
    z = torch.complex(x[..., : D // 2].double(), x[..., D // 2:].double()) * rotation
    return torch.cat([z.real, z.imag], dim=-1).to(x.dtype)


def slopes(num_heads, *, odd=False, reverse=False, plain=False, above=False, from_zero=False, negative=False, sort=False):
    def power_of_two(n):
        return [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)]

    if plain:
        result = [2.0 ** (-8.0 * k / num_heads) for k in range(1, num_heads + 1)]
    elif above:
        n = 2 ** math.ceil(math.log2(num_heads))
        result = power_of_two(n)[:num_heads]
    else:
        n = 2 ** math.floor(math.log2(num_heads))
        extra = power_of_two(2 * n)[1::2] if odd else power_of_two(2 * n)[0::2]
        result = power_of_two(n) + extra[: num_heads - n]
    if from_zero:  # heads counted from 0: 1, 2 ** (-8 / H), ...
        result = [2.0 ** (-8.0 * k / num_heads) for k in range(num_heads)]
    if negative:
        result = [-s for s in result]
    if sort:
        result = sorted(result, reverse=True)
    return result[::-1] if reverse else result


def slopes_tensor(num_heads):
    return torch.tensor(slopes(num_heads), dtype=torch.float32)


def interleaved_to_halves(weight, num_heads, *, mode="right"):
    rows, E = weight.shape
    D = rows // num_heads
    order = torch.cat([torch.arange(0, D, 2), torch.arange(1, D, 2)])
    if mode == "inverse":
        order = torch.argsort(order)
    if mode == "global":
        return weight[torch.cat([torch.arange(0, rows, 2), torch.arange(1, rows, 2)])]
    if mode == "unchanged":
        return weight.clone()
    if mode == "odds first":
        order = torch.cat([torch.arange(1, D, 2), torch.arange(0, D, 2)])
    if mode == "columns":
        return weight[:, torch.cat([torch.arange(0, E, 2), torch.arange(1, E, 2)])]
    return weight.view(num_heads, D, E)[:, order].reshape(rows, E)


def interleaved_to_halves_index(weight, num_heads):
    """Another formulation: build the list of source rows explicitly."""
    rows = weight.size(0)
    D = rows // num_heads
    source = [row for h in range(num_heads) for row in
              [h * D + 2 * i for i in range(D // 2)] + [h * D + 2 * i + 1 for i in range(D // 2)]]
    return weight[source]


def interleaved_to_halves_hf(weight, num_heads):
    """Hugging Face's convert_llama_weights_to_hf.permute: view(H, D/2, 2, E).transpose(1, 2)."""
    rows, E = weight.shape
    return weight.view(num_heads, rows // num_heads // 2, 2, E).transpose(1, 2).reshape(rows, E)


def slopes_mpt(num_heads):
    """MPT's gen_slopes: the slopes of the next power of two, odd ones first, then even ones, cut to H."""
    n = 2 ** math.ceil(math.log2(num_heads))
    m = torch.arange(1, n + 1, dtype=torch.float64) * 8 / n
    slopes = 1.0 / torch.pow(2, m)
    if n != num_heads:
        slopes = torch.cat([slopes[1::2], slopes[::2]])[:num_heads]
    return slopes


def rope_einsum_4d(x, positions, base=10000.0):
    """Another formulation: the rotation as a (D/2, 2, 2) matrix per position, applied with einsum."""
    D = x.size(-1)
    theta = base ** (-torch.arange(0, D, 2, dtype=torch.float64, device=x.device) / D)
    a = positions.double()[:, None] * theta  # (T, D/2)
    rot = torch.stack([torch.stack([a.cos(), -a.sin()], -1), torch.stack([a.sin(), a.cos()], -1)], -2)  # (T, D/2, 2, 2)
    pairs = torch.stack([x[..., : D // 2], x[..., D // 2:]], dim=-1).double()  # (..., T, D/2, 2)
    out = torch.einsum("tpij,...tpj->...tpi", rot, pairs)
    return torch.cat([out[..., 0], out[..., 1]], dim=-1).to(x.dtype)


def test_right_answers_pass():
    for feedback in (check_rotate_half_rope(rope), check_rotate_half_rope(rope_complex),
                     check_rotate_half_rope(rope_einsum_4d), check_alibi_slopes(slopes),
                     check_alibi_slopes(slopes_tensor), check_alibi_slopes(slopes_mpt),
                     check_alibi_slopes(lambda h: np.array(slopes(h), dtype=np.float32)),
                     check_alibi_slopes(lambda h: [np.float32(s) for s in slopes(h)]),
                     check_alibi_slopes(lambda h: tuple(slopes(h))),
                     check_interleaved_to_halves(interleaved_to_halves),
                     check_interleaved_to_halves(interleaved_to_halves_index),
                     check_interleaved_to_halves(interleaved_to_halves_hf),
                     check_far_share(far_share), check_far_share(far_share_loops), check_far_share(far_share_tril),
                     check_far_share(far_share_one_minus_near), check_far_share(far_share_row_loop),
                     check_far_share(lambda w, q, f: far_share(w.double(), q, f).to(w.dtype))):
        assert feedback.status == "correct", str(feedback)
        assert bool(feedback)


def rope_in_input_dtype(x, positions, base=10000.0):
    """The notebook's solution: angles in float64, cosines and sines cast to x's dtype, the rotation computed in it
    (in bfloat16 or float16 for a half-precision x, rounded at each step)."""
    D = x.size(-1)
    theta = base ** (-torch.arange(0, D, 2, dtype=torch.float64, device=x.device) / D)
    angles = positions.to(x.device).double()[:, None] * theta
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    first, second = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


def rope_hf(x, positions, base=10000.0):
    """Hugging Face's formulation: float32 frequencies, cat([f, f]), rotate_half, cosines cast to x's dtype."""
    D = x.size(-1)
    inv_freq = 1.0 / (base ** (torch.arange(0, D, 2, device=x.device).float() / D))
    angles = torch.outer(positions.to(x.device).float(), inv_freq)
    full = torch.cat([angles, angles], dim=-1)  # (T, D)
    rotated_half = torch.cat([-x[..., D // 2:], x[..., : D // 2]], dim=-1)
    return x * full.cos().to(x.dtype) + rotated_half * full.sin().to(x.dtype)


def test_rope_in_the_input_dtype_passes():
    """Half-precision inputs are rotated in their own dtype with float32 or float64 angles: right."""
    for answer in (rope_in_input_dtype, rope_hf):
        feedback = check_rotate_half_rope(answer)
        assert feedback.status == "correct", str(feedback)


def test_float32_rope_passes():
    assert check_rotate_half_rope(lambda x, p, b: rope(x.float(), p, b).float())


def test_rope_computed_in_float32_passes():
    """Angles computed in float32, as the package computes them for float32 inputs."""
    def rope_float32(x, positions, base=10000.0):
        D = x.size(-1)
        theta = base ** (-torch.arange(0, D, 2, device=x.device) / D)  # float32
        angles = positions[:, None] * theta  # (T, D/2), float32
        cos, sin = angles.cos(), angles.sin()
        first, second = x[..., : D // 2].float(), x[..., D // 2:].float()
        return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)

    feedback = check_rotate_half_rope(rope_float32)
    assert feedback.status == "correct", str(feedback)


def _rope_bfloat16_angles(x, positions, base=10000.0):
    D = x.size(-1)
    theta = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    angles = (positions[:, None].to(torch.bfloat16) * theta.to(torch.bfloat16)).double()
    first, second = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([first * angles.cos() - second * angles.sin(), first * angles.sin() + second * angles.cos()], -1).to(x.dtype)


def _rope_3d_only(x, positions, base=10000.0):
    B, T, D = x.shape  # the notebook's (B, T, D) only
    return rope(x, positions, base)


def _rope_in_place(x, positions, base=10000.0):
    x.copy_(rope(x, positions, base))
    return x


def _rope_pairs_mirrored(x, positions, base=10000.0):
    """Pairs (i, D - 1 - i)."""
    D = x.size(-1)
    order = torch.cat([torch.arange(D // 2), torch.arange(D - 1, D // 2 - 1, -1)])
    out = torch.empty_like(x)
    out[..., order] = rope(x[..., order], positions, base)
    return out


def _rope_package(x, positions, base=10000.0):
    import attn_course as ac
    return ac.apply_rotary_embedding(x, positions, base=base, interleaved=False)


def _slopes_package(num_heads):
    import attn_course as ac
    return ac.alibi_slopes(num_heads)


def _slopes_extras_first(num_heads):
    n = 2 ** math.floor(math.log2(num_heads))
    power = [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)]
    twice = [2.0 ** (-8.0 * k / (2 * n)) for k in range(1, 2 * n + 1)]
    return twice[0::2][: num_heads - n] + power


def _slopes_extras_from_tail(num_heads):
    n = 2 ** math.floor(math.log2(num_heads))
    power = [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)]
    twice = [2.0 ** (-8.0 * k / (2 * n)) for k in range(1, 2 * n + 1)]
    return power + (twice[0::2][n - (num_heads - n):] if num_heads > n else [])


def _convert_in_place(weight, num_heads):
    weight.copy_(interleaved_to_halves(weight, num_heads))
    return weight


def _convert_fixed_width(weight, num_heads):
    D = 8  # the notebook's head width
    rows, E = weight.shape
    order = torch.cat([torch.arange(0, D, 2), torch.arange(1, D, 2)])
    return weight.view(rows // D, D, E)[:, order].reshape(rows, E)


def _rope_low(angles="float16", values=None, result=None):
    """A rotation with one half-precision step: the angles (positions and frequencies) computed in that dtype,
    or the input x, or the result, rounded to it."""
    def rope_low(x, positions, base=10000.0):
        D = x.size(-1)
        theta = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
        if angles == "float16":
            a = (positions.half()[:, None] * theta.half()).double()
        elif angles == "float16 frequencies":
            a = positions.double()[:, None] * theta.half().double()
        else:
            a = positions.double()[:, None] * theta
        xx = x.to(values).double() if values is not None else x.double()
        first, second = xx[..., : D // 2], xx[..., D // 2:]
        out = torch.cat([first * a.cos() - second * a.sin(), first * a.sin() + second * a.cos()], -1)
        return out.to(result).to(x.dtype) if result is not None else out.to(x.dtype)
    return rope_low


def _rope_private_helper(x, positions, base=10000.0):
    """The check module's own reference helper (correct, but not the student's work)."""
    D = x.size(-1)
    angles = positions.double()[:, None] * base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    return ch09._halves(x, angles).to(x.dtype)


def _slopes_private_helper(num_heads):
    n = 2 ** math.floor(math.log2(num_heads))
    return ch09._power_of_two_slopes(n).tolist() + ch09._power_of_two_slopes(2 * n).tolist()[0::2][: num_heads - n]


def far_share(weights, first_query, far, *, align="bottom_right", strict=False, near=False, every_query=False,
              key_mean=False, query_sum=False, first_sequence=False, head_mean=False, by_key_position=False):
    L, S = weights.shape[-2:]
    device = weights.device
    query_pos = torch.arange(S - L, S, device=device) if align == "bottom_right" else torch.arange(L, device=device)
    offset = query_pos[:, None] - torch.arange(S, device=device)[None, :]  # (L, S): i - j
    is_far = offset > far if strict else offset >= far
    if near:
        is_far = (offset < far) & (offset >= 0)
    if by_key_position:
        is_far = (torch.arange(S, device=device)[None, :] >= far) & (offset >= 0)
    rows = torch.ones(L, dtype=torch.bool, device=device) if every_query else query_pos >= first_query
    w = weights[:1] if first_sequence else weights
    per_row = (w * is_far).sum(dim=-1)  # (B, H, L)
    if key_mean:
        per_row = per_row / is_far.sum(dim=-1).clamp(min=1)
    per_row = per_row[..., rows]
    result = (per_row.sum(dim=-1) if query_sum else per_row.mean(dim=-1)).mean(dim=0)  # (H,)
    return result.mean().expand(result.shape) if head_mean else result


def far_share_loops(weights, first_query, far):
    """Another formulation: Python loops over heads, sequences and queries, adding up tensors (no copy out)."""
    B, H, L, S = weights.shape
    shares = []
    for h in range(H):
        total, count = 0.0, 0
        for b in range(B):
            for r in range(L):
                i = S - L + r
                if i >= first_query:
                    total = total + weights[b, h, r, : max(i - far + 1, 0)].sum()
                    count += 1
        shares.append(total / count)
    return torch.stack(shares)


def far_share_tril(weights, first_query, far):
    """Another formulation: the far keys as a lower triangle below the diagonal S - L - far, made in numpy from
    the shapes alone and moved to the weights' device."""
    L, S = weights.shape[-2:]
    is_far = torch.as_tensor(np.tril(np.ones((L, S)), k=S - L - far), dtype=weights.dtype, device=weights.device)
    rows = torch.as_tensor(np.arange(S - L, S) >= first_query, device=weights.device)
    return ((weights * is_far).sum(-1)[..., rows]).mean(-1).mean(0)


def far_share_one_minus_near(weights, first_query, far):
    """Another formulation: 1 minus the weight on the keys fewer than `far` back, later keys included (the fifth
    review): right for an encoder's weights too, since each row adds up to 1."""
    L, S = weights.shape[-2:]
    query_pos = torch.arange(S - L, S, device=weights.device)
    offset = query_pos[:, None] - torch.arange(S, device=weights.device)[None, :]
    return 1 - (weights * (offset < far)).sum(-1)[:, :, query_pos >= first_query].mean(dim=(0, 2))


def far_share_row_loop(weights, first_query, far):
    """Another formulation: a Python loop over the rows, deciding on Python integers (no value read on the host)."""
    L, S = weights.shape[-2:]
    kept = [weights[:, :, r, : max(S - L + r - far + 1, 0)].sum(-1) for r in range(L) if S - L + r >= first_query]
    return torch.stack(kept, dim=-1).mean(dim=(0, 2))


def _far_share_in_place(weights, first_query, far):
    L, S = weights.shape[-2:]
    weights *= (torch.arange(S - L, S)[:, None] - torch.arange(S)[None, :]) >= far
    return weights.sum(dim=-1)[..., torch.arange(S - L, S) >= first_query].mean(dim=(0, 2))


def _far_share_negative_slice(weights, first_query, far):
    """Rows sliced from first_query - (S - L): a negative start when first_query comes before the first query."""
    L, S = weights.shape[-2:]
    query_pos = torch.arange(S - L, S, device=weights.device)
    offset = query_pos[:, None] - torch.arange(S, device=weights.device)[None, :]
    return (weights * (offset >= far)).sum(-1)[:, :, int(first_query) - (S - L):].mean(dim=(0, 2))


def _far_share_cpu_only(weights, first_query, far):
    """Right on the CPU, but the positions are made without device=."""
    L, S = weights.shape[-2:]
    query_pos = torch.arange(S - L, S)
    offset = query_pos[:, None] - torch.arange(S)[None, :]
    return (weights * (offset >= far)).sum(-1)[:, :, query_pos >= first_query].mean(dim=(0, 2))


def _rope_angles_in_input_dtype(x, positions, base=10000.0):
    """The frequencies and the angles made in x's dtype: right for float32 and float64, bfloat16 angles for a
    bfloat16 x (the chapter's own common bug)."""
    D = x.size(-1)
    theta = base ** (-torch.arange(0, D, 2, dtype=x.dtype, device=x.device) / D)
    angles = positions.to(x.device).to(x.dtype)[:, None] * theta
    first, second = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([first * angles.cos() - second * angles.sin(), first * angles.sin() + second * angles.cos()], -1)


def _rope_positions_float16(x, positions, base=10000.0):
    """The positions rounded to float16, the product in float32: exact up to 2048, then 2049 -> 2048."""
    D = x.size(-1)
    theta = base ** (-torch.arange(0, D, 2, dtype=torch.float32, device=x.device) / D)
    angles = positions.to(x.device).half().float()[:, None] * theta
    first, second = x[..., : D // 2].float(), x[..., D // 2:].float()
    return torch.cat([first * angles.cos() - second * angles.sin(), first * angles.sin() + second * angles.cos()], -1)


def _rope_cpu_only(x, positions, base=10000.0):
    """Right on the CPU, but the frequencies are made without device=."""
    D = x.size(-1)
    theta = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    angles = positions.double()[:, None] * theta
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    first, second = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


def _rope_positions_bfloat16(x, positions, base=10000.0):
    """The positions rounded to bfloat16 alone: exact up to 256, then even numbers only (301 -> 300, 2001 -> 2000, 298 kept)."""
    return rope(x, positions.to(torch.bfloat16).double(), base)


def _rope_on_the_cpu(x, positions, base=10000.0):
    """Right values, computed on the CPU and returned there whatever the inputs' device."""
    return rope(x.cpu(), positions.cpu(), base)


def _far_share_on_the_cpu(weights, first_query, far):
    """Right values, computed on the CPU and returned there whatever the inputs' device."""
    return far_share(weights.cpu(), first_query, far)


def _far_share_either_side(weights, first_query, far):
    """Keys at least `far` away on either side, |i - j| >= far: the same as i - j >= far for causal weights only."""
    L, S = weights.shape[-2:]
    query_pos = torch.arange(S - L, S, device=weights.device)
    offset = query_pos[:, None] - torch.arange(S, device=weights.device)[None, :]
    return (weights * (offset.abs() >= far)).sum(-1)[:, :, query_pos >= first_query].mean(dim=(0, 2))


def _convert_negate_second_half(weight, num_heads):
    """The right permutation, then the second half of each head's rows negated: no columns touched."""
    out = interleaved_to_halves(weight, num_heads).clone()
    D = weight.size(0) // num_heads
    out.view(num_heads, D, -1)[:, D // 2:] *= -1
    return out


def _convert_rows_reversed(weight, num_heads):
    """Each head's rows, in reverse order: the heads' own rows, in an order no layout uses."""
    rows, E = weight.shape
    return weight.view(num_heads, rows // num_heads, E).flip(1).reshape(rows, E)


def _convert_negate_pair(weight, num_heads):
    """The same scores (pair 0 negated in both the query and the key), but not a permutation of the rows."""
    out = interleaved_to_halves(weight, num_heads).clone()
    D = weight.size(0) // num_heads
    view = out.view(num_heads, D, -1)
    view[:, 0] *= -1
    view[:, D // 2] *= -1
    return out


def _rope_float_per_position(x, positions, base=10000.0):
    """Right values, but float(p) per position: each one a read of the device's value on the host (.item())."""
    D = x.size(-1)
    theta = base ** (-torch.arange(0, D, 2, dtype=torch.float64, device=x.device) / D)
    angles = torch.stack([float(p) * theta for p in positions])
    first, second = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([first * angles.cos() - second * angles.sin(), first * angles.sin() + second * angles.cos()], -1)


def _rope_table_sized_by_item(x, positions, base=10000.0):
    """Right values, but a table of angles sized by positions.max().item(), as a cache of cosines would be."""
    D = x.size(-1)
    n = int(positions.max().item()) + 1
    theta = base ** (-torch.arange(0, D, 2, dtype=torch.float64, device=x.device) / D)
    angles = (torch.arange(n, dtype=torch.float64, device=x.device)[:, None] * theta)[positions]
    first, second = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([first * angles.cos() - second * angles.sin(), first * angles.sin() + second * angles.cos()], -1)


def _far_share_float_per_row(weights, first_query, far):
    """Right values, but a Python loop adding float(...) of each row's far weights, put back on the device."""
    B, H, L, S = weights.shape
    shares = []
    for h in range(H):
        total, count = 0.0, 0
        for b in range(B):
            for r in range(L):
                i = S - L + r
                if i >= first_query:
                    total += float(weights[b, h, r, : max(i - far + 1, 0)].sum())
                    count += 1
        shares.append(total / count)
    return torch.tensor(shares, dtype=weights.dtype, device=weights.device)


def _far_share_rows_tolist(weights, first_query, far):
    """Right values, but the kept rows as a Python list (.nonzero().tolist()): a copy to the CPU."""
    L, S = weights.shape[-2:]
    query_pos = torch.arange(S - L, S, device=weights.device)
    rows = (query_pos >= first_query).nonzero().flatten().tolist()
    offset = query_pos[:, None] - torch.arange(S, device=weights.device)[None, :]
    return (weights * (offset >= far)).sum(-1)[:, :, rows].mean(dim=(0, 2))


# --- wrong answers say what is wrong --------------------------------------------------------------

@pytest.mark.parametrize(
    "check, answer, text",
    [
        (check_rotate_half_rope, lambda x, p, b: rope(x, p, b, layout="interleaved"), "interleaved layout"),
        (check_rotate_half_rope, lambda x, p, b: rope(x, p, b, sign=-1.0), "wrong way"),
        (check_rotate_half_rope, lambda x, p, b: rope(x, p, b, offset=1), "off by one"),
        (check_rotate_half_rope, lambda x, p, b: rope(x, p, b, offset=-1), "off by one"),
        (check_rotate_half_rope, lambda x, p, b: rope(x, p, b, exponent=1.0), "base \\*\\* \\(-i / D\\)"),
        (check_rotate_half_rope, lambda x, p, b: rope(x, p, b, exponent=4.0), "full\\s+head width D"),
        (check_rotate_half_rope, lambda x, p, b: rope(x, p, b, spread="repeat_interleave"), "share theta_i"),
        (check_rotate_half_rope, lambda x, p, b: rope(x, p, b, use_positions=False), "ignore the positions"),
        (check_rotate_half_rope, lambda x, p, b: rope(x, p, 10000.0), "ignore the base"),
        (check_rotate_half_rope, lambda x, p, b: rope(x, p, b)[..., :-1], "expected shape"),
        (check_rotate_half_rope, lambda x, p, b: x, "values differ"),  # no rotation at all
        (check_rotate_half_rope, _rope_package, "you called attn_course.apply_rotary_embedding"),
        (check_rotate_half_rope, _rope_bfloat16_angles, "bfloat16"),
        (check_rotate_half_rope, _rope_in_place, "changed its input `x` in place"),
        (check_rotate_half_rope, _rope_pairs_mirrored, "values differ"),
        (check_rotate_half_rope, lambda x, p, b: rope(x, p, b, spread="swap"), "swapped the cosines"),
        (check_rotate_half_rope, lambda x, p, b: rope(x, p, b, theta_order="reversed"), "wrong way: pair 0"),
        (check_rotate_half_rope, lambda x, p, b: rope(x, p, b, divisor="D - 2"), "D - 2"),
        (check_rotate_half_rope, lambda x, p, b: rope(x, p, b).long(), "floating-point"),
        (check_alibi_slopes, lambda h: slopes(h, reverse=True), "reverse order"),
        (check_alibi_slopes, lambda h: slopes(h, plain=True), "power of two"),
        (check_alibi_slopes, lambda h: slopes(h, odd=True), "1st, 3rd"),
        (check_alibi_slopes, lambda h: slopes(h, above=True), "power of two above"),
        (check_alibi_slopes, lambda h: [1.0 / 2 ** k for k in range(1, h + 1)], "slopes of 8 heads"),  # 1/2, 1/4... for any H
        (check_alibi_slopes, lambda h: slopes(h)[:-1], "expected shape"),
        (check_alibi_slopes, lambda h: slopes(h, from_zero=True), "counts heads from 1"),
        (check_alibi_slopes, lambda h: slopes(h, negative=True), "negative"),
        (check_alibi_slopes, lambda h: slopes(h, sort=True), "sorted"),
        (check_alibi_slopes, _slopes_package, "you called attn_course.alibi_slopes"),
        (check_alibi_slopes, _slopes_extras_first, "extra slope\\(s\\) first"),
        (check_alibi_slopes, _slopes_extras_from_tail, "from the end"),
        (check_alibi_slopes, lambda h: [str(s) for s in slopes(h)], "expected numbers"),
        (check_interleaved_to_halves, lambda w, h: interleaved_to_halves(w, h, mode="inverse"), "inverse permutation"),
        (check_interleaved_to_halves, lambda w, h: interleaved_to_halves(w, h, mode="global"), "all H\\*D rows at once"),
        (check_interleaved_to_halves, lambda w, h: interleaved_to_halves(w, h, mode="unchanged"), "unchanged"),
        (check_interleaved_to_halves, lambda w, h: interleaved_to_halves(w, h, mode="columns"), "scores of the converted model differ"),
        (check_interleaved_to_halves, lambda w, h: interleaved_to_halves(w, h, mode="odds first"), "odd rows first"),
        (check_interleaved_to_halves, _convert_in_place, "changed its input `weight` in place"),
        # the second review: float16 angles were called bfloat16, and rounded values were called rounded angles
        (check_rotate_half_rope, _rope_low("float16"), "angles computed in float16 .*at position"),
        (check_rotate_half_rope, _rope_low("float16 frequencies"), "angles computed in float16"),
        (check_rotate_half_rope, _rope_low(None, values=torch.float16), "precision of float16: the angles are right"),
        (check_rotate_half_rope, _rope_low(None, result=torch.bfloat16), "precision of bfloat16: the angles are right"),
        # the check module's own helpers compute the answer: forbidden
        (check_rotate_half_rope, _rope_private_helper, "you called attn_course.exercises.ch09._halves"),
        (check_alibi_slopes, _slopes_private_helper, "you called attn_course.exercises.ch09._power_of_two_slopes"),
        (check_far_share, lambda w, q, f: ch09._far_share(w, q, f), "you called attn_course.exercises.ch09._far_share"),
        # exercise 4
        (check_far_share, lambda w, q, f: far_share(w, q, f, align="top_left"), "NaN: no row was kept"),
        (check_far_share, lambda w, q, f: far_share(w, q, f, strict=True), "exactly `far` positions back"),
        (check_far_share, lambda w, q, f: far_share(w, q, f, near=True), "near share"),
        (check_far_share, lambda w, q, f: far_share(w, q, f, every_query=True), "averaged over every query"),
        (check_far_share, lambda w, q, f: far_share(w, q, f, key_mean=True), "averaged the weights over the far keys"),
        (check_far_share, lambda w, q, f: far_share(w, q, f, query_sum=True), "added up the shares"),
        (check_far_share, lambda w, q, f: far_share(w, q, f, first_sequence=True), "first sequence of the batch"),
        (check_far_share, lambda w, q, f: far_share(w, q, f, head_mean=True), "averaged over the heads"),
        (check_far_share, lambda w, q, f: far_share(w, q, f, by_key_position=True), "by their position"),
        (check_far_share, lambda w, q, f: far_share(w, q, f).mean(), "expected shape"),  # one number for all heads
        (check_far_share, lambda w, q, f: far_share(w, q, f).half(), "float16"),
        (check_far_share, lambda w, q, f: far_share(w[:, :, -1:], q, f), "values differ"),  # the last query only
        (check_far_share, _far_share_in_place, "changed its input `weights` in place"),
        # the second fresh review (chapter-09-second.md): a negative slice, tensors made on the CPU, a converter that
        # changes the dtype or the numbers
        (check_far_share, _far_share_negative_slice, "negative here"),
        (check_far_share, _far_share_cpu_only, "without device="),
        (check_rotate_half_rope, _rope_cpu_only, "without device="),
        (check_interleaved_to_halves, lambda w, h: interleaved_to_halves(w, h).float(), "float64 and your result is float32"),
        (check_interleaved_to_halves, lambda w, h: interleaved_to_halves(w, h).double(), "float32 and your result is float64"),
        (check_interleaved_to_halves, lambda w, h: -interleaved_to_halves(w, h), "not exactly the old rows moved"),
        (check_interleaved_to_halves, _convert_negate_pair, "not exactly the old rows moved"),
        # the third fresh review (chapter-09-third.md)
        (check_rotate_half_rope, _rope_positions_bfloat16, "angles computed in bfloat16 .*at position 2001"),
        (check_rotate_half_rope, _rope_on_the_cpu, "copies data out of the inputs to the CPU|your result is on cpu"),
        (check_far_share, _far_share_on_the_cpu, "copies data out of the inputs to the CPU|your result is on cpu"),
        (check_far_share, _far_share_either_side, "either side \\(\\|i - j\\| >= far\\)"),
        (check_alibi_slopes, lambda h: torch.tensor(slopes(h), dtype=torch.float16), "slopes are float16, rounded"),
        (check_alibi_slopes, lambda h: np.array(slopes(h), dtype=np.float16), "slopes are float16, rounded"),
        (check_alibi_slopes, lambda h: torch.tensor(slopes(h), dtype=torch.bfloat16), "slopes are bfloat16, rounded"),
        (check_interleaved_to_halves, _convert_negate_second_half, "is not one of head 0's rows as they were"),
        (check_interleaved_to_halves, lambda w, h: interleaved_to_halves(w, h, mode="columns"), "leaves the columns"),
        (check_interleaved_to_halves, _convert_rows_reversed, "not in the order the half layout needs"),
        # the fourth fresh review (chapter-09-fourth.md): half-precision inputs
        (check_rotate_half_rope, _rope_angles_in_input_dtype, "angles computed in bfloat16 .*at position 2001.* x is "
                                                              "bfloat16 here"),
        (check_rotate_half_rope, _rope_positions_float16, "angles computed in float16 .*at position 2049"),
        # the fifth fresh review (chapter-09-fifth.md): values read on the host, which the meta device cannot run (so
        # they were not judged there): run on the CPU under the watch, named on every device
        (check_rotate_half_rope, _rope_float_per_position, "brings a value from the device to the host \\(float\\(\\) "
                                                           "of a tensor\\)"),
        (check_rotate_half_rope, _rope_table_sized_by_item, "brings a value from the device to the host \\(\\.item"),
        (check_far_share, _far_share_float_per_row, "brings a value from the device to the host \\(float\\(\\) of a "
                                                    "tensor\\)"),
        (check_far_share, _far_share_rows_tolist, "brings a value from the device to the host \\(\\.tolist"),
    ],
)
def test_wrong_answers_are_rejected_with_a_reason(check, answer, text):
    feedback = check(answer)
    assert feedback.status == "incorrect", str(feedback)
    assert not feedback
    assert re.search(text, feedback.message), feedback.message


@pytest.mark.parametrize("check", [check_rotate_half_rope, check_alibi_slopes, check_interleaved_to_halves,
                                   check_far_share])
def test_scaffolds_and_crashes(check):
    assert check(_scaffold).status == "not attempted"
    assert check(...).status == "not attempted"

    def crash(*args):
        raise RuntimeError("boom")

    feedback = check(crash)
    assert feedback.status == "error" and "boom" in feedback.message and feedback.hint
