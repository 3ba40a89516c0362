"""Grouped-query attention against PyTorch (enable_gqa) and MultiHeadAttention; windows and caches."""

import pytest
import torch
import torch.nn.functional as F

import attn_course as ac

from attn_course.gqa import _enable_gqa_supported

HAS_ENABLE_GQA = _enable_gqa_supported()
needs_enable_gqa = pytest.mark.skipif(not HAS_ENABLE_GQA, reason="this torch's scaled_dot_product_attention has no enable_gqa (torch < 2.5)")


def _heads(module, x, kv=None):
    B, T, _ = x.shape
    kv = x if kv is None else kv
    S = kv.size(1)
    q = module.q_proj(x).view(B, T, module.num_heads, module.head_dim).transpose(1, 2)  # (B, H, L, D)
    k = module.k_proj(kv).view(B, S, module.num_kv_heads, module.head_dim).transpose(1, 2)  # (B, G, S, D)
    v = module.v_proj(kv).view(B, S, module.num_kv_heads, module.head_dim).transpose(1, 2)
    return q, k, v


# -- the mask helper ---------------------------------------------------------------------------------
@pytest.mark.parametrize("L, window", [(1, 1), (5, 1), (6, 2), (7, 3), (4, 10)])
def test_sliding_window_mask_by_definition(L, window):
    mask = ac.sliding_window_mask(L, window)
    assert mask.dtype == torch.bool and mask.shape == (L, L)
    for i in range(L):
        for j in range(L):
            assert bool(mask[i, j]) == (i - window + 1 <= j <= i)


def test_sliding_window_mask_alignment_and_causal_limit(device):
    assert torch.equal(ac.sliding_window_mask(5, 5, device=device), ac.causal_mask(5, device=device))
    assert torch.equal(ac.sliding_window_mask(3, 100, 7), ac.causal_mask(3, 7))
    br = ac.sliding_window_mask(2, 3, 6, align="bottom_right")
    assert br.int().tolist() == [[0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1]]
    assert ac.sliding_window_mask(3, 2, device=device).device.type == device.type


