"""Checks for the exercises of chapter 10, grouped-query attention and sliding windows.

Each check tries the answer on cases chosen so that the usual mistakes give a wrong result, and names
the mistake when it recognises one; the table of those mistakes is in tests/test_exercises_ch10.py.
They use the shared mechanism of ``attn_course.exercises``: torch's and the package's attention (also
``enable_gqa=True``) forbidden where the exercise asks for the grouping itself, and the copies of
``repeat_interleave`` that section 2 already showed; every other copy of the keys or values per query
head seen at the level of PyTorch's kernels (:func:`attn_course.gqa.kv_copies`: indexing, ``cat``,
``contiguous`` after ``expand``, copies made one query head at a time in a loop, and the copy that ``torch.matmul`` makes when it broadcasts a
key/value head over its query heads); inputs watched for changes in place; sizes unlike the
notebook's (one key/value head, as many as query heads, groups of 3, one position, batch 1 and 3);
scores near 100 in float32; one case on the notebook's GPU or the meta device (exercises 2 and 5: a result
moved to the CPU is named); numbers given as numpy
integers; in exercise 4, stacks mixing windows and layers without one.
"""

from __future__ import annotations

import math

import torch

from ..gqa import kv_copies
from . import (Mismatch, attempted, call, call_elsewhere, exercise, expect, expect_close, expect_int, expect_number,
               expect_on_device, expect_tensor, forbidden, large_scores, other_device, randn, rng)

__all__ = ["check_gqa_cache_bytes", "check_grouped_attention", "check_mean_pool_kv", "check_receptive_field",
           "check_rolling_read"]


@exercise(
    "Exercise 1, the cache of grouped-query attention, with and without a window",
    hint="keys and values (two tensors) for every layer, sequence, key/value head, position kept and number of the "
         "head width, each taking bytes_per_number bytes; without a window every position is kept, with one only "
         "the last window positions (or fewer, while the sequence is shorter)",
)
def check_gqa_cache_bytes(cache_bytes) -> str:
    import numpy as np

    cases = [  # (num_layers, num_kv_heads, head_dim, seq_len, batch_size, bytes_per_number, window)
        (32, 8, 128, 4096, 1, 2, None),  # 32 layers, 8 kv heads of width 128 (Llama 3 8B, Mistral 7B)
        (32, 8, 128, 32768, 1, 2, 4096),  # Mistral 7B: window 4096
        (2, 1, 16, 100, 3, 4, None),
        (2, 2, 16, 10, 3, 4, 64),  # a window longer than the sequence
        (4, 4, 8, 64, 2, 2, 64),  # a window exactly the sequence
        (np.int64(80), np.int64(8), np.int64(128), np.int64(4096), np.int64(16), np.int64(2), None),  # numpy ints
    ]
    for num_layers, num_kv_heads, head_dim, seq_len, batch_size, bytes_per_number, window in cases:
        kept = seq_len if window is None else min(seq_len, window)
        expected = int(2 * num_layers * batch_size * num_kv_heads * kept * head_dim * bytes_per_number)
        what = (f"cache_bytes(num_layers={num_layers}, num_kv_heads={num_kv_heads}, head_dim={head_dim}, seq_len={seq_len}, "
                f"batch_size={batch_size}, bytes_per_number={bytes_per_number}, window={window})")
        got = expect_number(call(cache_bytes, num_layers, num_kv_heads, head_dim, seq_len, batch_size, bytes_per_number,
                                 window), what=what)
        per_position = expected // int(kept)
        if got == expected / 2:
            raise Mismatch(f"{what} = {got:,}, exactly half the answer: the cache stores keys *and* values")
        if window is not None and got == per_position * seq_len != expected:
            raise Mismatch(f"{what} = {got:,}: you ignored the window; only the last {window} positions are kept")
        if window is not None and got == per_position * window != expected:
            raise Mismatch(f"{what} = {got:,}: the window is longer than the sequence here, so only {seq_len} positions "
                           "are stored")
        if window is not None and window < seq_len and got in (per_position * (window + 1), per_position * (window - 1)):
            raise Mismatch(f"{what} = {got:,}: the window is off by one; the cache keeps exactly the last {window} positions")
        if batch_size > 1 and got == expected // batch_size:
            raise Mismatch(f"{what} = {got:,}: you left out the batch; every sequence of the batch has its own cache")
        if got == expected / 2**30 or got == expected / 1e9:
            raise Mismatch(f"{what} = {got}: that is the size in GiB (or GB); return it in bytes")
        expect(got == expected, f"{what}: expected {expected:,} bytes, got {got:,}")
    return "your sizes are right with and without a window, for any batch, and with numpy integers too."


