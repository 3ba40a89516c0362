"""The exercise checks of chapter 08: right answers (and right answers written another way) pass,
each plausible wrong answer is rejected with a message that names the mistake, crashes are reported
without a traceback, and the untouched scaffold counts as not attempted."""

import functools
import math

import pytest
import torch
import torch.nn.functional as F

import attn_course as ac
import numpy as np

from attn_course.exercises.ch08 import (
    check_causal_tile_attention,
    check_cache_attention_step,
    check_kv_cache_bytes,
    check_merge_states,
    check_online_softmax_update,
)


def _scaffold(*args):
    ...


# --- right answers, with switches that turn them into the plausible wrong ones --------------------

def update(running_max, running_sum, block, rescale=True, axis=-1, global_max=False):
    block_max = block.amax() if global_max else block.amax(dim=axis)
    new_max = torch.maximum(running_max, block_max)
    if global_max:
        new_max = new_max.max().expand_as(running_max)
    old = running_sum * torch.exp(running_max - new_max) if rescale else running_sum
    return new_max, old + torch.exp(block - new_max[:, None]).sum(dim=-1)


def causal_tile(query_tile, keys, values, first_query, block_size, mask=True, skip=True, strict=False,
                from_zero=False, scale=True, normalise=True, stable=True, early=False, shared_max=None):
    Lb, D = query_tile.shape
    kw = dict(dtype=query_tile.dtype, device=query_tile.device)
    m = torch.full((Lb, 1), float("-inf"), **kw)  # (Lb, 1)
    l = torch.zeros(Lb, 1, **kw)
    acc = torch.zeros(Lb, values.size(1), **kw)  # (Lb, Dv)
    positions = first_query + torch.arange(Lb, device=query_tile.device)[:, None] - (first_query if from_zero else 0)
    last = first_query + Lb - 1
    tiles = 0
    for k_start in range(0, keys.size(0), block_size):
        if skip and (k_start >= last if early else k_start > last):
            break
        tiles += 1
        scores = query_tile @ keys[k_start:k_start + block_size].T / (math.sqrt(D) if scale else 1.0)  # (Lb, Sb)
        key_positions = k_start + torch.arange(scores.size(1), device=scores.device)[None, :]
        if mask:
            blocked = key_positions >= positions if strict else key_positions > positions
            scores = scores.masked_fill(blocked, float("-inf"))
        if stable:
            if shared_max is None:
                m_new = torch.maximum(m, scores.amax(dim=1, keepdim=True))
            else:  # wrong: one maximum for every row of the tile, s.amax() or over dim 0 then over the keys
                tile_max = scores.amax() if shared_max == "all" else scores.amax(dim=0, keepdim=True).amax(dim=1, keepdim=True)
                m_new = torch.maximum(m, tile_max).expand(Lb, 1)
            p = torch.exp(scores - m_new)
            correction = torch.nan_to_num(torch.exp(m - m_new), nan=0.0) if shared_max else torch.exp(m - m_new)
            l = l * correction + p.sum(dim=1, keepdim=True)
            acc = acc * correction + p @ values[k_start:k_start + block_size]
            m = m_new
        else:
            p = torch.exp(scores)
            l = l + p.sum(dim=1, keepdim=True)
            acc = acc + p @ values[k_start:k_start + block_size]
    return (acc / l if normalise else acc), tiles


def merge(state_a, state_b, rescale_l=True, rescale_acc=True, global_max=False, guard=True):
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = state_a, state_b
    m = torch.maximum(m_a, m_b)  # (R,)
    if global_max:
        m = m[torch.isfinite(m)].max().expand_as(m)
    reference = torch.where(torch.isfinite(m), m, torch.zeros_like(m)) if guard else m  # 0 for an infinite max
    scale_a, scale_b = torch.exp(m_a - reference), torch.exp(m_b - reference)  # (R,)
    l = (l_a * scale_a if rescale_l else l_a) + (l_b * scale_b if rescale_l else l_b)
    acc = (acc_a * scale_a[:, None] if rescale_acc else acc_a) + (acc_b * scale_b[:, None] if rescale_acc else acc_b)
    return m, l, acc


def merge_relative_to_b(state_a, state_b):
    """Wrong (the review's): everything measured against m_b, which overflows exp(m_a - m_b) when m_a is far above."""
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = state_a, state_b
    reference = torch.where(torch.isfinite(m_b), m_b, torch.zeros_like(m_b))
    scale_a = torch.exp(m_a - reference)
    return m_b, l_a * scale_a + l_b, acc_a * scale_a[:, None] + acc_b


def merge_inverted(state_a, state_b):
    """Wrong: the factors exp(m - m_part), 1 or more, which overflow when the maxima lie 1000 apart."""
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = state_a, state_b
    m = torch.maximum(m_a, m_b)
    reference = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    scale_a, scale_b = torch.exp(reference - m_a), torch.exp(reference - m_b)
    return m, l_a * scale_a + l_b * scale_b, acc_a * scale_a[:, None] + acc_b * scale_b[:, None]


def merge_by_logsumexp(state_a, state_b):  # another right answer: keep (log-sum-exp, normalised output) per part
    def parts(state):
        m, l, acc = state
        lse = torch.where(l > 0, m + torch.log(l), torch.full_like(m, float("-inf")))  # (R,)
        out = torch.where(l[:, None] > 0, acc / l.clamp_min(1e-300)[:, None], torch.zeros_like(acc))  # (R, Dv)
        return lse, out
    (lse_a, out_a), (lse_b, out_b) = parts(state_a), parts(state_b)
    lse = torch.logaddexp(lse_a, lse_b)  # (R,)
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    w_a, w_b = torch.exp(lse_a - safe), torch.exp(lse_b - safe)  # shares of the softmax mass
    out = w_a[:, None] * out_a + w_b[:, None] * out_b  # (R, Dv): the normalised output
    m = torch.maximum(state_a[0], state_b[0])  # the state's maximum ...
    l = torch.where(torch.isfinite(lse), torch.exp(lse - torch.where(torch.isfinite(m), m, lse)), torch.zeros_like(lse))
    return m, l, out * l[:, None]  # ... its sum exp(lse - m), and acc = output * l


def kv_cache_bytes(num_layers, num_heads, head_dim, seq_len, batch_size, bytes_per_number):
    return 2 * num_layers * num_heads * head_dim * seq_len * batch_size * bytes_per_number


GPT2_TOKENS = 64 * 2**30 / kv_cache_bytes(12, 12, 64, 1, 1, 2)


def cache_attention_step(query, key, value, cache_keys, cache_values, length, *, align="bottom_right", mask=True,
                         offset=True, in_place=True, whole=False, scale=True, inverted=False):
    T = query.size(2)
    at = length if offset else 0
    if in_place:
        cache_keys[:, :, at:at + T], cache_values[:, :, at:at + T] = key, value
        S = cache_keys.size(2) if whole else length + T
        keys, values = cache_keys[:, :, :S], cache_values[:, :, :S]  # (B, H, S, D)
    else:  # torch.cat: new tensors, the buffers unchanged
        keys = torch.cat([cache_keys[:, :, :length], key], dim=2)
        values = torch.cat([cache_values[:, :, :length], value], dim=2)
        S = length + T
    allowed = ac.causal_mask(T, S, align=align, device=query.device) if mask else None  # (T, S), True = may attend
    if inverted:
        allowed = ~allowed
    return F.scaled_dot_product_attention(query, keys, values, attn_mask=allowed, scale=None if scale else 1.0)


def cache_step_by_hand(query, key, value, cache_keys, cache_values, length):
    """Another right answer: explicit scores and an index-built mask instead of F.sdpa and ac.causal_mask."""
    T, D = query.size(2), query.size(-1)
    cache_keys[:, :, length:length + T] = key
    cache_values[:, :, length:length + T] = value
    keys, values = cache_keys[:, :, :length + T], cache_values[:, :, :length + T]
    scores = query @ keys.transpose(-2, -1) / math.sqrt(D)  # (B, H, T, S)
    key_position = torch.arange(length + T, device=query.device)
    query_position = length + torch.arange(T, device=query.device)
    blocked = key_position[None, :] > query_position[:, None]  # (T, S): True = a later token
    return scores.masked_fill(blocked, float("-inf")).softmax(dim=-1) @ values  # (B, H, T, D)


def test_right_answers_pass():
    for feedback in (check_online_softmax_update(update), check_causal_tile_attention(causal_tile),
                     check_merge_states(merge), check_kv_cache_bytes(kv_cache_bytes, GPT2_TOKENS),
                     check_cache_attention_step(cache_attention_step)):
        assert feedback.status == "correct", str(feedback)
        assert bool(feedback)
    assert "16 GiB" in check_kv_cache_bytes(kv_cache_bytes, GPT2_TOKENS).message


