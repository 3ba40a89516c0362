"""The exercise checks of chapter 10: right, wrong, crashing and untouched answers."""

import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attn_course.exercises.ch10 import (check_gqa_cache_bytes, check_grouped_attention, check_mean_pool_kv,
                                        check_receptive_field, check_rolling_read)


def _scaffold(*args):
    ...


def _causal(q, k, *, device=True, diagonal=0):
    """True where a query may attend: the L queries are the last L of the S positions."""
    L, S = q.size(-2), k.size(-2)
    return torch.ones(L, S, dtype=torch.bool, device=q.device if device else None).tril(S - L + diagonal)


# --- right answers, and other ways of writing them -------------------------------------------------

def cache_bytes(num_layers, num_kv_heads, head_dim, seq_len, batch_size, bytes_per_number, window=None, *, mistake=None):
    kept = seq_len if window is None else min(seq_len, window)
    if mistake == "ignore window":
        kept = seq_len
    if mistake == "window always":
        kept = window if window is not None else seq_len
    if mistake in ("window + 1", "window - 1") and window is not None:
        kept = min(seq_len, window + (1 if mistake == "window + 1" else -1))
    if mistake == "no batch":
        batch_size = 1
    factor = 1 if mistake == "no values" else 2
    return factor * num_layers * batch_size * num_kv_heads * kept * head_dim * bytes_per_number