# -- the module against references ---------------------------------------------------------------------
@needs_enable_gqa
@pytest.mark.parametrize("num_heads, num_kv_heads", [(8, 8), (8, 4), (8, 2), (8, 1), (6, 3)])
@pytest.mark.parametrize("backend", ["reference", "sdpa"])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_torch_enable_gqa(device, num_heads, num_kv_heads, backend, causal):
    torch.manual_seed(0)
    module = ac.GroupedQueryAttention(48, num_heads, num_kv_heads, backend=backend).to(device)
    x = torch.randn(2, 7, 48, device=device)
    out, weights = module(x, x, x, is_causal=causal)
    q, k, v = _heads(module, x)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)  # (B, H, L, D)
    expected = module.out_proj(expected.transpose(1, 2).reshape(2, 7, 48))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert weights.shape == (2, num_heads, 7, 7)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, num_heads, 7, device=device))
    # query head h reads key/value head h // (H / G)
    group = num_heads // num_kv_heads
    k_rep = k.repeat_interleave(group, dim=1)
    scores = (q @ k_rep.transpose(-2, -1)) / module.head_dim ** 0.5
    if causal:
        scores = scores.masked_fill(~ac.causal_mask(7, device=device), float("-inf"))
    torch.testing.assert_close(weights, scores.softmax(-1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_equal_heads_is_multihead_attention(device, backend):
    torch.manual_seed(1)
    mha = ac.MultiHeadAttention(32, 4, backend=backend).to(device)
    gqa = ac.GroupedQueryAttention(32, 4, 4, backend=backend).to(device)
    gqa.load_state_dict(mha.state_dict())
    x, kv = torch.randn(3, 5, 32, device=device), torch.randn(3, 9, 32, device=device)
    padding = torch.zeros(3, 9, dtype=torch.bool, device=device)
    padding[1, 6:] = True  # blocked convention: True at padding
    blocked = torch.rand(5, 9, device=device) > 0.7
    for kwargs in ({}, {"key_padding_mask": padding}, {"attn_mask": blocked}, {"is_causal": True},
                   {"key_padding_mask": padding, "attn_mask": torch.randn(3 * 4, 5, 9, device=device)}):
        want_out, want_w = mha(x, kv, kv, **kwargs)
        got_out, got_w = gqa(x, kv, kv, **kwargs)
        torch.testing.assert_close(got_out, want_out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got_w, want_w, atol=1e-5, rtol=1e-5)
    assert gqa(x, kv, kv, need_weights=False)[1] is None


def test_projection_shapes_and_mqa():
    module = ac.GroupedQueryAttention(64, 8, 1, bias=False)
    assert module.q_proj.weight.shape == (64, 64) and module.out_proj.weight.shape == (64, 64)
    assert module.k_proj.weight.shape == (8, 64) and module.v_proj.weight.shape == (8, 64)
    assert module.k_proj.bias is None
    gqa = ac.GroupedQueryAttention(64, 8, 2)
    assert gqa.k_proj.weight.shape == (16, 64) and gqa.v_proj.bias.shape == (16,)


def test_fully_masked_row_gives_zeros_not_nan():
    module = ac.GroupedQueryAttention(16, 4, 2)
    x = torch.randn(2, 3, 16)
    padding = torch.tensor([[True, True, True], [False, False, True]])  # batch 0: every key is padding
    out, weights = module(x, x, x, key_padding_mask=padding)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    torch.testing.assert_close(weights[0], torch.zeros_like(weights[0]))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_dtype_follows_the_module(dtype):
    module = ac.GroupedQueryAttention(16, 4, 2, rotary=True, window=2).to(dtype)
    x = torch.randn(2, 5, 16, dtype=dtype)
    out, weights = module(x, x, x)
    assert out.dtype == dtype and weights.dtype == dtype


def test_window_matches_an_explicit_mask():
    torch.manual_seed(2)
    windowed = ac.GroupedQueryAttention(32, 4, 2, window=3)
    plain = ac.GroupedQueryAttention(32, 4, 2)
    plain.load_state_dict(windowed.state_dict())
    x = torch.randn(2, 8, 32)
    blocked = ac.allowed_to_blocked(ac.sliding_window_mask(8, 3))
    torch.testing.assert_close(windowed(x, x, x)[0], plain(x, x, x, attn_mask=blocked)[0])
    weights = windowed(x, x, x)[1]
    assert bool((weights[..., ~ac.sliding_window_mask(8, 3)] == 0).all())


def test_rotary_module_uses_relative_positions():
    """A rotary GQA layer gives the same output to a sequence whatever it is preceded by, at the
    shifted positions, when a window hides the prefix: its scores depend on offsets only."""
    torch.manual_seed(3)
    module = ac.GroupedQueryAttention(32, 4, 2, rotary=True, window=4).double()
    x = torch.randn(1, 10, 32, dtype=torch.float64)
    full, _ = module(x, x, x)
    tail = x[:, 6:]  # the last position sees positions 6..9 only (window 4), in both runs
    tail_out, _ = module(tail, tail, tail)
    torch.testing.assert_close(full[:, -1], tail_out[:, -1])


def test_alibi_matches_an_explicit_bias():
    torch.manual_seed(4)
    with_alibi = ac.GroupedQueryAttention(32, 4, 4, alibi=True)
    plain = ac.GroupedQueryAttention(32, 4, 4)
    plain.load_state_dict(with_alibi.state_dict())
    x = torch.randn(2, 6, 32)
    bias = ac.alibi_bias(4, 6).masked_fill(~ac.causal_mask(6), float("-inf"))  # (H, L, S)
    torch.testing.assert_close(with_alibi(x, x, x, is_causal=True)[0],
                               plain(x, x, x, attn_mask=bias[None].expand(2, 4, 6, 6))[0])


def test_from_multihead_mean_pools_the_heads():
    torch.manual_seed(5)
    mha = ac.MultiHeadAttention(32, 8)
    gqa = ac.GroupedQueryAttention.from_multihead(mha, 2)
    assert gqa.num_kv_heads == 2
    k = mha.k_proj.weight.view(8, 4, 32)  # (H, D, E)
    torch.testing.assert_close(gqa.k_proj.weight.view(2, 4, 32), torch.stack([k[0:4].mean(0), k[4:8].mean(0)]))
    torch.testing.assert_close(gqa.q_proj.weight, mha.q_proj.weight)
    same = ac.GroupedQueryAttention.from_multihead(mha, 8)
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(same(x, x, x)[0], mha(x, x, x)[0])


# -- cached decoding ---------------------------------------------------------------------------------
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("window", [None, 1, 3, 6])
@pytest.mark.parametrize("rotary, alibi", [(False, False), (True, False), (False, True)])
def test_cached_decoding_equals_uncached(device, num_kv_heads, window, rotary, alibi):
    torch.manual_seed(6)
    module = ac.GroupedQueryAttention(32, 4, num_kv_heads, window=window, rotary=rotary, alibi=alibi).to(device).eval()
    x = torch.randn(2, 13, 32, device=device)
    expected, _ = module(x, x, x, is_causal=True)
    cache = module.new_cache(2, max_len=13)
    pieces, start = [], 0
    for size in (5, 1, 1, 4, 1, 1):  # a prefill, single tokens, a chunk longer than some windows
        pieces.append(module.forward_cached(x[:, start:start + size], cache))
        start += size
    torch.testing.assert_close(torch.cat(pieces, dim=1), expected, atol=1e-5, rtol=1e-5)
    assert cache.length == 13


def test_cache_sizes():
    module = ac.GroupedQueryAttention(64, 8, 2)
    cache = module.new_cache(3, max_len=100)
    assert isinstance(cache, ac.KVCache) and cache.nbytes == 2 * 3 * 2 * 100 * 8 * 4
    mha_cache = ac.GroupedQueryAttention(64, 8, 8).new_cache(3, max_len=100)
    assert mha_cache.nbytes == 4 * cache.nbytes
    windowed = ac.GroupedQueryAttention(64, 8, 2, window=16).new_cache(3)
    assert isinstance(windowed, ac.RollingKVCache) and windowed.nbytes == 2 * 3 * 2 * 16 * 8 * 4
    x = torch.randn(3, 40, 64)
    ac.GroupedQueryAttention(64, 8, 2, window=16).forward_cached(x, windowed)
    assert windowed.length == 40 and windowed.nbytes == 2 * 3 * 2 * 16 * 8 * 4  # it does not grow


def test_rolling_cache_keeps_the_last_window_positions():
    cache = ac.RollingKVCache(1, 1, 1, 1, window=3)
    for p in range(7):
        value = torch.full((1, 1, 1, 1), float(p))
        keys, _ = cache.update(0, value, value)
        assert keys.flatten().tolist() == [float(q) for q in range(max(0, p - 3), p + 1)]


@pytest.mark.parametrize("position", ["rotary", "alibi", "learned", "none", "sinusoidal"])
@pytest.mark.parametrize("num_kv_heads, window", [(None, None), (1, None), (2, 3)])
def test_decoder_only_lm_options_generate_the_same_with_the_cache(position, num_kv_heads, window):
    torch.manual_seed(7)
    model = ac.DecoderOnlyLM(13, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_len=32,
                             position=position, num_kv_heads=num_kv_heads, window=window).eval()
    prompt = torch.randint(0, 13, (2, 4))
    assert torch.equal(ac.generate(model, prompt, 10), ac.generate(model, prompt, 10, use_cache=False))


def test_decoder_only_lm_default_is_unchanged():
    torch.manual_seed(8)
    model = ac.DecoderOnlyLM(13, d_model=32, num_heads=4)
    assert all(isinstance(layer.self_attn, ac.MultiHeadAttention) for layer in model.layers)
    assert isinstance(model.positional, ac.PositionalEncoding) and model.position == "sinusoidal"


# -- bad calls ---------------------------------------------------------------------------------------
BAD_CALLS = [
    (lambda: ac.GroupedQueryAttention(30, 4, 2), ValueError, "num_heads must divide embed_dim"),
    (lambda: ac.GroupedQueryAttention(32, 8, 3), ValueError, "num_kv_heads must divide num_heads"),
    (lambda: ac.GroupedQueryAttention(32, 4, 0), ValueError, "num_kv_heads"),
    (lambda: ac.GroupedQueryAttention(32, 4, 2.0), TypeError, "num_kv_heads"),
    (lambda: ac.GroupedQueryAttention(24, 8, 2, rotary=True), ValueError, "even head width"),
    (lambda: ac.GroupedQueryAttention(32, 4, 2, window=0), ValueError, "window must be at least 1"),
    (lambda: ac.GroupedQueryAttention(32, 4, 2, window=2.5), TypeError, "window"),
    (lambda: ac.GroupedQueryAttention(32, 4, 2, backend="flash"), ValueError, "backend"),
    (lambda: ac.GroupedQueryAttention(32, 4, 2)(torch.randn(2, 3, 16), torch.randn(2, 3, 16), torch.randn(2, 3, 16)),
     ValueError, "embed_dim=32"),
    (lambda: ac.GroupedQueryAttention(32, 4, 2)(torch.randn(2, 3, 32), torch.randn(2, 3, 32), torch.randn(2, 3, 32),
                                                  key_padding_mask=torch.zeros(2, 4, dtype=torch.bool)), ValueError, "key_padding_mask"),
    (lambda: ac.GroupedQueryAttention(32, 4, 2).forward_cached(torch.randn(2, 3, 32), object()), TypeError, "cache"),
    (lambda: ac.GroupedQueryAttention(32, 4, 2).new_cache(2), ValueError, "max_len"),
    (lambda: ac.GroupedQueryAttention(32, 4, 2, window=3).forward_cached(torch.randn(1, 2, 32), ac.KVCache(1, 1, 2, 8, 10)),
     TypeError, "window"),
    (lambda: ac.sliding_window_mask(4, 0), ValueError, "window must be at least 1"),
    (lambda: ac.sliding_window_mask(4, 2.0), TypeError, "window"),
    (lambda: ac.sliding_window_mask(4, 2, align="center"), ValueError, "align"),
    (lambda: ac.DecoderOnlyLM(10, position="relative"), ValueError, "position"),
    (lambda: ac.GroupedQueryAttention.from_multihead(torch.nn.Linear(2, 2), 1), TypeError, "MultiHeadAttention"),
]


@pytest.mark.parametrize("make_call, error, words", BAD_CALLS)
def test_bad_calls_raise_clear_errors(make_call, error, words):
    with pytest.raises(error, match=words):
        make_call()


# -- no copy of the keys and values per query head ------------------------------------------------------
_MASKS = {
    "none": lambda B, H, L, S: None,
    "causal (L, S)": lambda B, H, L, S: ac.causal_mask(L, S),
    "padding (B, 1, 1, S)": lambda B, H, L, S: torch.arange(S).expand(B, 1, 1, S) < S - 1,
    "alibi (1, H, L, S)": lambda B, H, L, S: ac.alibi_bias(H, L, S)[None],
    "per head (B, H, L, S)": lambda B, H, L, S: torch.rand(B, H, L, S, generator=torch.Generator().manual_seed(0)) > 0.2,
}


@pytest.mark.parametrize("mask_name", list(_MASKS))
@pytest.mark.parametrize("L", [1, 5])
@pytest.mark.parametrize("need_weights", [False, True])
def test_reference_backend_copies_no_key_or_value_per_query_head(mask_name, L, need_weights):
    B, H, G, S, D = 2, 8, 2, 6, 4
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, n, T, D, generator=g) for n, T in ((H, L), (G, S), (G, S)))
    mask = _MASKS[mask_name](B, H, L, S)
    (context, weights), copies = ac.gqa.kv_copies(ac.gqa.grouped_attention, q, k, v, mask, need_weights=need_weights)
    assert copies == []
    # ... and the same numbers as attention to the keys and values copied per head
    expected, expected_weights = ac.scaled_dot_product_attention(q, k.repeat_interleave(H // G, 1),
                                                                 v.repeat_interleave(H // G, 1), attn_mask=mask)
    torch.testing.assert_close(context, expected)
    if need_weights:
        torch.testing.assert_close(weights, expected_weights)


def test_kv_copies_names_the_broadcasting_matmul_and_explicit_copies():
    B, H, G, L, D = 1, 4, 2, 3, 2
    g = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(B, H, L, D, generator=g), torch.randn(B, G, L, D, generator=g), torch.randn(B, G, L, D, generator=g)

    def broadcast(q, k, v):  # the group's key head broadcast over its query heads: matmul copies it
        return q.view(B, G, H // G, L, D) @ k[:, :, None].transpose(-2, -1)

    def indexed(q, k, v):
        return q @ k[:, torch.arange(H) // (H // G)].transpose(-2, -1)

    def folded(q, k, v):
        return q.reshape(B, G, H // G * L, D) @ k.transpose(-2, -1).contiguous()  # one copy of k at its own size

    _, copies = ac.gqa.kv_copies(broadcast, q, k, v)
    assert [(c.of, c.function, c.op, c.numbers, c.source) for c in copies] == [("keys", "Tensor.matmul", "aten.clone", 24, 12)]
    _, copies = ac.gqa.kv_copies(indexed, q, k, v)
    assert [(c.function, c.op, c.shape) for c in copies] == [("Tensor.__getitem__", "aten.index", (B, H, L, D))]
    assert ac.gqa.kv_copies(folded, q, k, v)[1] == []


def test_kv_copies_adds_up_copies_made_one_head_at_a_time():
    """A loop over query heads that copies its key/value head each time writes H / G copies in all."""
    q, k, v = torch.randn(2, 8, 3, 4), torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4)

    def per_head(q, k, v, copy):
        return torch.stack([(q[:, h] @ copy(k[:, h // 4]).transpose(-2, -1)).softmax(-1) @ copy(v[:, h // 4])
                            for h in range(8)], dim=1)

    for copy in (torch.Tensor.contiguous, torch.Tensor.clone, lambda t: t.transpose(-2, -1).contiguous().mT):
        _, copies = ac.gqa.kv_copies(per_head, q, k, v, copy)
        assert {c.of for c in copies} == {"keys", "values"} and all(c.times == 4 for c in copies), copies
    # once per key/value head, or the whole keys once and cast: no copy per query head
    assert ac.gqa.kv_copies(per_head, q, k, v, lambda t: t)[1] == []
    assert ac.gqa.kv_copies(lambda q, k, v: per_head(q, k.contiguous().double().float(), v, lambda t: t), q, k, v)[1] == []


def test_kv_copies_passes_over_tensors_without_plain_storage():
    g = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(1, 4, 3, 2, generator=g), torch.randn(1, 2, 3, 2, generator=g), torch.randn(1, 2, 3, 2, generator=g)
    result, copies = ac.gqa.kv_copies(lambda q, k, v: k.to_sparse().to_dense() + v, q, k, v)
    torch.testing.assert_close(result, k + v)
    assert copies == []