def test_other_right_answers_pass():
    assert check_merge_states(merge_by_logsumexp)
    assert check_cache_attention_step(cache_step_by_hand)
    assert check_kv_cache_bytes(kv_cache_bytes, round(GPT2_TOKENS))  # rounded to a whole token
    assert check_kv_cache_bytes(kv_cache_bytes, int(GPT2_TOKENS))
    assert check_kv_cache_bytes(lambda *a: torch.tensor(kv_cache_bytes(*a)), torch.tensor(GPT2_TOKENS))
    for near in (1.86e6, 1.864e6, np.float64(GPT2_TOKENS), np.int64(round(GPT2_TOKENS))):  # "the order of magnitude"
        assert check_kv_cache_bytes(kv_cache_bytes, near), near
    assert check_kv_cache_bytes(lambda *a: np.prod(a) * 2, GPT2_TOKENS)  # numpy arithmetic on numpy integers


def test_float32_answers_pass():
    assert check_online_softmax_update(lambda m, s, b: tuple(t.double() for t in update(m.float(), s.float(), b.float())))
    # (exercise 2 asks for the inputs' dtype: its float32 answer is in the wrong-answer table)


def update_logsumexp(running_max, running_sum, block):
    """Another right answer: through the log of the sum, with torch.logaddexp."""
    new_max = torch.maximum(running_max, block.amax(dim=-1))
    safe = torch.where(torch.isfinite(new_max), new_max, torch.zeros_like(new_max))
    log_old = torch.log(running_sum) + running_max - safe
    log_new = torch.logsumexp(block - safe[:, None], dim=-1)
    return new_max, torch.exp(torch.logaddexp(log_old, log_new))