def grouped_attention(q, k, v, *, mistake=None):
    """The folded form (no copies): the query heads of a group in line along the query axis."""
    B, H, L, D = q.shape
    G = k.size(1)
    n = H // G
    if mistake == "tile":  # query head h reads key/value head h % G, by indexing
        owner = torch.arange(H) % G
        return grouped_attention_index(q, k, v, owner)
    if mistake == "h // G":  # the number of groups taken for the group size
        return grouped_attention_index(q, k, v, torch.arange(H) // G)
    if mistake == "broadcast":  # the group axis broadcast in the matmul: torch.matmul copies k and v per head
        qg = q.view(B, G, n, L, D)  # (B, G, H/G, L, D)
        scores = qg @ k[:, :, None].transpose(-2, -1) / math.sqrt(D)  # (B, G, H/G, L, S)
        scores = scores.masked_fill(~_causal(q, k), float("-inf"))
        return (scores.softmax(dim=-1) @ v[:, :, None]).reshape(B, H, L, D)
    folded = q.reshape(B, G, n * L, D)  # (B, G, H/G * L, D)
    S = k.size(2)
    scores = (folded @ k.transpose(-2, -1) / (1.0 if mistake == "no scale" else math.sqrt(D))).view(B, G, n, L, S)
    if mistake != "no mask":
        allowed = _causal(q, k, diagonal=-1 if mistake == "no diagonal" else 0)
        if mistake == "top-left":  # as if the queries were positions 0 .. L - 1
            allowed = torch.ones(L, S, dtype=torch.bool).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    if mistake == "naive softmax":
        weights = scores.exp() / scores.exp().sum(-1, keepdim=True)
    else:
        weights = scores.softmax(dim=-1)
    return (weights.view(B, G, n * L, S) @ v).view(B, H, L, D)


def grouped_attention_folded_mask(q, k, v):
    """Another way: the causal mask built for the folded axis, each head's rows 0 .. L - 1 in turn."""
    B, H, L, D = q.shape
    G = k.size(1)
    S = k.size(2)
    scores = q.reshape(B, G, H // G * L, D) @ k.transpose(-2, -1) / math.sqrt(D)  # (B, G, H/G * L, S)
    rows = torch.arange(H // G * L, device=q.device) % L + S - L  # the position of each folded query
    allowed = torch.arange(S, device=q.device)[None, :] <= rows[:, None]  # (H/G * L, S)
    return (scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v).view(B, H, L, D)


def grouped_attention_loop_heads(q, k, v):
    """Another way: a loop over query heads, each reading its key/value head as it is (a view, no copy)."""
    B, H, L, D = q.shape
    n = H // k.size(1)
    causal = _causal(q, k)
    heads = [(q[:, h] @ k[:, h // n].transpose(-2, -1) / math.sqrt(D)).masked_fill(~causal, float("-inf")).softmax(-1)
             @ v[:, h // n] for h in range(H)]
    return torch.stack(heads, dim=1)


def grouped_attention_index(q, k, v, owner=None):
    """Index the key/value head of each query head: a copy per query head, which the exercise asks to avoid."""
    B, H, L, D = q.shape
    owner = torch.arange(H) // (H // k.size(1)) if owner is None else owner
    scores = q @ k[:, owner].transpose(-2, -1) / math.sqrt(D)
    scores = scores.masked_fill(~_causal(q, k, device=False), float("-inf"))
    return scores.softmax(dim=-1) @ v[:, owner]


def grouped_attention_repeat_interleave(q, k, v):
    """Section 2's copy: forbidden in the exercise."""
    group = q.size(1) // k.size(1)
    return grouped_attention_index(q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1),
                                   torch.arange(q.size(1)))


def grouped_attention_sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def grouped_attention_sdpa_folded(q, k, v):
    """Fourth review: F.scaled_dot_product_attention without enable_gqa, on the folded queries (no copy of k or v).
    The statement forbids F.scaled_dot_product_attention altogether: the exercise asks for the attention itself."""
    B, H, L, D = q.shape
    G, S = k.size(1), k.size(2)
    allowed = torch.ones(L, S, dtype=torch.bool, device=q.device).tril(S - L).repeat(H // G, 1)  # (H/G * L, S)
    return F.scaled_dot_product_attention(q.reshape(B, G, H // G * L, D), k, v, attn_mask=allowed).view(B, H, L, D)


def grouped_attention_mask_over_folded_rows(q, k, v):
    """Wrong (fourth review): the causal mask built over the folded rows, as if they were H/G * L positions."""
    B, H, L, D = q.shape
    G, S = k.size(1), k.size(2)
    n = H // G
    scores = q.reshape(B, G, n * L, D) @ k.transpose(-2, -1) / math.sqrt(D)  # (B, G, H/G * L, S)
    allowed = torch.ones(n * L, S, dtype=torch.bool, device=q.device).tril(S - n * L)
    return (scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v).view(B, H, L, D)


def grouped_attention_package(q, k, v):
    import attn_course as ac
    return ac.gqa.grouped_attention(q, k, v, _causal(q, k))[0]


def grouped_attention_einsum(q, k, v):
    B, H, L, D = q.shape
    G = k.size(1)
    qg = q.view(B, G, H // G, L, D)
    scores = torch.einsum("bgqld,bgsd->bgqls", qg, k) / math.sqrt(D)
    scores = scores.masked_fill(~_causal(q, k), float("-inf"))
    return torch.einsum("bgqls,bgsd->bgqld", scores.softmax(-1), v).reshape(B, H, L, D)


def grouped_attention_expand_view(q, k, v):
    """expand (a view) the key/value heads over the group axis, then matmul: the matmul copies them."""
    B, H, L, D = q.shape
    G = k.size(1)
    kg = k.unsqueeze(2).expand(B, G, H // G, L, D)  # a view: no copy yet
    vg = v.unsqueeze(2).expand(B, G, H // G, L, D)
    scores = q.view(B, G, H // G, L, D) @ kg.transpose(-2, -1) / math.sqrt(D)
    scores = scores.masked_fill(~_causal(q, k, device=False), float("-inf"))
    return (scores.softmax(-1) @ vg).reshape(B, H, L, D)


def grouped_attention_contiguous_5d(q, k, v):
    """The copy kept in 5-D: expand, then contiguous / clone (Hugging Face's repeat_kv without its reshape)."""
    B, H, L, D = q.shape
    G, n = k.size(1), H // k.size(1)
    k5 = k[:, :, None].expand(B, G, n, L, D).contiguous()
    v5 = v[:, :, None].expand(B, G, n, L, D).clone()
    return _attend_5d(q.view(B, G, n, L, D), k5, v5).reshape(B, H, L, D)


def _attend_5d(q5, k5, v5):
    """Attention of (B, G, n, L, D) queries to keys and values of the same shape: no broadcast in the products."""
    D = q5.size(-1)
    scores = q5 @ k5.transpose(-2, -1) / math.sqrt(D)
    scores = scores.masked_fill(~_causal(q5, k5, device=False), float("-inf"))
    return scores.softmax(-1) @ v5


def grouped_attention_index_transposed(q, k, v):
    """Indexing the transposed keys: a copy per head of shape (B, H, D, L)."""
    B, H, L, D = q.shape
    owner = torch.arange(H) // (H // k.size(1))
    scores = q @ k.transpose(-2, -1)[:, owner] / math.sqrt(D)
    scores = scores.masked_fill(~_causal(q, k, device=False), float("-inf"))
    return scores.softmax(-1) @ v[:, owner]


def grouped_attention_index_scaled(q, k, v):
    """Indexing keys scaled first: a copy per head that is not equal to the keys repeated."""
    B, H, L, D = q.shape
    owner = torch.arange(H) // (H // k.size(1))
    scores = q @ (k / math.sqrt(D))[:, owner].transpose(-2, -1)
    scores = scores.masked_fill(~_causal(q, k, device=False), float("-inf"))
    return scores.softmax(-1) @ v[:, owner]


def grouped_attention_buffer(q, k, v):
    """A buffer of (B, H, L, D) filled head by head: a copy per head, written piece by piece."""
    B, H, L, D = q.shape
    n = H // k.size(1)
    k_all, v_all = q.new_empty(B, H, L, D), q.new_empty(B, H, L, D)
    for h in range(H):
        k_all[:, h], v_all[:, h] = k[:, h // n], v[:, h // n]
    return grouped_attention_index(q, k_all, v_all, torch.arange(H))


def grouped_attention_loop_groups(q, k, v):
    """A loop over groups whose matmul broadcasts the group's key/value head over its query heads: copies."""
    B, H, L, D = q.shape
    n = H // k.size(1)
    causal = _causal(q, k, device=False)
    parts = [((q[:, g * n:(g + 1) * n] @ k[:, g:g + 1].transpose(-2, -1) / math.sqrt(D)).masked_fill(~causal, float("-inf"))
              .softmax(-1) @ v[:, g:g + 1]) for g in range(k.size(1))]
    return torch.cat(parts, dim=1)


def grouped_attention_loop_copies(q, k, v, how="contiguous"):
    """A loop over query heads that copies its key/value head each time (contiguous, clone, or the transposed keys
    made contiguous): one copy at a time, but H / G copies of every key/value head in all (the second review)."""
    B, H, L, D = q.shape
    n = H // k.size(1)
    causal = _causal(q, k)
    heads = []
    for h in range(H):
        if how == "clone":
            kt, vh = k[:, h // n].clone().transpose(-2, -1), v[:, h // n].clone()
        elif how == "transposed":
            kt, vh = k[:, h // n].transpose(-2, -1).contiguous(), v[:, h // n]
        else:
            kt, vh = k[:, h // n].contiguous().transpose(-2, -1), v[:, h // n].contiguous()
        heads.append((q[:, h] @ kt / math.sqrt(D)).masked_fill(~causal, float("-inf")).softmax(-1) @ vh)
    return torch.stack(heads, dim=1)


def grouped_attention_cpu_mask(q, k, v):
    """The folded form with its mask made on the CPU (no device=): fails on a GPU."""
    B, H, L, D = q.shape
    G, n = k.size(1), H // k.size(1)
    S = k.size(2)
    scores = (q.reshape(B, G, n * L, D) @ k.transpose(-2, -1) / math.sqrt(D)).view(B, G, n, L, S)
    scores = scores.masked_fill(~_causal(q, k, device=False), float("-inf"))
    return (scores.softmax(-1).view(B, G, n * L, S) @ v).view(B, H, L, D)


def grouped_attention_expand_reshape(q, k, v):
    """expand, then reshape to (B, H, L, D): reshape copies every key/value head to its group."""
    B, H, L, D = q.shape
    G = k.size(1)
    k = k.unsqueeze(2).expand(B, G, H // G, L, D).reshape(B, H, L, D)
    v = v.unsqueeze(2).expand(B, G, H // G, L, D).reshape(B, H, L, D)
    return grouped_attention_index(q, k, v, torch.arange(H))


def grouped_attention_cat(q, k, v):
    """torch.cat of each key/value head, H // G times: a copy by another route."""
    group = q.size(1) // k.size(1)
    k = torch.cat([k[:, g:g + 1] for g in range(k.size(1)) for _ in range(group)], dim=1)
    v = torch.cat([v[:, g:g + 1] for g in range(v.size(1)) for _ in range(group)], dim=1)
    return grouped_attention_index(q, k, v, torch.arange(q.size(1)))


def grouped_attention_fixed_sizes(q, k, v):
    """Works only for the notebook's (B, H, L, D) = (2, 8, 6, 4) and G = 2."""
    scores = (q.reshape(2, 2, 24, 4) @ k.transpose(-2, -1) / 2.0).view(2, 2, 4, 6, 6)
    scores = scores.masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf"))
    return (scores.softmax(-1).view(2, 2, 24, 6) @ v).view(2, 8, 6, 4)


def grouped_attention_in_place(q, k, v):
    q.mul_(1.0 / math.sqrt(q.size(-1)))  # scales the caller's queries
    return grouped_attention(q * math.sqrt(q.size(-1)), k, v)


def mean_pool(weight, num_heads, num_kv_heads, *, mistake=None):
    rows, E = weight.shape
    D = rows // num_heads
    if mistake == "strided":
        return weight.view(num_heads // num_kv_heads, num_kv_heads, D, E).mean(dim=0).reshape(num_kv_heads * D, E)
    grouped = weight.view(num_kv_heads, num_heads // num_kv_heads, D, E)
    if mistake == "sum":
        return grouped.sum(dim=1).reshape(num_kv_heads * D, E)
    if mistake == "first":
        return grouped[:, 0].reshape(num_kv_heads * D, E)
    if mistake == "over width":
        return weight.view(num_heads, D, E).mean(dim=1).repeat_interleave(D, dim=0)[: num_kv_heads * D]
    return grouped.mean(dim=1).reshape(num_kv_heads * D, E)


def mean_pool_loop(weight, num_heads, num_kv_heads):
    D = weight.size(0) // num_heads
    group = num_heads // num_kv_heads
    blocks = []
    for g in range(num_kv_heads):
        heads = [weight[h * D:(h + 1) * D] for h in range(g * group, (g + 1) * group)]
        blocks.append(sum(heads) / group)
    return torch.cat(blocks)


def mean_pool_in_place(weight, num_heads, num_kv_heads):
    weight.mul_(1.0)  # harmless, but then...
    weight[0] = 0.0  # ...it writes into the caller's weight
    return mean_pool(weight, num_heads, num_kv_heads)


def receptive_field(windows, seq_len, *, mistake=None):
    if mistake == "skip global":  # layers without a window add nothing
        windows = [w for w in windows if w is not None]
    if any(w is None for w in windows):
        return int(seq_len)
    if mistake == "sum of windows":
        return min(seq_len, sum(windows))
    if mistake == "no clamp":
        return sum(w - 1 for w in windows) + 1
    if mistake == "last layer":
        return min(seq_len, windows[-1])
    if mistake == "without itself":
        return min(seq_len, sum(w - 1 for w in windows))
    if mistake == "mistral convention":
        return min(seq_len, sum(windows) + 1)
    if mistake == "first window for all":
        return min(seq_len, len(windows) * (windows[0] - 1) + 1)
    return min(seq_len, sum(w - 1 for w in windows) + 1)


def receptive_field_loop(windows, seq_len):
    """Another way: walk down the stack, widening the reach layer by layer."""
    reach = 1
    for window in reversed(windows):
        reach = seq_len if window is None else reach + window - 1
    return int(np.minimum(reach, seq_len))


def receptive_field_one_window(windows, seq_len):
    """Section 4's formula with a single window for every layer: right only when all windows are equal."""
    if any(w is None for w in windows):
        return int(seq_len)
    return min(seq_len, len(windows) * (windows[0] - 1) + 1)


def read_in_order(buffer, seen, *, mistake=None):
    window = buffer.size(-2)
    if mistake == "slot order":
        return buffer if seen >= window else buffer[..., :seen, :]
    if mistake == "always window":
        return buffer.roll(-(seen % window), dims=-2)
    if seen < window:
        return buffer[..., :seen, :]
    if mistake == "newest first":
        return buffer.roll(-(seen % window), dims=-2).flip(-2)
    if mistake == "wrong sign":
        return buffer.roll(seen % window, dims=-2)
    if mistake == "one late":
        return buffer.roll(-(seen % window) - 1, dims=-2)
    return buffer.roll(-(seen % window), dims=-2)


def read_in_order_index(buffer, seen):
    """Another way: the slots of positions seen - kept .. seen - 1, in that order."""
    window = buffer.size(-2)
    positions = torch.arange(max(0, int(seen) - window), int(seen))
    return buffer[..., positions % window, :]


def read_in_order_package(buffer, seen):
    import attn_course as ac
    cache = ac.RollingKVCache(1, buffer.size(0), buffer.size(1), buffer.size(-1), buffer.size(-2))
    return cache._kept_in_order(buffer, int(seen))


def test_right_answers_pass():
    for feedback in (check_gqa_cache_bytes(cache_bytes),
                     check_gqa_cache_bytes(lambda *a: np.prod([2, *[x for x in a[:-1]]]) // a[3] * (a[3] if a[-1] is None else min(a[3], a[-1]))),
                     check_grouped_attention(grouped_attention), check_grouped_attention(grouped_attention_einsum),
                     check_grouped_attention(grouped_attention_folded_mask),
                     check_grouped_attention(grouped_attention_loop_heads),
                     check_mean_pool_kv(mean_pool), check_mean_pool_kv(mean_pool_loop), check_receptive_field(receptive_field),
                     check_receptive_field(receptive_field_loop),
                     check_rolling_read(read_in_order), check_rolling_read(read_in_order_index)):
        assert feedback.status == "correct", str(feedback)
        assert bool(feedback)


def test_an_answer_for_the_notebooks_sizes_only_fails_on_other_sizes():
    feedback = check_grouped_attention(grouped_attention_fixed_sizes)
    assert feedback.status == "error" and "called with q of shape (1, 8, 4, 2)" in feedback.message, str(feedback)


def test_a_mask_for_as_many_queries_as_keys_is_named():
    """Right whenever L == S, as in section 2's code; wrong after a cache (decoding)."""
    def square_mask(q, k, v):
        B, H, L, D = q.shape
        G, n = k.size(1), q.size(1) // k.size(1)
        scores = (q.reshape(B, G, n * L, D) @ k.transpose(-2, -1) / math.sqrt(D)).view(B, G, n, L, k.size(2))
        scores = scores.masked_fill(~torch.ones(L, k.size(2), dtype=torch.bool, device=q.device).tril(), float("-inf"))
        return (scores.softmax(-1).view(B, G, n * L, k.size(2)) @ v).view(B, H, L, D)

    feedback = check_grouped_attention(square_mask)
    assert feedback.status == "incorrect" and "top-left corner" in feedback.message, str(feedback)


def test_float32_grouped_attention_passes():
    assert check_grouped_attention(lambda q, k, v: grouped_attention(q.float(), k.float(), v.float()))


def test_a_float64_rolling_read_gets_feedback_not_a_crash():
    feedback = check_rolling_read(lambda b, s: read_in_order(b, s).double())
    assert feedback.status in ("correct", "incorrect"), str(feedback)


# --- wrong answers say what is wrong -------------------------------------------------------------

@pytest.mark.parametrize(
    "check, answer, text",
    [
        (check_gqa_cache_bytes, lambda *a: cache_bytes(*a, mistake="no values"), "keys \\*and\\* values"),
        (check_gqa_cache_bytes, lambda *a: cache_bytes(*a, mistake="ignore window"), "ignored the window"),
        (check_gqa_cache_bytes, lambda *a: cache_bytes(*a, mistake="window always"), "longer than the sequence"),
        (check_gqa_cache_bytes, lambda *a: cache_bytes(*a) + 1, "expected"),
        (check_gqa_cache_bytes, lambda *a: cache_bytes(*a, mistake="window + 1"), "off by one"),
        (check_gqa_cache_bytes, lambda *a: cache_bytes(*a, mistake="window - 1"), "off by one"),
        (check_gqa_cache_bytes, lambda *a: cache_bytes(*a, mistake="no batch"), "left out the batch"),
        (check_gqa_cache_bytes, lambda *a: cache_bytes(*a) / 2**30, "GiB"),  # GiB, not bytes
        (check_gqa_cache_bytes, lambda *a: str(cache_bytes(*a)), "return a number"),
        (check_grouped_attention, lambda q, k, v: grouped_attention(q, k, v, mistake="tile"), "h % G"),
        (check_grouped_attention, lambda q, k, v: grouped_attention(q, k, v, mistake="h // G"), "group size is H // G"),
        (check_grouped_attention, lambda q, k, v: grouped_attention(q, k, v, mistake="no scale"), "sqrt\\(D\\)"),
        (check_grouped_attention, lambda q, k, v: grouped_attention(q, k, v, mistake="no mask"), "causal mask"),
        (check_grouped_attention, lambda q, k, v: grouped_attention(q, k, v)[:, :2], "expected shape"),
        (check_grouped_attention, lambda q, k, v: grouped_attention(q, k, v, mistake="no diagonal"),
         "does not see its own position"),
        (check_grouped_attention, lambda q, k, v: grouped_attention(q, k, v, mistake="top-left"), "top-left corner"),
        (check_grouped_attention, lambda q, k, v: grouped_attention(q, k, v, mistake="naive softmax"), "inf or NaN"),
        (check_grouped_attention, grouped_attention_sdpa, "you called torch.nn.functional.scaled_dot_product_attention:"),
        (check_grouped_attention, grouped_attention_package, "you called attn_course"),
        # fourth review: F.sdpa without enable_gqa (forbidden by the statement too), a mask over the folded rows
        (check_grouped_attention, grouped_attention_sdpa_folded, "you called torch.nn.functional.scaled_dot_product_attention:"),
        (check_grouped_attention, grouped_attention_mask_over_folded_rows, "every key blocked.*over the folded rows"),
        (check_grouped_attention, grouped_attention_repeat_interleave, "repeat_interleave.*without copying"),
        (check_grouped_attention, lambda q, k, v: grouped_attention_index(q, k.repeat(1, q.size(1) // k.size(1), 1, 1),
                                                                          v.repeat(1, q.size(1) // k.size(1), 1, 1),
                                                                          torch.arange(q.size(1))), "repeat"),
        (check_grouped_attention, grouped_attention_in_place, "changed its input `q` in place"),
        (check_grouped_attention, grouped_attention_index, "made a copy of the keys"),
        (check_grouped_attention, grouped_attention_expand_reshape, "made a copy of the keys"),
        (check_grouped_attention, grouped_attention_cat, "made a copy of the keys"),
        (check_grouped_attention, lambda q, k, v: grouped_attention(q, k, v, mistake="broadcast"),
         "torch.matmul carries out such a broadcast by copying"),
        (check_grouped_attention, grouped_attention_expand_view, "torch.matmul carries out such a broadcast by copying"),
        (check_grouped_attention, grouped_attention_loop_groups, "torch.matmul carries out such a broadcast by copying"),
        (check_grouped_attention, grouped_attention_contiguous_5d, "made a copy of the keys.*Tensor.contiguous"),
        (check_grouped_attention, grouped_attention_index_transposed, "made a copy of the keys.*__getitem__"),
        (check_grouped_attention, grouped_attention_index_scaled, "made a copy of the keys.*__getitem__"),
        (check_grouped_attention, grouped_attention_buffer, "made a copy of the keys.*copy_"),
        (check_grouped_attention, grouped_attention_cpu_mask, "works only with CPU tensors"),
        (check_grouped_attention, grouped_attention_loop_copies, "made a copy of the keys.*Tensor.contiguous"),
        (check_grouped_attention, lambda q, k, v: grouped_attention_loop_copies(q, k, v, "clone"),
         "made a copy of the keys.*Tensor.clone"),
        (check_grouped_attention, lambda q, k, v: grouped_attention_loop_copies(q, k, v, "transposed"),
         "made a copy of the keys.*Tensor.contiguous"),
        # the right numbers moved to the CPU: named on the meta device ("Cannot copy out") as on a GPU
        (check_grouped_attention, lambda q, k, v: grouped_attention(q, k, v).cpu(),
         "works only with CPU tensors|your result is on cpu"),
        (check_grouped_attention, lambda q, k, v: grouped_attention(q, k, v).long(), "floating-point"),
        (check_mean_pool_kv, lambda w, h, g: mean_pool(w, h, g, mistake="sum"), "summed"),
        (check_mean_pool_kv, lambda w, h, g: mean_pool(w, h, g, mistake="strided"), "consecutive"),
        (check_mean_pool_kv, lambda w, h, g: mean_pool(w, h, g, mistake="first"), "first head"),
        (check_mean_pool_kv, lambda w, h, g: mean_pool(w, h, g, mistake="over width"), "differ"),
        (check_mean_pool_kv, mean_pool_in_place, "changed its input `weight` in place"),
        (check_mean_pool_kv, lambda w, h, g: mean_pool(w, 8, 2), "differ|expected shape|Your code raised"),
        (check_receptive_field, lambda w, s: receptive_field(w, s, mistake="sum of windows"), "window - 1"),
        (check_receptive_field, lambda w, s: receptive_field(w, s, mistake="no clamp"), "start of the sequence"),
        (check_receptive_field, lambda w, s: receptive_field(w, s, mistake="last layer"), "one layer's view"),
        (check_receptive_field, lambda w, s: float(receptive_field(w, s)), "return an int"),
        (check_receptive_field, lambda w, s: receptive_field(w, s, mistake="without itself"), "one short"),
        (check_receptive_field, lambda w, s: receptive_field(w, s, mistake="mistral convention"), "Mistral paper"),
        (check_receptive_field, lambda w, s: receptive_field(w, s, mistake="skip global"), "without a window"),
        (check_receptive_field, lambda w, s: receptive_field(w, s, mistake="first window for all"), "one layer's window"),
        (check_receptive_field, receptive_field_one_window, "one layer's window for every layer"),
        # the review's one-layer answer that forgets the sequence's end when the window is longer
        (check_receptive_field, lambda w, s: (min(s, sum(x - 1 for x in w) + 1) if len(w) > 1 else w[0])
         if None not in w else s, "start of the sequence"),
        (check_rolling_read, lambda b, s: read_in_order(b, s, mistake="slot order"), "slot order"),
        (check_rolling_read, lambda b, s: read_in_order(b, s, mistake="always window"), "only 3 positions were written"),
        (check_rolling_read, lambda b, s: read_in_order(b, s, mistake="newest first"), "newest first"),
        (check_rolling_read, lambda b, s: read_in_order(b, s, mistake="wrong sign"), "wrong way"),
        (check_rolling_read, lambda b, s: read_in_order(b, s, mistake="one late"), "one slot too late"),
        (check_rolling_read, read_in_order_package, "you called attn_course"),
        (check_rolling_read, lambda b, s: read_in_order(b, s).half(), "half|float16"),
        (check_rolling_read, lambda b, s: read_in_order(b, s).cpu(), "works only with CPU tensors|your result is on cpu"),
    ],
)
def test_wrong_answers_are_rejected_with_a_reason(check, answer, text):
    feedback = check(answer)
    assert feedback.status == "incorrect", str(feedback)
    assert not feedback
    assert re.search(text, feedback.message), feedback.message


@pytest.mark.parametrize("check", [check_gqa_cache_bytes, check_grouped_attention, check_mean_pool_kv, check_receptive_field,
                                   check_rolling_read])
def test_scaffolds_and_crashes(check):
    """A stub is "not attempted"; a crash an "error" with the hint."""
    assert check(_scaffold).status == "not attempted"
    assert check(...).status == "not attempted"

    def crash(*args):
        raise RuntimeError("boom")

    feedback = check(crash)
    assert feedback.status == "error" and "boom" in feedback.message and feedback.hint