def _causal_grouped(q, k, v, owner, *, scale=True, masked=True, mask_offset=0, top_left=False):
    """Causal attention of every query head h to key/value head owner[h], in float64; the L queries are the
    last L of the S positions (``top_left``: wrongly, the first L)."""
    D, L, S = q.size(-1), q.size(-2), k.size(-2)
    k_full, v_full = k[:, owner].double(), v[:, owner].double()  # (B, H, S, D)
    scores = q.double() @ k_full.transpose(-2, -1) / (math.sqrt(D) if scale else 1.0)  # (B, H, L, S)
    if masked:
        allowed = torch.ones(L, S, dtype=torch.bool).tril(mask_offset + (0 if top_left else S - L))
        scores = scores.masked_fill(~allowed, float("-inf"))
    return scores.softmax(dim=-1) @ v_full  # (B, H, L, D)


@exercise(
    "Exercise 2, grouped-query attention without copying keys and values",
    hint="the query heads of a group are consecutive, so the queries can stand in line along the query axis, "
         "(B, G, H/G * L, D): each row then meets its group's one key/value head in an ordinary batched matrix "
         "product, with nothing to broadcast; mask and normalise per head as in chapter 04, remembering that each "
         "head's L queries are the positions S - L .. S - 1, then unfold the result to (B, H, L, D)",
    forbid=("sdpa", "enable_gqa"),
)
def check_grouped_attention(grouped_attention) -> str:
    if not callable(grouped_attention):
        call(grouped_attention)  # ``...`` or None: not attempted; anything else named
    g = rng(11)
    # (B, H, G, L, S, D): groups of 2 (where h // G is a valid, wrong index), of 3, multi-query (G = 1), multi-head
    # (G = H), one query after a cache (decoding), fewer queries than keys, batch 1 and 3, odd head widths.
    cases = ((1, 8, 4, 4, 4, 2), (2, 6, 2, 5, 5, 4), (3, 4, 1, 3, 3, 5), (2, 3, 3, 4, 4, 3), (1, 4, 2, 1, 1, 8),
             (2, 8, 2, 3, 7, 4), (1, 4, 1, 1, 6, 2), (2, 6, 3, 2, 5, 3))
    for B, H, G, L, S, D in cases:
        q = randn(B, H, L, D, generator=g, dtype=torch.float64)
        k = randn(B, G, S, D, generator=g, dtype=torch.float64)
        v = randn(B, G, S, D, generator=g, dtype=torch.float64)
        _check_grouped_case(grouped_attention, q, k, v)
    # Scores near 100 in float32: a softmax written without its max shift overflows.
    q = large_scores(2, 4, 5, 4, generator=g)  # rows of about +100 and -100
    k = randn(2, 2, 5, 4, generator=g) + 1.0  # mostly positive: scores of a few hundred either way
    v = randn(2, 2, 5, 4, generator=g)
    _check_grouped_case(grouped_attention, q, k, v)
    # Another device: the notebook's GPU, or the meta device (a mask made without device= is named).
    device = other_device()
    q, k, v = (randn(*shape, generator=g).to(device) for shape in ((2, 4, 3, 2), (2, 2, 5, 2), (2, 2, 5, 2)))
    shown = f"grouped_attention(q, k, v) with q, k and v on the {device.type} device"
    got = call_elsewhere(grouped_attention, q, k, v, device=device, what=shown)
    if got is not None:
        got = expect_on_device(got, device, shown, dtype="float")
        expect_tensor(got, what=shown, shape=(2, 4, 3, 2), dtype="float")
        if device.type != "meta":
            expect_close(got, _causal_grouped(q.cpu(), k.cpu(), v.cpu(), torch.arange(4) // 2).float().to(device),
                         what=shown)
    return ("your grouping is the one of F.scaled_dot_product_attention(..., enable_gqa=True): query head h reads "
            "key/value head h // (H / G), and no key or value was copied per query head, not even inside a matrix "
            "product.")


def _check_grouped_case(grouped_attention, q, k, v) -> None:
    B, H, L, D = q.shape
    G = k.size(1)
    S = k.size(2)
    what = f"grouped_attention(q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, {q.dtype})"
    group = H // G
    with forbidden(torch.repeat_interleave, torch.Tensor.repeat, torch.tile,
                   reason="this exercise asks for the grouping without copying the key/value heads (section 2 "
                          "copied them); fold the query heads of each group into the query axis instead"):
        # kv_copies inside call: the copies call makes of the inputs (to see changes in place) are not the answer's
        try:
            got, copies = call(lambda q, k, v: kv_copies(grouped_attention, q, k, v), q, k, v)
        except Mismatch as error:  # a forbidden call is the answer's, not the watcher's
            raise Mismatch(str(error).replace(" (inside attn_course.gqa.kv_copies)", "")) from None
    got = attempted(got)
    got = expect_tensor(got, what=what, shape=(B, H, L, D), dtype="float", device=q)
    owner = torch.arange(H) // group  # query head h reads key/value head h // (H / G)
    expected = _causal_grouped(q, k, v, owner)
    close = lambda wrong: torch.allclose(got.detach().double().cpu(), wrong, atol=1e-5, equal_nan=True)  # noqa: E731
    if not close(expected):
        candidates = {
            f"query head h read key/value head h % G (0, 1, 0, 1, ...: tiled); query head h must read key/value head "
            f"h // (H / G), so the group of key/value head g is the consecutive query heads g * {group} .. "
            f"(g + 1) * {group} - 1": torch.arange(H) % G,
            f"query head h read key/value head h // G; the group size is H // G = {group}, so it is h // (H // G)":
                torch.arange(H) // G,
        }
        for mistake, wrong_owner in candidates.items():
            if int(wrong_owner.max()) < G and not torch.equal(wrong_owner, owner) and \
                    close(_causal_grouped(q, k, v, wrong_owner)):
                raise Mismatch(f"{what}: {mistake}")
        if close(_causal_grouped(q, k, v, owner, scale=False)):
            raise Mismatch(f"{what}: the scores are not divided by sqrt(D)")
        if L < S and close(_causal_grouped(q, k, v, owner, top_left=True)):
            raise Mismatch(f"{what}: your causal mask is aligned to the top-left corner, as if the {L} queries were "
                           f"positions 0 .. {L - 1}; they are the last {L} of the {S} positions (the earlier ones sit "
                           f"in the cache), so query i is position {S - L} + i and sees keys 0 .. {S - L} + i")
        if L > 1 and close(_causal_grouped(q, k, v, owner, masked=False)):
            raise Mismatch(f"{what}: every query sees every key: apply the causal mask (query i, position S - L + i, "
                           "sees keys 0 .. S - L + i)")
        if close(_causal_grouped(q, k, v, owner, mask_offset=-1)):
            raise Mismatch(f"{what}: a query does not see its own position; the causal mask keeps keys up to and "
                           "including the query's position")
    if copies and group > 1:
        copy = copies[0]
        if copy.function in ("Tensor.matmul", "torch.matmul", "Tensor.__matmul__", "Tensor.__rmatmul__"):
            raise Mismatch(f"{what}: your matrix product broadcast each key/value head over the {group} query heads of "
                           f"its group, and torch.matmul carries out such a broadcast by copying: it wrote "
                           f"{copy.numbers} numbers of the {copy.of} ({copy.op} of shape {copy.shape}) from "
                           f"{copy.source}. Fold the query heads of a group into the query axis instead, so that the "
                           "product has the same batch axes on both sides and nothing to broadcast")
        raise Mismatch(f"{what}: your code made a copy of the {copy.of} for every query head ({copy.function} ran "
                       f"{copy.op}, writing {copy.numbers} numbers from {copy.source}); this exercise asks for the "
                       "grouping without it: fold the query heads of each group into the query axis, so that each "
                       "key/value head is used as it is")
    if not torch.isfinite(got).all() and q.dtype == torch.float32 and q.abs().amax() > 50:  # the large-scores case
        raise Mismatch(f"{what}: your result contains inf or NaN: with scores of a few hundred, exp overflows float32; "
                       "subtract each row's maximum before exponentiating (or use a softmax)")
    if not torch.isfinite(got).all():
        raise Mismatch(f"{what}: your result contains inf or NaN, with small scores in float64, so it is no overflow: "
                       "some query row has every key blocked (a softmax over nothing but -inf is NaN). Did you build "
                       f"the causal mask over the folded rows, as if the {group} * {L} rows of a group were positions? "
                       f"Each head's {L} rows need the same ({L}, {S}) mask, query i at position {S - L} + i: repeat "
                       f"it for the {group} heads of a group, or mask before folding (or after unfolding)")
    expect_close(got, expected.to(q.dtype), what=what)


@exercise(
    "Exercise 3, mean-pooling key/value heads (Ainslie et al.)",
    hint="the weight holds one block of head_dim rows per head, in head order; the group of key/value head g is "
         "the consecutive heads g * H/G to (g + 1) * H/G - 1; average their blocks, element by element, into one "
         "block per group",
)
def check_mean_pool_kv(mean_pool) -> str:
    import numpy as np

    g = rng(12)
    # (H, G, D, E): the notebook's case, then multi-query, multi-head, groups of 3, and numpy integers.
    for H, G, D, E, dtype in ((8, 2, 3, 5, torch.float64), (4, 1, 2, 3, torch.float64), (3, 3, 4, 2, torch.float64),
                              (6, 2, 4, 3, torch.float32), (np.int64(8), np.int64(4), 2, 4, torch.float64)):
        weight = randn(int(H) * D, E, generator=g, dtype=dtype)
        what = f"mean_pool(weight of shape {(int(H) * D, E)}, num_heads={H}, num_kv_heads={G})"
        got = expect_tensor(call(mean_pool, weight, H, G), what=what, shape=(int(G) * D, E), dtype="float",
                            device=weight)
        H, G = int(H), int(G)
        heads = weight.double().view(H, D, E)
        expected = heads.view(G, H // G, D, E).mean(dim=1).reshape(G * D, E)
        gd = got.detach().double().cpu()
        if not torch.allclose(gd, expected, atol=1e-5) and G < H:
            candidates = {
                "you summed the heads of each group; Ainslie et al. take the mean (a sum makes keys H/G times larger)":
                    heads.view(G, H // G, D, E).sum(dim=1).reshape(G * D, E),
                "you averaged heads h, h + G, h + 2G, ...; the group of key/value head g is the consecutive query heads "
                "g * H/G .. (g + 1) * H/G - 1": heads.view(H // G, G, D, E).mean(dim=0).reshape(G * D, E),
                "you kept the first head of each group; mean-pooling averages all heads of the group":
                    heads.view(G, H // G, D, E)[:, 0].reshape(G * D, E),
                "you averaged within each head's rows instead of across the heads of a group":
                    heads.view(G, H // G, D, E).mean(dim=2, keepdim=True).expand(G, H // G, D, E)[:, 0].reshape(G * D, E),
            }
            for mistake, wrong in candidates.items():
                if torch.allclose(gd, wrong, atol=1e-5):
                    raise Mismatch(f"{what}: {mistake}")
        expect_close(got, expected.to(dtype), what=what)
    return "your pooled weights match GroupedQueryAttention.from_multihead: each key/value head is its group's mean."


@exercise(
    "Exercise 4, how far back does a stack of windowed and global layers see?",
    hint="a layer whose window holds w positions carries information at most w - 1 positions further back, a layer "
         "without a window any distance; add up what the layers carry, count the last position itself, and "
         "remember that nothing lies before the first token",
)
def check_receptive_field(receptive_field) -> str:
    import numpy as np

    cases = (([4], 100), ([4, 4, 4], 100), ([1, 1], 50), ([5] * 6, 20), ([4096] * 32, 32768), ([4096] * 32, 200_000),
             ([1], 1), ([8], 5), ([2, 6], 100), ([3, 5, 2], 100), ([4, None], 100), ([None, 4, 4], 100), ([None], 7),
             ([4096, None] * 4, 32768), ((np.int64(3), np.int64(4)), np.int64(9)), ((2, 3, 4), 100))
    for windows, seq_len in cases:
        windows_shown = list(windows) if isinstance(windows, list) else tuple(int(w) for w in windows)
        what = f"receptive_field({windows_shown}, seq_len={int(seq_len)})"
        windowed = [int(w) for w in windows if w is not None]
        reach = sum(w - 1 for w in windowed) + 1  # positions the windowed layers reach, the last one included
        has_global = len(windowed) < len(windows)
        expected = int(seq_len) if has_global else min(int(seq_len), reach)
        got = expect_int(call(receptive_field, windows, seq_len), what=what)
        if got == expected:
            continue
        s = int(seq_len)
        if has_global and got == min(s, reach):
            raise Mismatch(f"{what} = {got}: a layer without a window (None) lets every position see all the positions "
                           "before it, so the last position's view reaches the first token")
        if not has_global and got == min(s, sum(windowed)):
            raise Mismatch(f"{what} = {got}: adding the windows counts the token itself once per layer; each layer "
                           "adds its window - 1")
        if not has_global and got == reach:
            raise Mismatch(f"{what} = {got}: a token cannot see further back than the start of the sequence (seq_len)")
        if not has_global and got == reach - 1:
            raise Mismatch(f"{what} = {got}: one short; count the last position itself too (one layer with a window "
                           f"of {windowed[-1]} sees {windowed[-1]} positions)")
        if not has_global and got == min(s, sum(windowed) + 1):
            raise Mismatch(f"{what} = {got}: that is the Mistral paper's convention, where a window W holds W + 1 "
                           "positions (i - W to i); here a window of w holds w positions, the query's own included")
        if not has_global and len(set(windowed)) > 1 and got in (min(s, len(windowed) * (w - 1) + 1) for w in windowed):
            raise Mismatch(f"{what} = {got}: you used one layer's window for every layer; the windows differ here, so "
                           "add what each layer carries")
        if not has_global and len(windowed) > 1 and got in (min(s, w) for w in windowed):
            raise Mismatch(f"{what} = {got}: that is one layer's view; stacked layers relay information further")
        expect(False, f"{what}: expected {expected}, got {got}")
    return ("right: Mistral's 32 layers with a window of 4,096 relay information 131,040 positions back, and one "
            "layer without a window anywhere in the stack lets the last position see the whole sequence.")


def _kept(keys: torch.Tensor, seen: int, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rolling buffer after ``seen`` positions of ``keys`` (B, G, T, D) were written, and what it keeps."""
    buffer = torch.zeros(*keys.shape[:2], window, keys.size(-1), dtype=keys.dtype)
    for p in range(seen):
        buffer[:, :, p % window] = keys[:, :, p]
    return buffer, keys[:, :, max(0, seen - window):seen]


@exercise(
    "Exercise 5, reading a rolling buffer in position order",
    hint="while fewer than window positions were written they sit in the first slots, in order; after that the "
         "oldest kept position is the one written next, so the reading starts at the slot seen mod window and "
         "wraps around to the start of the buffer",
    forbid=("attn_course",),
)
def check_rolling_read(read_in_order) -> str:
    import numpy as np

    g = rng(13)
    # (B, G, window, D, seen): still filling, exactly full, one past, several turns, a window of 1, numpy seen.
    cases = ((1, 1, 4, 1, 3), (2, 2, 4, 3, 4), (1, 2, 4, 2, 5), (2, 1, 5, 2, 13), (1, 3, 3, 2, 9), (2, 1, 1, 4, 6),
             (1, 1, 6, 2, np.int64(8)))
    for B, G, window, D, seen in cases:
        keys = randn(B, G, int(seen), D, generator=g)
        buffer, expected = _kept(keys, int(seen), window)
        what = f"read_in_order(buffer of shape {tuple(buffer.shape)}, seen={seen}) (window {window})"
        got = expect_tensor(call(read_in_order, buffer, seen), what=what, dtype="float", device=buffer)
        kept = min(int(seen), window)
        if tuple(got.shape) == tuple(buffer.shape) and kept < window:
            raise Mismatch(f"{what}: only {kept} positions were written, so return {kept} of the {window} slots; the "
                           "others hold nothing yet (shape (B, G, min(seen, window), D))")
        expect_tensor(got, what=what, shape=expected.shape)
        gd = got.detach().double().cpu()  # compared in float64, whatever the dtype of the answer
        if not torch.allclose(gd, expected.double()):
            start = int(seen) % window
            candidates = {
                "these are the slots in slot order; attention needs the positions oldest first, and after the buffer "
                "wrapped the oldest is not in slot 0": buffer,
                "your positions come newest first; read them oldest first": expected.flip(-2),
                "your reading starts one slot too late": buffer.roll(-(start + 1), dims=-2),
                "your reading starts one slot too early": buffer.roll(-(start - 1), dims=-2),
                "you rolled the buffer the wrong way: the oldest kept position is in slot seen mod window, and must "
                "come first": buffer.roll(start, dims=-2),
            }
            for mistake, wrong in candidates.items():
                if kept == window and wrong.shape == expected.shape and not torch.allclose(wrong, expected) and \
                        torch.allclose(gd, wrong.double()):
                    raise Mismatch(f"{what}: {mistake}")
        expect_close(got, expected, what=what)
    # Another device: the notebook's GPU, or the meta device (a result moved to the CPU is named).
    device = other_device()
    keys = randn(2, 1, 7, 3, generator=g)
    buffer, expected = _kept(keys, 7, 4)
    shown = f"read_in_order(buffer of shape {tuple(buffer.shape)}, seen=7) with the buffer on the {device.type} device"
    got = call_elsewhere(read_in_order, buffer.to(device), 7, device=device, what=shown)
    if got is not None:
        got = expect_on_device(got, device, shown, dtype="float")
        expect_tensor(got, what=shown, shape=expected.shape)
        if device.type != "meta":
            expect_close(got, expected.to(device), what=shown)
    return ("your reading gives the kept positions oldest first, as attn_course.RollingKVCache hands them to attention, "
            "while the buffer fills and after any number of turns.")