def causal_tile_by_ceil(query_tile, keys, values, first_query, block_size):
    """Another right answer: the number of tiles computed first, a tensor count, the mask built with where."""
    Lb, D = query_tile.shape
    count = min(-(-(first_query + Lb) // block_size), -(-keys.size(0) // block_size))
    kw = dict(dtype=query_tile.dtype, device=query_tile.device)
    state = [torch.full((Lb,), float("-inf"), **kw), torch.zeros(Lb, **kw), torch.zeros(Lb, values.size(1), **kw)]
    for tile in range(count):
        ks = slice(tile * block_size, (tile + 1) * block_size)
        s = torch.einsum("qd,kd->qk", query_tile, keys[ks]) / D ** 0.5
        visible = (torch.arange(ks.start, ks.start + s.size(1), device=s.device)[None, :]
                   <= first_query + torch.arange(Lb, device=s.device)[:, None])
        s = torch.where(visible, s, torch.tensor(float("-inf"), dtype=s.dtype, device=s.device))
        m = torch.maximum(state[0], s.max(dim=1).values)
        c = torch.exp(state[0] - m)
        p = torch.exp(s - m[:, None])
        state = [m, state[1] * c + p.sum(1), state[2] * c[:, None] + p @ values[ks]]
    return state[2] / state[1][:, None], torch.tensor(count)


def tile_loop_variant(q, k, v, first, block_size, kind):
    """The loop with one of its rescalings wrong ("m first": m updated before exp(m - m_new), which is then 1)."""
    Lb, D = q.shape
    m = torch.full((Lb, 1), float("-inf"), dtype=q.dtype)
    l, acc = torch.zeros(Lb, 1, dtype=q.dtype), torch.zeros(Lb, v.size(1), dtype=q.dtype)
    tiles = 0
    for start in range(0, k.size(0), block_size):
        if start > first + Lb - 1:
            break
        tiles += 1
        s = q @ k[start:start + block_size].T / math.sqrt(D)
        s = s.masked_fill(start + torch.arange(s.size(1))[None, :] > first + torch.arange(Lb)[:, None], float("-inf"))
        new = torch.maximum(m, s.amax(1, keepdim=True))
        p = torch.exp(s - new)
        if kind == "m first":
            m = new
        correction = torch.exp(m - new)
        l = (l if kind == "sum not rescaled" else l * correction) + p.sum(1, keepdim=True)
        acc = (acc if kind == "acc not rescaled" else acc * correction) + p @ v[start:start + block_size]
        m = new
    return acc / l, tiles


def causal_tile_no_loop(query_tile, keys, values, first_query, block_size, needed_keys_only=False):
    """Wrong: every score at once (of all keys, or of the keys in the tiles it needs), the tile count by formula."""
    Lb, D = query_tile.shape
    tiles = min(math.ceil((first_query + Lb) / block_size), math.ceil(keys.size(0) / block_size))
    S = tiles * block_size if needed_keys_only else keys.size(0)
    scores = query_tile @ keys[:S].T / math.sqrt(D)  # (Lb, S)
    blocked = torch.arange(scores.size(1))[None, :] > first_query + torch.arange(Lb)[:, None]
    p = torch.exp(scores.masked_fill(blocked, float("-inf")) - scores.masked_fill(blocked, float("-inf")).amax(1, keepdim=True))
    return (p @ values[:S]) / p.sum(1, keepdim=True), tiles


def causal_tile_reads_every_tile(query_tile, keys, values, first_query, block_size):
    """Wrong: the loop visits every tile (the masked ones give weights of 0) but reports only the needed ones."""
    output, _ = causal_tile(query_tile, keys, values, first_query, block_size, skip=False)
    return output, min(math.ceil((first_query + query_tile.size(0)) / block_size), math.ceil(keys.size(0) / block_size))


def causal_tile_elementwise(query_tile, keys, values, first_query, block_size):
    """Another right answer: the loop with products written as broadcast multiplications and sums (no matmul)."""
    Lb, D = query_tile.shape
    kw = dict(dtype=query_tile.dtype, device=query_tile.device)
    m, l, acc = torch.full((Lb,), float("-inf"), **kw), torch.zeros(Lb, **kw), torch.zeros(Lb, values.size(1), **kw)
    tiles = 0
    for start in range(0, first_query + Lb, block_size):
        if start >= keys.size(0):
            break
        tiles += 1
        k, v = keys[start:start + block_size], values[start:start + block_size]
        s = (query_tile[:, None, :] * k[None, :, :]).sum(-1) / math.sqrt(D)  # (Lb, Sb)
        arange = functools.partial(torch.arange, device=s.device)
        s = s.masked_fill(start + arange(k.size(0))[None, :] > first_query + arange(Lb)[:, None], float("-inf"))
        new = torch.maximum(m, s.amax(1))
        p, c = torch.exp(s - new[:, None]), torch.exp(m - new)
        l, acc, m = l * c + p.sum(1), acc * c[:, None] + (p[:, :, None] * v[None]).sum(1), new
    return acc / l[:, None], tiles


def test_other_right_answers_pass_for_exercises_1_and_2():
    assert check_causal_tile_attention(causal_tile_elementwise), str(check_causal_tile_attention(causal_tile_elementwise))
    assert check_online_softmax_update(update_logsumexp), str(check_online_softmax_update(update_logsumexp))
    assert check_causal_tile_attention(causal_tile_by_ceil), str(check_causal_tile_attention(causal_tile_by_ceil))


def update_unshifted_float64(running_max, running_sum, block):
    """Wrong (second review): no max shift at all, exponentials of raw scores in float64, cast back: e^100 fits
    in float64, so the float32 stream near 100 passed; exp(1000) does not."""
    new_max = torch.maximum(running_max, block.amax(dim=-1))
    total = running_sum.double() * torch.exp(running_max.double()) + torch.exp(block.double()).sum(-1)
    return new_max, (total / torch.exp(new_max.double())).to(block.dtype)


def update_rescaled_after(running_max, running_sum, block):
    """Wrong (third review): exponentiates score - old maximum, positive when the block raises the maximum, and
    rescales the sum afterwards; right in exact arithmetic, inf when the maximum jumps by more than 88.7 (float32)."""
    new_max = torch.maximum(running_max, block.amax(dim=-1))
    reference = torch.where(torch.isinf(running_max), new_max, running_max)
    return new_max, (running_sum + torch.exp(block - reference[:, None]).sum(-1)) * torch.exp(reference - new_max)


def causal_tile_rescaled_after(query_tile, keys, values, first_query, block_size, upcast=False):
    """Wrong (third review): the same mistake inside the tile loop, p = exp(s - old m), then both rescaled by
    exp(old m - m_new); with upcast, computed in float64 and cast back (finite near 100, not near 1000)."""
    dtype = query_tile.dtype
    if upcast:
        query_tile, keys, values = query_tile.double(), keys.double(), values.double()
    Lb, D = query_tile.shape
    kw = dict(dtype=query_tile.dtype, device=query_tile.device)
    m, l, acc = torch.full((Lb, 1), float("-inf"), **kw), torch.zeros(Lb, 1, **kw), torch.zeros(Lb, values.size(1), **kw)
    positions = first_query + torch.arange(Lb, device=query_tile.device)[:, None]
    tiles = 0
    for start in range(0, min(keys.size(0), first_query + Lb), block_size):
        tiles += 1
        s = query_tile @ keys[start:start + block_size].T / math.sqrt(D)
        s = s.masked_fill(start + torch.arange(s.size(1), device=s.device)[None] > positions, float("-inf"))
        new = torch.maximum(m, s.amax(1, keepdim=True))
        reference = torch.where(torch.isinf(m), new, m)
        p, c = torch.exp(s - reference), torch.exp(reference - new)
        l, acc, m = (l + p.sum(1, keepdim=True)) * c, (acc + p @ values[start:start + block_size]) * c, new
    return (acc / l).to(dtype), tiles


def update_float64_result(running_max, running_sum, block):
    """Right formulas, float64 result for float32 inputs: passes, by the course's dtype policy (as does the reverse)."""
    return update(running_max.double(), running_sum.double(), block.double())


def causal_tile_broadcast(query_tile, keys, values, first_query, block_size):
    """Wrong (second review): no loop, every visible score at once by broadcasting (no matrix product to count)."""
    Lb, D = query_tile.shape
    tiles = min(math.ceil((first_query + Lb) / block_size), math.ceil(keys.size(0) / block_size))
    S = first_query + Lb
    s = (query_tile[:, None] * keys[:S][None]).sum(-1) / math.sqrt(D)  # (Lb, S)
    arange = functools.partial(torch.arange, device=s.device)
    s = s.masked_fill(arange(S)[None] > first_query + arange(Lb)[:, None], float("-inf"))
    p = torch.exp(s - s.amax(1, keepdim=True))
    return (p[:, :, None] * values[:S][None]).sum(1) / p.sum(1, keepdim=True), tiles


def causal_tile_per_row(query_tile, keys, values, first_query, block_size):
    """Wrong (second review): no tile loop, one product per query row over all its keys (enough products)."""
    Lb, D = query_tile.shape
    tiles = min(math.ceil((first_query + Lb) / block_size), math.ceil(keys.size(0) / block_size))
    rows = []
    for i in range(Lb):
        s = keys[:first_query + i + 1] @ query_tile[i] / math.sqrt(D)
        p = torch.exp(s - s.max())
        rows.append(p @ values[:first_query + i + 1] / p.sum())
    return torch.stack(rows), tiles


def causal_tile_two_pass(query_tile, keys, values, first_query, block_size, recompute=False):
    """Wrong (fourth review): not online. The first pass computes every tile's scores (stored, or only their
    maximum kept and the scores recomputed), the second exponentiates them against the overall maximum."""
    Lb, D = query_tile.shape
    positions = first_query + torch.arange(Lb, device=query_tile.device)[:, None]
    starts = [start for start in range(0, keys.size(0), block_size) if start <= first_query + Lb - 1]

    def scores_of(start):
        s = query_tile @ keys[start:start + block_size].T / math.sqrt(D)  # (Lb, Sb)
        return s.masked_fill(start + torch.arange(s.size(1), device=s.device)[None, :] > positions, float("-inf"))

    tiles = [scores_of(start) for start in starts]
    m = torch.cat(tiles, dim=1).amax(dim=1, keepdim=True)  # the overall maximum, before any exponential
    l, acc = 0.0, 0.0
    for start, s in zip(starts, tiles):
        p = torch.exp((scores_of(start) if recompute else s) - m)
        l, acc = l + p.sum(dim=1, keepdim=True), acc + p @ values[start:start + block_size]
    return acc / l, len(starts)


def cache_step_without_max_shift(query, key, value, cache_keys, cache_values, length):
    """Wrong (fourth review): a hand-written softmax that does not subtract the row maximum (inf near 100)."""
    T, S = query.size(2), length + query.size(2)
    cache_keys[:, :, length:S], cache_values[:, :, length:S] = key, value
    scores = query @ cache_keys[:, :, :S].transpose(-2, -1) / math.sqrt(query.size(-1))  # (B, H, T, S)
    allowed = torch.ones(T, S, dtype=torch.bool, device=query.device).tril(diagonal=length)
    e = torch.exp(scores) * allowed
    return e / e.sum(-1, keepdim=True) @ cache_values[:, :, :S]


def causal_tile_fixed_device(query_tile, keys, values, first_query, block_size):
    """Wrong on a GPU (second review): m, l, acc and the positions made without device=."""
    Lb, D = query_tile.shape
    m = torch.full((Lb, 1), float("-inf"), dtype=query_tile.dtype)
    l, acc = torch.zeros(Lb, 1, dtype=query_tile.dtype), torch.zeros(Lb, values.size(1), dtype=query_tile.dtype)
    tiles = 0
    for start in range(0, min(keys.size(0), first_query + Lb), block_size):
        tiles += 1
        s = query_tile @ keys[start:start + block_size].T / math.sqrt(D)
        s = s.masked_fill(start + torch.arange(s.size(1))[None] > first_query + torch.arange(Lb)[:, None], float("-inf"))
        new = torch.maximum(m, s.amax(1, keepdim=True))
        p, c = torch.exp(s - new), torch.exp(m - new)
        l, acc, m = l * c + p.sum(1, keepdim=True), acc * c + p @ values[start:start + block_size], new
    return acc / l, tiles


def merge_float32(state_a, state_b):
    """Right, float32 result of float64 states: passes, by the course's dtype policy."""
    return tuple(x.float() for x in merge(state_a, state_b))


def test_the_dtype_policy_of_exercises_1_and_3():
    assert check_online_softmax_update(update_float64_result), str(check_online_softmax_update(update_float64_result))
    assert check_merge_states(merge_float32), str(check_merge_states(merge_float32))


def test_the_question_is_part_of_exercise_3():
    feedback = check_kv_cache_bytes(kv_cache_bytes)  # the function alone, no answer to the question yet
    assert feedback.status == "not attempted"
    assert check_kv_cache_bytes(kv_cache_bytes, ...).status == "not attempted"


# --- wrong answers say what is wrong -------------------------------------------------------------

def update_floored(running_max, running_sum, block, floor=-1e4, reference_only=False):
    """The eighth review's accepted answer: the running maximum (or only the exponent's reference) floored at a
    finite value; every exponential underflows to 0 where the scores lie below the floor."""
    new_max = torch.maximum(running_max, block.amax(dim=-1))
    reference = new_max.clamp(min=floor)
    new_sum = running_sum * torch.exp(running_max - reference) + torch.exp(block - reference[:, None]).sum(dim=-1)
    if reference_only:
        return new_max, new_sum * torch.exp(reference - new_max)
    return reference, new_sum


def merge_floored(state_a, state_b, floor=-1e4, floor_m=False):
    """The eighth review's accepted answer: the reference maximum of the merge floored at a finite value."""
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = state_a, state_b
    m = torch.maximum(m_a, m_b)
    reference = m.clamp(min=floor)
    s_a, s_b = torch.exp(m_a - reference), torch.exp(m_b - reference)
    return (reference if floor_m else m), l_a * s_a + l_b * s_b, acc_a * s_a[:, None] + acc_b * s_b[:, None]


FLOORED = "started or floored at a finite value"


def cache_step_whole_buffer_masked(query, key, value, cache_keys, cache_values, length):
    """Writes in place, then attends over the whole max_len buffer with the slots after length + T masked."""
    T, S = query.size(2), cache_keys.size(2)
    cache_keys[:, :, length:length + T], cache_values[:, :, length:length + T] = key, value
    allowed = torch.ones(T, S, dtype=torch.bool, device=query.device).tril(diagonal=length)  # (T, S)
    return F.scaled_dot_product_attention(query, cache_keys, cache_values, attn_mask=allowed)

@pytest.mark.parametrize(
    "check, answer, text",
    [
        # exercise 1: no rescaling, per-column or global maximum, not a pair, a wrong sum
        (check_online_softmax_update, lambda m, s, b: update(m, s, b, rescale=False), "multiply it by exp(running_max - new_max)"),
        (check_online_softmax_update, lambda m, s, b: (b.amax(dim=0), s), "over dim 0"),
        (check_online_softmax_update, lambda m, s, b: update(m, s, b, global_max=True), "not global"),
        (check_online_softmax_update, lambda m, s, b: (b.max(), s), "one number for all rows"),
        (check_online_softmax_update, lambda m, s, b: (b.amax(dim=-1), s), "new_max"),
        (check_online_softmax_update, lambda m, s, b: update(m, s, b)[0], "return a pair"),
        (check_online_softmax_update, lambda m, s, b: (update(m, s, b)[0], torch.exp(b).sum(-1)), "new_sum"),
        (check_online_softmax_update, lambda m, s, b: (torch.maximum(m, b.amax(-1)),
                                                       (s * torch.exp(m) + torch.exp(b).sum(-1)) * torch.exp(-torch.maximum(m, b.amax(-1)))),
         "overflows float32"),  # the review's accepted answer: right in exact arithmetic, inf near 100
        (check_online_softmax_update, update_unshifted_float64, "overflows even float64"),
        # the third review's accepted answers: exp(score - old maximum), positive when a block raises the maximum,
        # rescaled afterwards (inf where the maximum jumps by 100 in float32, or by 1000 in float64)
        (check_online_softmax_update, update_rescaled_after, "You exponentiated score - old maximum"),
        (check_online_softmax_update, lambda m, s, b: tuple(x.to(b.dtype) for x in update_rescaled_after(m.double(), s.double(), b.double())),
         "jumps by about 1000"),
        (check_causal_tile_attention, causal_tile_rescaled_after, "against the old running maximum"),
        (check_causal_tile_attention, lambda *a: causal_tile_rescaled_after(*a, upcast=True), "raises the maximum by about 1000"),
        (check_online_softmax_update, lambda m, s, b: tuple(x.double() for x in update_unshifted_float64(m, s, b)),
         "overflows even float64"),
        # exercise 2 (second review): no loop by broadcasting, one product per query row, a fixed device, and the
        # loop stopped one tile early (named, not taken for a NaN of blocked keys)
        (check_causal_tile_attention, causal_tile_broadcast, "all at once (by broadcasting, or one query row"),
        (check_causal_tile_attention, causal_tile_per_row, "before its first exponential"),  # a row's keys at once
        (check_causal_tile_attention, causal_tile_fixed_device, "the meta device"),
        (check_causal_tile_attention, lambda *a: causal_tile(*a, early=True), "your loop stops too early"),
        (check_online_softmax_update, lambda m, s, b: (torch.maximum(m, b.amax(-1)),
                                                       s * torch.exp(torch.maximum(m, b.amax(-1)) - m)
                                                       + torch.exp(b - torch.maximum(m, b.amax(-1))[:, None]).sum(-1)),
         "the other way"),
        (check_online_softmax_update, lambda m, s, b: (lambda n: (n, s * torch.exp(m - n) + torch.softmax(b, -1).sum(-1)))(
            torch.maximum(m, b.amax(-1))), "torch.softmax"),
        (check_causal_tile_attention, lambda q, k, v, f, n: causal_tile(q, k, v, f, n, mask=False), "every query sees every key"),
        (check_causal_tile_attention, lambda q, k, v, f, n: causal_tile(q, k, v, f, n, mask=False, skip=False), "every query sees every key"),
        (check_causal_tile_attention, lambda q, k, v, f, n: causal_tile(q, k, v, f, n, strict=True), "hides its own key"),
        (check_causal_tile_attention, lambda q, k, v, f, n: causal_tile(q, k, v, f, n, from_zero=True), "counts the queries' positions from 0"),
        (check_causal_tile_attention, lambda q, k, v, f, n: causal_tile(q, k, v, f, n, scale=False), "sqrt(D)"),
        (check_causal_tile_attention, lambda q, k, v, f, n: causal_tile(q, k, v, f, n, normalise=False), "not divided by the running sum"),
        (check_causal_tile_attention, lambda q, k, v, f, n: causal_tile(q, k, v, f, n, skip=False), "skip them"),
        (check_causal_tile_attention, lambda q, k, v, f, n: causal_tile(q, k, v, f, n, stable=False), "overflows float32"),
        (check_causal_tile_attention, lambda q, k, v, f, n: causal_tile(q, k, v, f, n)[0], "return a pair"),
        (check_causal_tile_attention, lambda q, k, v, f, n: (causal_tile(q, k, v, f, n)[0], 1.0 * causal_tile(q, k, v, f, n)[1]), "integer"),
        (check_causal_tile_attention, lambda q, k, v, f, n: tile_loop_variant(q, k, v, f, n, "acc not rescaled"),
         "but not the accumulator acc"),
        (check_causal_tile_attention, lambda q, k, v, f, n: tile_loop_variant(q, k, v, f, n, "sum not rescaled"),
         "but not the running sum l"),
        (check_causal_tile_attention, lambda q, k, v, f, n: tile_loop_variant(q, k, v, f, n, "m first"),
         "neither l nor acc is rescaled"),
        # the review's accepted answers: no loop, all keys at once; and the loop over every tile, counted right
        (check_causal_tile_attention, causal_tile_no_loop, "must not be read at all"),
        (check_causal_tile_attention, causal_tile_reads_every_tile, "must not be read at all"),
        # the fourth review's accepted answer: two passes, the overall maximum taken before any exponential
        (check_causal_tile_attention, causal_tile_two_pass, "before its first exponential"),
        (check_causal_tile_attention, functools.partial(causal_tile_two_pass, recompute=True), "two passes over the keys"),
        # the fourth review's accepted answer to exercise 5: a softmax without its max shift, on scores near 100
        (check_cache_attention_step, cache_step_without_max_shift, "overflows float32"),
        # the thirteenth review's accepted answer: attention over all max_len slots, the unwritten ones masked (it
        # passed on zero-filled buffers; the buffers' empty slots now hold NaN, as torch.empty's may)
        (check_cache_attention_step, cache_step_whole_buffer_masked, "empty ones too"),
        (check_causal_tile_attention, lambda q, k, v, f, n: causal_tile_no_loop(q, k, v, f, n, needed_keys_only=True),
         "all at once"),
        # the review's accepted answer: the accumulators made without dtype=, so float32 for float64 inputs
        (check_causal_tile_attention, lambda q, k, v, f, n: (causal_tile(q.float(), k.float(), v.float(), f, n)[0],
                                                             causal_tile(q, k, v, f, n)[1]), "dtype=query_tile.dtype"),
        (check_causal_tile_attention, lambda q, k, v, f, n: (torch.nn.functional.scaled_dot_product_attention(
            q[None], k[None], v[None], is_causal=True)[0], 1), "you called"),
        # exercise 2: no rescaling, l only, the mean of the outputs, a global maximum, NaN for empty rows
        (check_merge_states, lambda a, b: merge(a, b, rescale_l=False, rescale_acc=False), "as they are"),
        (check_merge_states, lambda a, b: merge(a, b, rescale_acc=False), "but not the accumulators"),
        (check_merge_states, lambda a, b: (torch.maximum(a[0], b[0]), torch.full_like(a[1], 2.0),
                                           a[2] / a[1][:, None] + b[2] / b[1][:, None]), "mean of the two partial outputs"),
        (check_merge_states, lambda a, b: merge(a, b, global_max=True), "global"),
        (check_merge_states, lambda a, b: merge(a, b, guard=False), "exp(-inf - (-inf))"),
        (check_merge_states, lambda a, b: merge(a, b)[:2], "return a triple"),
        # the review's accepted answers: m not the maximum (relative to m_b), m = 0 or NaN for a row that saw nothing
        (check_merge_states, merge_relative_to_b, "the larger of the two maxima"),
        (check_merge_states, merge_inverted, "must be at most 1"),
        (check_merge_states, lambda a, b: (lambda m, l, acc: (torch.where(torch.isfinite(m), m, torch.zeros_like(m)), l, acc))(
            *merge(a, b)), "must stay -inf"),
        (check_merge_states, lambda a, b: (lambda m, l, acc: (torch.where(torch.isfinite(m), m, torch.full_like(m, math.nan)),
                                                              l, acc))(*merge(a, b)), "must stay -inf"),
        (check_merge_states, lambda a, b: (lambda m, l, acc: (m + torch.log(l), torch.ones_like(l), acc / l[:, None]))(
            *merge(a, b)), "renormalised state"),  # the log-sum-exp returned as m (and -inf, NaN rows)
        (check_merge_states, lambda a, b: (lambda m, l, acc: (m, l, acc.T))(*merge(a, b)), "expected shape (7, 3)"),
        (check_merge_states, lambda a, b: (lambda m, l, acc: (m, l + 1e-3, acc))(*merge(a, b)), "values differ"),
        # the eighth review's accepted answers: a maximum or reference floored at a finite value (exercises 1 and 3)
        *((check_online_softmax_update, functools.partial(update_floored, floor=c, reference_only=r), FLOORED)
          for c in (-1e4, -1e9, -1e30) for r in (False, True)),
        *((check_merge_states, functools.partial(merge_floored, floor=c), FLOORED) for c in (-1e3, -1e4, -1e9, -1e30)),
        (check_merge_states, lambda a, b: (lambda m, l, acc: (torch.where(l > 0, m, torch.maximum(a[0], b[0])), l, acc))(
            *merge_floored(a, b, floor_m=True)), FLOORED),  # floored m returned, the true one where l underflowed
        (check_merge_states, functools.partial(merge_floored, floor=-1e30, floor_m=True), "must stay -inf"),
        # exercise 3: half (keys only), one layer, one sequence, numbers not bytes, and the question
        # the ninth review's wrongly named answers: a maximum shared by all the rows of a tile (named as overflow
        # before), and a merged acc or l rounded through a 16-bit dtype and back (plain "values differ" before)
        (check_causal_tile_attention, lambda q, k, v, f, n: causal_tile(q, k, v, f, n, shared_max="all"),
         "one running maximum is shared by all the rows of the tile"),
        (check_causal_tile_attention, lambda q, k, v, f, n: causal_tile(q, k, v, f, n, shared_max="dim 0"),
         "s.amax(dim=1, keepdim=True), one per row"),
        (check_merge_states, lambda a, b: (lambda m, l, acc: (m, l, acc.bfloat16().to(acc.dtype)))(*merge(a, b)),
         "acc: every number of it is one that bfloat16 holds exactly"),
        (check_merge_states, lambda a, b: (lambda m, l, acc: (m, l.half().to(l.dtype), acc))(*merge(a, b)),
         "l: every number of it is one that float16 holds exactly"),
        (check_merge_states, lambda a, b: (lambda m, l, acc: (m, l.bfloat16().to(l.dtype), acc))(*merge(a, b)),
         "rounded it through a 16-bit dtype"),
        (check_kv_cache_bytes, lambda *a: kv_cache_bytes(*a) // 2, "keys *and* values"),
        # the fourteenth review: bytes_per_number ignored (always 2) gave half of the first case, named "keys only"
        (check_kv_cache_bytes, lambda n, h, d, s, b, p: kv_cache_bytes(n, h, d, s, b, 2), "does not use bytes_per_number"),
        (check_kv_cache_bytes, lambda n, h, d, s, b, p: kv_cache_bytes(1, h, d, s, b, p), "that is one layer"),
        (check_kv_cache_bytes, lambda n, h, d, s, b, p: kv_cache_bytes(n, h, d, s, 1, p), "that is one sequence"),
        (check_kv_cache_bytes, lambda n, h, d, s, b, p: kv_cache_bytes(n, h, d, s, b, 1), "not bytes"),
        (check_kv_cache_bytes, lambda *a: kv_cache_bytes(*a) * 8, "expected 768,000 bytes"),
        (check_kv_cache_bytes, lambda *a: str(kv_cache_bytes(*a)), "return a number"),
    ],
)
def test_wrong_answers_are_explained(check, answer, text):
    feedback = check(answer)
    assert feedback.status == "incorrect", str(feedback)
    assert text in str(feedback), str(feedback)
    assert "Hint:" in str(feedback)


@pytest.mark.parametrize(
    "tokens, text",
    [
        (64e9 / kv_cache_bytes(12, 12, 64, 1, 1, 2), "64 GB"),
        (2 * GPT2_TOKENS, "twice the answer"),
        (2 * GPT2_TOKENS, "2 bytes"),  # the sixth review: 1 byte per number instead of float16's 2
        (12 * GPT2_TOKENS, "all 12 layers"),
        (12 * GPT2_TOKENS, "all 12 heads"),  # the sixth review: 12 heads forgotten gets the same factor
        (GPT2_TOKENS / 12, "all 12 layers"),
        (GPT2_TOKENS * 1.02, "divide 64 GiB"),
        (GPT2_TOKENS / 1000, "divide 64 GiB"),
        ("1.9 million", "return a number"),
    ],
)
def test_wrong_answers_to_the_question_are_explained(tokens, text):
    feedback = check_kv_cache_bytes(kv_cache_bytes, tokens)
    assert feedback.status == "incorrect", str(feedback)
    assert text in feedback.message, feedback.message


@pytest.mark.parametrize(
    "options, text",
    [
        ({"mask": False}, "see each other's future"),
        ({"align": "top_left"}, "top-left corner"),
        ({"offset": False}, "at position 0"),
        ({"in_place": False}, "did not change"),
        ({"whole": True}, "empty ones too"),
        ({"whole": True, "mask": False}, "empty ones too"),
        ({"scale": False}, "sqrt(D)"),
        ({"inverted": True}, "other way round"),
    ],
)
def test_wrong_cache_steps_are_explained(options, text):
    feedback = check_cache_attention_step(lambda *args: cache_attention_step(*args, **options))
    assert feedback.status == "incorrect", str(feedback)
    assert text in feedback.message, feedback.message
    assert "Hint:" in str(feedback)


def test_cache_steps_for_the_notebooks_sizes_only_fail_at_other_sizes():
    def three_heads(q, k, v, ck, cv, n):  # reshapes as if H = 3 and D = 8 always
        out = cache_attention_step(q, k, v, ck, cv, n)
        return out.reshape(out.size(0), 3, -1, 8)

    def float64_buffers_only(q, k, v, ck, cv, n):  # writes through a float64 copy: the float32 buffers stay empty
        return cache_attention_step(q, k, v, ck.double(), cv.double(), n).to(q.dtype)

    feedback = check_cache_attention_step(three_heads)
    assert feedback.status == "error" and "q of shape (1, 1, 1, 4)" in feedback.message, str(feedback)
    feedback = check_cache_attention_step(float64_buffers_only)  # fails on the float32 run, where dtypes differ
    assert feedback.status == "error" and "(1, 1, 9, 4)" in feedback.message, str(feedback)


def test_more_wrong_cache_steps():
    def swapped(q, k, v, ck, cv, n):  # keys into the value buffer
        return cache_attention_step(q, v, k, ck, cv, n)

    def one_too_far(q, k, v, ck, cv, n):  # writes one slot late
        return cache_attention_step(q, k, v, ck, cv, n + 1)

    def wrong_shape(q, k, v, ck, cv, n):
        return cache_attention_step(q, k, v, ck, cv, n).transpose(1, 2)

    def float64_result(q, k, v, ck, cv, n):  # right values, converted (second review: the check cast it first)
        return cache_attention_step(q, k, v, ck, cv, n).double()

    def fixed_device(q, k, v, ck, cv, n):  # the mask made on the CPU (second review)
        T = q.size(2)
        ck[:, :, n:n + T], cv[:, :, n:n + T] = k, v
        allowed = ac.causal_mask(T, n + T, align="bottom_right")
        return F.scaled_dot_product_attention(q, ck[:, :, :n + T], cv[:, :, :n + T], attn_mask=allowed)

    for answer, text in ((swapped, "keys go to cache_keys"), (one_too_far, "should hold the keys"),
                         (wrong_shape, "expected shape"), (float64_result, "torch.float64 for torch.float32 inputs"),
                         (fixed_device, "the meta device")):
        feedback = check_cache_attention_step(answer)
        assert feedback.status == "incorrect", str(feedback)
        assert text in feedback.message, feedback.message


# --- the fifth review's accepted answers: tensors made without device= in exercises 1 and 3, and finite mask
# fills in exercise 5 --------------------------------------------------------------------------------------------

def update_zeros_on_cpu(running_max, running_sum, block):
    """Wrong on a GPU (fifth review): the factor for the starting state made with torch.zeros(R), on the CPU."""
    new_max = torch.maximum(running_max, block.amax(-1))
    scale = torch.where(torch.isinf(running_max), torch.zeros(running_max.shape[0], dtype=running_max.dtype),
                        torch.exp(running_max - new_max))
    return new_max, running_sum * scale + torch.exp(block - new_max[:, None]).sum(-1)


def update_in_numpy(running_max, running_sum, block):
    """Wrong on a GPU: numpy without .cpu() (a GPU tensor cannot be converted), and CPU results."""
    m, s, b = running_max.numpy(), running_sum.numpy(), block.numpy()
    new_max = np.maximum(m, b.max(-1))
    with np.errstate(invalid="ignore"):
        factor = np.where(np.isinf(m), 0.0, np.exp(m - new_max))
    return torch.from_numpy(new_max), torch.from_numpy(s * factor + np.exp(b - new_max[:, None]).sum(-1))


def update_through_numpy_and_back(running_max, running_sum, block):
    """Right: numpy on CPU copies, the results put back on the inputs' device."""
    m, s, b = (x.detach().cpu().numpy() for x in (running_max, running_sum, block))
    new_max = np.maximum(m, b.max(-1))
    with np.errstate(invalid="ignore"):
        factor = np.where(np.isinf(m), 0.0, np.exp(m - new_max))
    new_sum = s * factor + np.exp(b - new_max[:, None]).sum(-1)
    return torch.from_numpy(new_max).to(block.device), torch.from_numpy(new_sum).to(block.device)


def merge_zeros_on_cpu(state_a, state_b):
    """Wrong on a GPU (fifth review): the 0 that stands in for an infinite maximum made without device=."""
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = state_a, state_b
    m = torch.maximum(m_a, m_b)
    reference = torch.where(torch.isfinite(m), m, torch.zeros(m.shape, dtype=m.dtype))
    scale_a, scale_b = torch.exp(m_a - reference), torch.exp(m_b - reference)
    return m, l_a * scale_a + l_b * scale_b, acc_a * scale_a[:, None] + acc_b * scale_b[:, None]


def cache_step_with_fill(fill, additive=False):
    """A hand-written step whose blocked scores are replaced by (or, additive, lowered by) ``fill``."""
    def step(query, key, value, cache_keys, cache_values, length):
        T, S = query.size(2), length + query.size(2)
        cache_keys[:, :, length:S], cache_values[:, :, length:S] = key, value
        scores = query @ cache_keys[:, :, :S].transpose(-2, -1) / math.sqrt(query.size(-1))  # (B, H, T, S)
        blocked = (torch.arange(S, device=query.device)[None, :]
                   > length + torch.arange(T, device=query.device)[:, None])  # (T, S): True = a later token
        value = torch.finfo(scores.dtype).min if fill == "min" else fill  # "min": the smallest number of the dtype
        scores = scores + torch.zeros_like(scores).masked_fill(blocked, value) if additive else scores.masked_fill(blocked, value)
        return torch.softmax(scores, dim=-1) @ cache_values[:, :, :S]
    return step


@pytest.mark.parametrize(
    "check, answer, text",
    [
        (check_online_softmax_update, update_zeros_on_cpu, "works only with CPU tensors"),
        (check_online_softmax_update, update_in_numpy, "numpy holds only CPU data"),
        (check_merge_states, merge_zeros_on_cpu, "works only with CPU tensors"),
        (check_cache_attention_step, cache_step_with_fill(-100.0), "a finite fill such as -100"),
        (check_cache_attention_step, cache_step_with_fill(-1e3), "a finite fill such as -100"),
        (check_cache_attention_step, cache_step_with_fill(-1e4), "a finite fill such as -100"),
        (check_cache_attention_step, cache_step_with_fill(-100.0, additive=True), "lowers the blocked scores by a fixed amount"),
        (check_cache_attention_step, cache_step_with_fill(-1e4, additive=True), "lowers the blocked scores by a fixed amount"),
    ],
)
def test_fifth_review_wrong_answers_are_explained(check, answer, text):
    feedback = check(answer)
    assert feedback.status == "incorrect", str(feedback)
    assert text in feedback.message, feedback.message
    assert "Hint:" in str(feedback)


def test_a_result_copied_to_the_cpu_is_named_on_every_machine():
    # x.cpu() cannot copy out of a meta tensor, and a right answer may copy to numpy and back (.to(device)): where
    # the meta device cannot run an answer, it runs on CPU copies under the shared device watch, which names a
    # result left on the CPU (a GPU names it through expect_on_device).
    for check, answer in ((check_merge_states, lambda a, b: tuple(x.cpu() for x in merge(a, b))),
                          (check_online_softmax_update, lambda m, s, b: tuple(x.cpu() for x in update(m, s, b)))):
        feedback = check(answer)
        assert feedback.status == "incorrect", str(feedback)
        assert "device" in feedback.message, feedback.message


def test_fifth_review_right_answers_pass():
    assert check_online_softmax_update(update_through_numpy_and_back), str(check_online_softmax_update(update_through_numpy_and_back))
    for fill in (float("-inf"), "min"):  # the course's fills: -inf, or the smallest number of the scores' dtype
        answer = cache_step_with_fill(fill)
        assert check_cache_attention_step(answer), str(check_cache_attention_step(answer))
    answer = cache_step_with_fill(float("-inf"), additive=True)
    assert check_cache_attention_step(answer), str(check_cache_attention_step(answer))


def test_a_maximum_over_the_wrong_axis_is_not_accepted():
    feedback = check_online_softmax_update(lambda m, s, b: update(m, s, b, axis=0))  # crashes on (3,) vs (4,)
    assert feedback.status == "error" and "RuntimeError" in feedback.message


@pytest.mark.parametrize("check", [check_online_softmax_update, check_causal_tile_attention, check_merge_states,
                                   check_kv_cache_bytes, check_cache_attention_step])
def test_crashing_and_untouched_answers(check):
    crashed = check(lambda *args: 1 / 0)
    assert crashed.status == "error" and "ZeroDivisionError" in str(crashed) and "Traceback" not in str(crashed)
    for untouched in (_scaffold, ...):
        assert check(untouched).status == "not attempted"
        assert "Not attempted yet" in str(check(untouched))


# --- the sixth review's accepted answers: finite fills and fixed penalties in exercise 2 (and -1e5, -1e9 in
# exercise 5), a two-pass answer written without a matrix product, tensors made without device= behind a value
# read (exercises 1, 2 and 5), in-place writes that keep the values ---------------------------------------------

def causal_tile_with_fill(query_tile, keys, values, first_query, block_size, fill=float("-inf"), additive=False,
                          device=True, read=False, two_pass_elementwise=False, scores_of=None):
    """The review's exercise-2 answers (wrong.py's `tile`): a fill or a penalty, no device=, a value read, and a
    first pass written as broadcast-and-sum; with the defaults, a right answer."""
    if read and bool(torch.isnan(query_tile).any()):  # a defensive read of a value
        raise ValueError("NaN in the queries")
    Lb, D = query_tile.shape
    on = {"device": query_tile.device} if device else {}
    kw = dict(dtype=query_tile.dtype, **on)
    positions = first_query + torch.arange(Lb, **on)[:, None]
    m, l, acc = torch.full((Lb, 1), float("-inf"), **kw), torch.zeros(Lb, 1, **kw), torch.zeros(Lb, values.size(1), **kw)
    starts = [s for s in range(0, keys.size(0), block_size) if s <= first_query + Lb - 1]
    if two_pass_elementwise:
        S = min(keys.size(0), starts[-1] + block_size)
        s_all = (query_tile[:, None, :] * keys[None, :S, :]).sum(-1) / math.sqrt(D)
        s_all = s_all.masked_fill(torch.arange(S, **on)[None, :] > positions, float("-inf"))
        m_all = s_all.amax(1, keepdim=True)
    for k_start in starts:
        kt, vt = keys[k_start:k_start + block_size], values[k_start:k_start + block_size]
        s = (scores_of(query_tile, kt) if scores_of else query_tile @ kt.T) / math.sqrt(D)
        blocked = k_start + torch.arange(kt.size(0), **on)[None, :] > positions
        s = s - fill * blocked if additive else s.masked_fill(blocked, fill)
        if two_pass_elementwise:
            p = torch.exp(s - m_all)
            l, acc = l + p.sum(1, keepdim=True), acc + p @ vt
            continue
        m_new = torch.maximum(m, s.amax(1, keepdim=True))
        p, c = torch.exp(s - m_new), torch.exp(m - m_new)
        l, acc, m = l * c + p.sum(1, keepdim=True), acc * c + p @ vt, m_new
    return acc / l, len(starts)


def update_reads_then_zeros_on_cpu(running_max, running_sum, block):
    """Wrong on a GPU (sixth review): the starting state taken apart with an if (a value read), and a tensor made
    without device= only in the branch that the later steps take."""
    if bool(torch.isinf(running_max).all()):
        return block.amax(-1), torch.exp(block - block.amax(-1)[:, None]).sum(-1)
    new_max = torch.maximum(running_max, block.amax(-1))
    return new_max, (running_sum * torch.exp(running_max - new_max) + torch.exp(block - new_max[:, None]).sum(-1)
                     + torch.zeros(running_max.shape[0]))


def cache_step_asserts_then_mask_on_cpu(query, key, value, cache_keys, cache_values, length):
    """Wrong on a GPU (sixth review): an assert reads a value, and the mask is made without device=."""
    assert not bool(torch.isnan(query).any()), "NaN queries"
    T, S = query.size(2), length + query.size(2)
    cache_keys[:, :, length:S], cache_values[:, :, length:S] = key, value
    allowed = torch.arange(S)[None, :] <= length + torch.arange(T)[:, None]  # on the CPU
    return F.scaled_dot_product_attention(query, cache_keys[:, :, :S], cache_values[:, :, :S], attn_mask=allowed)


def update_keeps_values_in_place(running_max, running_sum, block):
    running_sum.mul_(1.0)
    return update(running_max, running_sum, block)


def merge_keeps_values_in_place(state_a, state_b):
    state_a[1].mul_(1.0)
    return merge(state_a, state_b)


def cache_step_keeps_values_in_place(query, key, value, cache_keys, cache_values, length):
    query.mul_(1.0)
    return cache_attention_step(query, key, value, cache_keys, cache_values, length)


@pytest.mark.parametrize(
    "check, answer, text",
    [
        # finite fills and fixed penalties: every one the review tried, in both exercises
        *[(check_causal_tile_attention, functools.partial(causal_tile_with_fill, fill=fill), "a finite fill such as -100")
          for fill in (-100.0, -1e3, -1e4, -1e5, -1e9)],
        *[(check_causal_tile_attention, functools.partial(causal_tile_with_fill, fill=penalty, additive=True),
           "lowers the blocked scores by a fixed amount") for penalty in (1e4, 1e5, 1e9)],
        (check_cache_attention_step, cache_step_with_fill(-1e5), "a finite fill such as -100"),
        (check_cache_attention_step, cache_step_with_fill(-1e9), "a finite fill such as -100"),
        (check_cache_attention_step, cache_step_with_fill(-1e5, additive=True), "lowers the blocked scores by a fixed amount"),
        (check_cache_attention_step, cache_step_with_fill(-1e9, additive=True), "lowers the blocked scores by a fixed amount"),
        # two passes, the first written as broadcast-and-sum (no matrix product to count)
        (check_causal_tile_attention, functools.partial(causal_tile_with_fill, two_pass_elementwise=True),
         "before its first exponential"),
        # tensors made without device= behind a value read: run on the CPU under the device watch
        (check_causal_tile_attention, functools.partial(causal_tile_with_fill, device=False, read=True),
         "made without device="),
        (check_cache_attention_step, cache_step_asserts_then_mask_on_cpu, "made without device="),
        (check_online_softmax_update, update_reads_then_zeros_on_cpu, "made without device="),
        # in-place writes that keep the values (the shared call() names them by the version counter)
        (check_online_softmax_update, update_keeps_values_in_place, "changed its input"),
        (check_merge_states, merge_keeps_values_in_place, "changed its input"),
        (check_cache_attention_step, cache_step_keeps_values_in_place, "changed its input"),
    ],
)
def test_sixth_review_wrong_answers_are_explained(check, answer, text):
    feedback = check(answer)
    assert feedback.status == "incorrect", str(feedback)
    assert text in feedback.message, feedback.message
    assert "Hint:" in str(feedback)


def test_sixth_review_right_answers_pass():
    # exercise 2: -inf and the dtype's smallest number, as a fill or added; scores through vecdot or multi_dot
    for answer in (causal_tile_with_fill,
                   lambda q, k, v, f, n: causal_tile_with_fill(q, k, v, f, n, fill=torch.finfo(q.dtype).min),
                   functools.partial(causal_tile_with_fill, scores_of=lambda q, k: torch.linalg.vecdot(q[:, None], k[None])),
                   functools.partial(causal_tile_with_fill, scores_of=lambda q, k: torch.linalg.multi_dot([q, k.T])),
                   lambda q, k, v, f, n: (causal_tile_with_fill(q, k, v, f, n)[0], np.int64(causal_tile_with_fill(q, k, v, f, n)[1])),
                   functools.partial(causal_tile_with_fill, read=True)):  # a value read, every tensor on the device
        assert check_causal_tile_attention(answer), str(check_causal_tile_attention(answer))
    # exercise 5: the dtype's smallest number added (it rounds to -inf on -1e12), a value read with the mask on the device
    answer = cache_step_with_fill("min", additive=True)
    assert check_cache_attention_step(answer), str(check_cache_attention_step(answer))

    def asserts_then_steps(q, k, v, ck, cv, n):
        assert not bool(torch.isnan(q).any())
        return cache_attention_step(q, k, v, ck, cv, n)

    assert check_cache_attention_step(asserts_then_steps), str(check_cache_attention_step(asserts_then_steps))
    # exercise 1: the starting state taken apart with an if, every tensor on the device
    def reads_then_updates(m, s, b):
        if bool(torch.isinf(m).all()):
            return b.amax(-1), torch.exp(b - b.amax(-1)[:, None]).sum(-1)
        return update(m, s, b)

    assert check_online_softmax_update(reads_then_updates), str(check_online_softmax_update(reads_then_updates))


# --- the seventh review's accepted answers: larger finite fills, fixed penalties and starting maxima in
# exercises 2 and 5 (named on float64 scores at -1e300 and rising by 1e300), and half precision in 1 and 3 ----------

def causal_tile_starting_at(query_tile, keys, values, first_query, block_size, start=float("-inf")):
    """Exercise 2's loop with the running maximum m started at ``start`` (right only for -inf and the dtype's min)."""
    Lb, D = query_tile.shape
    kw = dict(dtype=query_tile.dtype, device=query_tile.device)
    positions = first_query + torch.arange(Lb, device=query_tile.device)[:, None]
    m, l, acc = torch.full((Lb, 1), start, **kw), torch.zeros(Lb, 1, **kw), torch.zeros(Lb, values.size(1), **kw)
    starts = [s for s in range(0, keys.size(0), block_size) if s <= first_query + Lb - 1]
    for k_start in starts:
        kt, vt = keys[k_start:k_start + block_size], values[k_start:k_start + block_size]
        s = query_tile @ kt.T / math.sqrt(D)
        s = s.masked_fill(k_start + torch.arange(kt.size(0), device=s.device)[None, :] > positions, float("-inf"))
        m_new = torch.maximum(m, s.amax(1, keepdim=True))
        p, c = torch.exp(s - m_new), torch.exp(m - m_new)
        l, acc, m = l * c + p.sum(1, keepdim=True), acc * c + p @ vt, m_new
    return acc / l, len(starts)


def update_half_sum(running_max, running_sum, block):
    """The review's half-precision sum: the block's exponentials taken in float16, the result float64."""
    new_max = torch.maximum(running_max, block.amax(-1))
    return new_max, running_sum * torch.exp(running_max - new_max) + torch.exp((block - new_max[:, None]).half()).sum(-1)


def update_bfloat16_result(running_max, running_sum, block):
    return tuple(x.bfloat16() for x in update(running_max, running_sum, block))


def merge_half(state_a, state_b):
    return tuple(x.half() for x in merge(state_a, state_b))


@pytest.mark.parametrize(
    "check, answer, text",
    [
        *[(check_causal_tile_attention, functools.partial(causal_tile_with_fill, fill=fill), "a finite fill such as -100")
          for fill in (-1e13, -1e15, -1e30)],
        *[(check_causal_tile_attention, functools.partial(causal_tile_with_fill, fill=penalty, additive=True),
           "lowers the blocked scores by a fixed amount") for penalty in (1e13, 1e15, 1e30)],
        *[(check_causal_tile_attention, functools.partial(causal_tile_starting_at, start=start),
           "did your running maximum m start at a finite number above them") for start in (-1e4, -1e13, -1e30)],
        *[(check_cache_attention_step, cache_step_with_fill(fill), "a finite fill such as -100") for fill in (-1e15, -1e30)],
        *[(check_cache_attention_step, cache_step_with_fill(-penalty, additive=True),
           "lowers the blocked scores by a fixed amount") for penalty in (1e15, 1e30)],
        (check_online_softmax_update, update_half_sum, "the rounding of a 16-bit dtype"),
        (check_online_softmax_update, update_bfloat16_result, "is bfloat16: a 16-bit dtype"),
        (check_merge_states, merge_half, "is float16: a 16-bit dtype"),
    ],
)
def test_seventh_review_wrong_answers_are_explained(check, answer, text):
    feedback = check(answer)
    assert feedback.status == "incorrect", str(feedback)
    assert text in feedback.message, feedback.message
    assert "Hint:" in str(feedback)


def test_seventh_review_right_answers_pass():
    # -inf and the dtype's smallest number, as a fill or a starting maximum, on the scores near -1e300 too
    for answer in (causal_tile_starting_at,
                   lambda q, k, v, f, n: causal_tile_starting_at(q, k, v, f, n, start=torch.finfo(q.dtype).min),
                   lambda q, k, v, f, n: causal_tile_with_fill(q, k, v, f, n, fill=torch.finfo(q.dtype).min)):
        assert check_causal_tile_attention(answer), str(check_causal_tile_attention(answer))
    for answer in (cache_step_with_fill(float("-inf")), cache_step_with_fill("min")):
        assert check_cache_attention_step(answer), str(check_cache_attention_step(answer))


# --- the tenth review: a merge computed in float32 from float64 states (the dtype policy), and a running
# logsumexp in exercise 2 (rejected at -1e12 with a reason) ----------------------------------------------------

def merge_computed_in_float32(state_a, state_b):
    """Right, by the dtype policy: every input converted to float32 first, the merge computed there. Near -20000
    float32 holds the maxima only to about 0.002, so the check compares it with the merge of the rounded states."""
    return merge(tuple(x.float() for x in state_a), tuple(x.float() for x in state_b))


def causal_tile_running_logsumexp(query_tile, keys, values, first_query, block_size):
    """FlashAttention-2's logsumexp taken literally: one running log-sum-exp per query and a normalised output, in
    place of m and l. Exact in exact arithmetic, but at scores of -1e12 float64 keeps the log of the sum only to
    about 1e-4."""
    Lb, D = query_tile.shape
    positions = first_query + torch.arange(Lb, device=query_tile.device)[:, None]
    lse = torch.full((Lb, 1), float("-inf"), dtype=query_tile.dtype, device=query_tile.device)
    out = torch.zeros(Lb, values.size(1), dtype=query_tile.dtype, device=query_tile.device)
    tiles = 0
    for start in range(0, keys.size(0), block_size):
        if start > first_query + Lb - 1:
            break
        tiles += 1
        s = query_tile @ keys[start:start + block_size].T / math.sqrt(D)
        s = s.masked_fill(start + torch.arange(s.size(1), device=s.device)[None] > positions, float("-inf"))
        new = torch.logaddexp(lse, torch.logsumexp(s, 1, keepdim=True))
        out = (out * torch.exp(lse - new).nan_to_num(0.0)
               + torch.exp(s - new).nan_to_num(0.0) @ values[start:start + block_size])
        lse = new
    return out, tiles


def test_a_merge_computed_in_float32_passes():
    feedback = check_merge_states(merge_computed_in_float32)
    assert feedback, str(feedback)


def test_a_running_logsumexp_is_named():
    feedback = check_causal_tile_attention(causal_tile_running_logsumexp)
    assert feedback.status == "incorrect", str(feedback)
    assert "-1e12" in feedback.message and "Keep m and l separately" in feedback.message, feedback.message
    assert "Hint:" in str(feedback)


# --- the eleventh review: a list accepted in exercise 1; 16-bit rounding named in exercise 1 only where the sum is
# the right one rounded through float16 or bfloat16; a merge computed in float32 and converted back to float64
# passes (the dtype policy); exercises 2 and 5, which ask for the inputs' dtype, name a float64 output that holds
# float32 numbers ---------------------------------------------------------------------------------------------

def update_as_list(running_max, running_sum, block):
    return list(update(running_max, running_sum, block))


def update_float32_and_back(running_max, running_sum, block):
    """Right, by the dtype policy: computed in float32, converted back to the inputs' dtype."""
    dtype = running_max.dtype
    return tuple(x.to(dtype) for x in update(running_max.float(), running_sum.float(), block.float()))


def merge_float32_and_back(state_a, state_b):
    """The review's rejected right answer: the float32 merge of merge_computed_in_float32, converted back."""
    dtype = state_a[0].dtype
    return tuple(x.to(dtype) for x in merge_computed_in_float32(state_a, state_b))


def update_with(block_terms=None, correction=None):
    """The update with the block's terms (from the shifted scores) or the correction (from running_max - new_max)
    computed another way: a plausible mistake, or a 16-bit step."""
    def answer(running_max, running_sum, block):
        new_max = torch.maximum(running_max, block.amax(dim=-1))
        shifted = block - new_max[:, None]
        terms = block_terms(shifted) if block_terms else torch.exp(shifted)
        factor = correction(running_max - new_max) if correction else torch.exp(running_max - new_max)
        return new_max, running_sum * factor + terms.sum(dim=-1)
    return answer


SIXTEEN_BITS = "the rounding of a 16-bit dtype"


@pytest.mark.parametrize(
    "answer",
    [
        update_with(block_terms=lambda x: torch.exp(x.half()).to(x.dtype)),  # exponentials in float16, summed in float64
        update_with(correction=lambda x: torch.exp(x.bfloat16()).to(x.dtype)),  # the correction in bfloat16
        update_with(block_terms=lambda x: torch.exp(x).bfloat16().sum(dim=-1, keepdim=True).to(x.dtype)),  # the sum
        update_half_sum,
    ],
)
def test_sixteen_bit_steps_are_named(answer):
    feedback = check_online_softmax_update(answer)
    assert feedback.status == "incorrect", str(feedback)
    assert SIXTEEN_BITS in feedback.message, feedback.message


@pytest.mark.parametrize(
    "answer",
    [
        update_with(block_terms=lambda x: torch.exp(x.topk(min(3, x.size(-1)), dim=-1).values)),  # the top-3 only
        update_with(block_terms=lambda x: torch.exp(x.clamp(min=-5.0))),  # exponents clamped at -5
        update_with(block_terms=lambda x: torch.exp(x) * 1.001),  # off by a relative 1e-3, no 16-bit step
    ],
)
def test_other_small_errors_are_not_blamed_on_16_bits(answer):
    feedback = check_online_softmax_update(answer)
    assert feedback.status == "incorrect", str(feedback)
    assert SIXTEEN_BITS not in feedback.message and "16-bit" not in feedback.message, feedback.message
    assert "values differ" in feedback.message, feedback.message
    assert "Hint:" in str(feedback)


def test_eleventh_review_right_answers_pass():
    for check, answer in ((check_online_softmax_update, update_as_list),
                          (check_online_softmax_update, update_float32_and_back),
                          (check_merge_states, merge_float32_and_back),
                          (check_merge_states, lambda a, b: tuple(x.double() for x in merge_float32(a, b)))):
        feedback = check(answer)
        assert feedback, str(feedback)


def causal_tile_float32_and_back(query_tile, keys, values, first_query, block_size):
    output, tiles = causal_tile(query_tile.float(), keys.float(), values.float(), first_query, block_size)
    return output.to(query_tile.dtype), tiles


def causal_tile_nudged(query_tile, keys, values, first_query, block_size):
    """Wrong in float64 by about 1e-6, with no float32 step: not named as float32 precision."""
    output, tiles = causal_tile(query_tile, keys, values, first_query, block_size)
    return output + 1e-6, tiles


def cache_step_float32_and_back(query, key, value, cache_keys, cache_values, length):
    T = query.size(2)
    cache_keys[:, :, length:length + T], cache_values[:, :, length:length + T] = key, value
    keys, values = cache_keys[:, :, :length + T].float(), cache_values[:, :, :length + T].float()
    allowed = ac.causal_mask(T, length + T, align="bottom_right", device=query.device)
    return F.scaled_dot_product_attention(query.float(), keys, values, attn_mask=allowed).to(query.dtype)


FLOAT32_NUMBERS = "every value of it is a float32 number"


@pytest.mark.parametrize(
    "check, answer",
    [(check_causal_tile_attention, causal_tile_float32_and_back),
     (check_cache_attention_step, cache_step_float32_and_back)],
)
def test_float32_numbers_in_a_float64_output_are_named(check, answer):
    feedback = check(answer)
    assert feedback.status == "incorrect", str(feedback)
    assert FLOAT32_NUMBERS in feedback.message and "inputs' dtype" in feedback.message, feedback.message
    assert "Hint:" in str(feedback)


def test_a_float64_output_off_by_little_is_not_blamed_on_float32():
    feedback = check_causal_tile_attention(causal_tile_nudged)
    assert feedback.status == "incorrect", str(feedback)
    assert FLOAT32_NUMBERS not in feedback.message, feedback.message


# The sixteenth review's accepted wrong answers: a finite fill computed from the tile's own scores (exercise 2), and a
# merge that exponentiates against the midpoint of the two maxima (exercise 3) ------------------------------------

def causal_tile_fill_from_tile(query_tile, keys, values, first_query, block_size):
    """Wrong (the review's 2a): the blocked scores filled with the tile's minimum minus a large margin, finite and
    below this tile's scores, but not below an earlier tile's when the whole tile is blocked for a query."""
    Lb, D = query_tile.shape
    kw = dict(dtype=query_tile.dtype, device=query_tile.device)
    positions = first_query + torch.arange(Lb, device=query_tile.device)[:, None]
    m, l, acc = torch.full((Lb, 1), float("-inf"), **kw), torch.zeros(Lb, 1, **kw), torch.zeros(Lb, values.size(1), **kw)
    starts = [s for s in range(0, keys.size(0), block_size) if s <= first_query + Lb - 1]
    for k_start in starts:
        kt, vt = keys[k_start:k_start + block_size], values[k_start:k_start + block_size]
        s = query_tile @ kt.T / math.sqrt(D)
        blocked = k_start + torch.arange(kt.size(0), device=query_tile.device)[None, :] > positions
        low = float(s.min())
        s = s.masked_fill(blocked, low - 1e6 * abs(low) - 1e6)
        m_new = torch.maximum(m, s.amax(1, keepdim=True))
        p, c = torch.exp(s - m_new), torch.exp(m - m_new)
        l, acc, m = l * c + p.sum(1, keepdim=True), acc * c + p @ vt, m_new
    return acc / l, len(starts)


def merge_against_midpoint(state_a, state_b):
    """Wrong (the review's 3a): both states rescaled against the midpoint of their maxima, then to the maximum;
    exp((m_a - m_b) / 2) overflows when the maxima lie more than about 177 apart in float32 (1420 in float64)."""
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = state_a, state_b
    m = torch.maximum(m_a, m_b)
    safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    ref = torch.where(torch.isfinite(m_a) & torch.isfinite(m_b), (m_a + m_b) / 2, safe)
    s_a, s_b = torch.exp(m_a - ref), torch.exp(m_b - ref)
    corr = torch.exp(ref - safe)
    l = (l_a * s_a + l_b * s_b) * corr
    acc = (acc_a * s_a[:, None] + acc_b * s_b[:, None]) * corr[:, None]
    return m, l, acc


@pytest.mark.parametrize(
    "check, answer, text",
    [(check_causal_tile_attention, causal_tile_fill_from_tile, "a finite fill computed from the tile's own scores"),
     (check_merge_states, merge_against_midpoint, "a reference between them (their midpoint")],
)
def test_sixteenth_review_wrong_answers_are_explained(check, answer, text):
    feedback = check(answer)
    assert feedback.status == "incorrect", str(feedback)
    assert text in str(feedback), str(feedback)
    assert "Hint:" in str(feedback)
