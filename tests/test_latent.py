"""Multi-head latent attention against DeepSeek-V2's equations (9)-(19), written out again here with
loops over heads and its own rotary embedding (no code shared with attn_course.latent); cached ==
uncached, absorbed == naive, the cache's size, and the cache formulas of the paper's Table 1."""

import math

import pytest
import torch

import attn_course as ac
from attn_course.caches import LatentKVCache, cache_elements_per_token
from attn_course.latent import MultiHeadLatentAttention

pytestmark = pytest.mark.usefixtures("one_thread")


# -- an independent reference, from the paper's equations ------------------------------------------
def _rope(x, positions, base=10000.0):
    """RoPE with pairs (2i, 2i+1) as complex numbers, turned by position * base ** (-2i / d)."""
    d = x.size(-1)
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    angle = positions.to(torch.float64)[:, None] * theta  # (T, d/2)
    pairs = torch.view_as_complex(x.to(torch.float64).reshape(*x.shape[:-1], d // 2, 2).contiguous())
    turned = pairs * torch.polar(torch.ones_like(angle), angle)
    return torch.view_as_real(turned).flatten(-2).to(x.dtype)


def _linear(layer, x):
    return x @ layer.weight.T + (0 if layer.bias is None else layer.bias)


def reference_mla(m, h, allowed):
    """Equations (9)-(19) token by token in matrix form, head by head; ``allowed`` ``(B, T, T)`` is
    True where query t may attend to key j. Returns the output and the weights ``(B, H, T, T)``."""
    B, T, _ = h.shape
    H, D, Dr = m.num_heads, m.head_dim, m.rope_head_dim
    positions = torch.arange(T)
    c_kv = _linear(m.kv_down_proj, h)  # (9)
    k_c = _linear(m.k_up_proj, c_kv)  # (10)
    v_c = _linear(m.v_up_proj, c_kv)  # (11)
    c_q = h if m.q_down_proj is None else _linear(m.q_down_proj, h)  # (12)
    q_c = _linear(m.q_proj, c_q)  # (13)
    if Dr:
        q_r = _rope(_linear(m.q_rope_proj, c_q).view(B, T, H, Dr).transpose(1, 2), positions)  # (14)
        k_r = _rope(_linear(m.k_rope_proj, h), positions)  # (15)
    heads, all_weights = [], []
    for i in range(H):
        q_i, k_i, v_i = (t[..., i * D:(i + 1) * D] for t in (q_c, k_c, v_c))
        if Dr:
            q_i = torch.cat([q_i, q_r[:, i]], dim=-1)  # (16)
            k_i = torch.cat([k_i, k_r], dim=-1)  # (17): the same rotary key for every head
        scores = torch.einsum("btd,bsd->bts", q_i, k_i) / math.sqrt(D + Dr)
        weights = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
        heads.append(torch.einsum("bts,bsd->btd", weights, v_i))  # (18)
        all_weights.append(weights)
    return _linear(m.out_proj, torch.cat(heads, dim=-1)), torch.stack(all_weights, dim=1)  # (19)


def _module(seed=0, dtype=torch.float64, device="cpu", **kwargs):
    torch.manual_seed(seed)
    config = dict(embed_dim=24, num_heads=4, head_dim=8, kv_latent_dim=12, q_latent_dim=10, rope_head_dim=4)
    config.update(kwargs)
    return MultiHeadLatentAttention(**config).to(device=device, dtype=dtype).eval()


def _causal(B, T):
    return torch.ones(T, T, dtype=torch.bool).tril().expand(B, T, T)


# -- the naive form against the equations -----------------------------------------------------------
@pytest.mark.parametrize("q_latent_dim", [None, 10])
@pytest.mark.parametrize("rope_head_dim", [0, 4])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_forward_follows_the_paper(q_latent_dim, rope_head_dim, bias, backend):
    m = _module(q_latent_dim=q_latent_dim, rope_head_dim=rope_head_dim, bias=bias, backend=backend)
    x = torch.randn(2, 7, 24, dtype=torch.float64)  # H * D = 32 is not E = 24: head_dim is free
    out, weights = m(x, is_causal=True)
    expected, expected_weights = reference_mla(m, x, _causal(2, 7))
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(weights, expected_weights)
    assert m(x, is_causal=True, need_weights=False)[1] is None


def test_rotary_part_is_needed_for_positions():
    """Without a rotary part and without a mask, MLA cannot tell positions apart: permuting the tokens
    permutes the outputs. With one it can."""
    x = torch.randn(1, 6, 24, dtype=torch.float64)
    order = torch.tensor([3, 0, 5, 1, 4, 2])
    without = _module(rope_head_dim=0)
    torch.testing.assert_close(without(x[:, order])[0], without(x)[0][:, order])
    with_rope = _module(rope_head_dim=4)
    assert not torch.allclose(with_rope(x[:, order])[0], with_rope(x)[0][:, order])


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_padding_and_attn_masks(backend):
    m = _module(backend=backend)
    x = torch.randn(2, 6, 24, dtype=torch.float64)
    padding = torch.zeros(2, 6, dtype=torch.bool)
    padding[1, 4:] = True  # the second sequence has two padding tokens at the end
    allowed = _causal(2, 6) & ~padding[:, None, :]
    out, weights = m(x, key_padding_mask=padding, is_causal=True)
    expected, expected_weights = reference_mla(m, x, allowed)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(weights, expected_weights)
    assert weights[1, :, :, 4:].abs().max() == 0  # nobody attends to padding

    blocked = ~torch.ones(6, 6, dtype=torch.bool).tril()  # a bool attn_mask: True = blocked
    torch.testing.assert_close(m(x, attn_mask=blocked)[0], m(x, is_causal=True)[0])
    additive = torch.zeros(6, 6, dtype=torch.float64).masked_fill(blocked, float("-inf"))
    torch.testing.assert_close(m(x, attn_mask=additive)[0], m(x, is_causal=True)[0])


def test_fully_masked_row_gives_zeros_not_nan():
    m = _module(bias=True)
    x = torch.randn(2, 4, 24, dtype=torch.float64)
    padding = torch.zeros(2, 4, dtype=torch.bool)
    padding[0] = True  # the first sequence is all padding
    out, weights = m(x, key_padding_mask=padding)
    assert not out.isnan().any() and not weights.isnan().any()
    assert weights[0].abs().max() == 0
    torch.testing.assert_close(out[0], m.out_proj.bias.expand(4, 24))  # zero context: only W_O's bias


# -- cached decoding, naive and absorbed ------------------------------------------------------------
@pytest.mark.parametrize("chunks", [[9], [1] * 9, [4, 1, 1, 3], [2, 7]])
@pytest.mark.parametrize("rope_head_dim", [0, 4])
@pytest.mark.parametrize("absorb", [False, True])
def test_cached_equals_uncached(device, chunks, rope_head_dim, absorb):
    m = _module(dtype=torch.float32, device=device, rope_head_dim=rope_head_dim, bias=True)
    x = torch.randn(2, sum(chunks), 24, device=device)
    expected, _ = m(x, is_causal=True)
    cache = m.new_cache(2, max_len=12)
    assert cache.latents[0].device == x.device and cache.latents[0].dtype == x.dtype
    pieces, start = [], 0
    for size in chunks:
        pieces.append(m.forward_cached(x[:, start:start + size], cache, absorb=absorb))
        start += size
    torch.testing.assert_close(torch.cat(pieces, dim=1), expected, atol=1e-5, rtol=1e-5)
    assert cache.length == sum(chunks)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, {}), (torch.float32, dict(atol=1e-5, rtol=1e-5))])
@pytest.mark.parametrize("q_latent_dim", [None, 10])
@pytest.mark.parametrize("bias", [False, True])
def test_absorbed_equals_naive(device, dtype, tolerance, q_latent_dim, bias):
    if device.type == "mps" and dtype == torch.float64:
        pytest.skip("MPS has no float64")
    m = _module(dtype=dtype, device=device, q_latent_dim=q_latent_dim, bias=bias, backend="sdpa")
    x = torch.randn(3, 10, 24, device=device, dtype=dtype)
    naive, absorbed = m.new_cache(3, 10), m.new_cache(3, 10)
    for chunk in (x[:, :7], x[:, 7:8], x[:, 8:]):
        torch.testing.assert_close(m.forward_cached(chunk, absorbed, absorb=True), m.forward_cached(chunk, naive), **tolerance)
    assert torch.equal(naive.latents[0], absorbed.latents[0])  # the same cache either way


def test_absorbed_scores_only_the_latents():
    """The absorbed step never up-projects the cache: with the key/value up-projections' inputs
    intercepted, the naive step calls them on every cached token, the absorbed step never."""
    m = _module()
    x = torch.randn(1, 8, 24, dtype=torch.float64)
    calls = []
    for layer in (m.k_up_proj, m.v_up_proj):
        layer.register_forward_hook(lambda module, inputs, output: calls.append(inputs[0].shape[1]))
    for absorb, expected in ((False, [8, 8]), (True, [])):
        calls.clear()
        cache = m.new_cache(1, 8)
        m.forward_cached(x[:, :7], cache, absorb=absorb)
        calls.clear()
        m.forward_cached(x[:, 7:], cache, absorb=absorb)  # one new token, 8 cached
        assert calls == expected


def test_gradients_flow_through_both_forms():
    for absorb in (False, True):
        m = _module(bias=True).train()
        x = torch.randn(2, 5, 24, dtype=torch.float64, requires_grad=True)
        if absorb:
            out = m.forward_cached(x, m.new_cache(2, 5), absorb=True)
        else:
            out, _ = m(x, is_causal=True)
        out.square().sum().backward()
        assert x.grad is not None and x.grad.abs().sum() > 0
        for name, parameter in m.named_parameters():
            if absorb and name == "k_up_proj.bias":  # drops out of the softmax: no gradient, correctly
                assert parameter.grad is None or parameter.grad.abs().max() == 0
                continue
            assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name
            assert torch.isfinite(parameter.grad).all(), name


def test_dtype_and_device_follow_the_module():
    m = _module(dtype=torch.float64)
    out, weights = m(torch.randn(1, 3, 24, dtype=torch.float64), is_causal=True)
    assert out.dtype == weights.dtype == torch.float64
    with pytest.raises(TypeError, match="x is torch.float32"):
        m(torch.randn(1, 3, 24))


# -- the cache and its size ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("rope_head_dim", [0, 4])
def test_cache_bytes_per_token(dtype, rope_head_dim):
    m = _module(dtype=dtype, rope_head_dim=rope_head_dim)
    cache = m.new_cache(batch_size=3, max_len=20, num_layers=5)
    element = torch.empty((), dtype=dtype).element_size()
    assert cache.bytes_per_token == (12 + rope_head_dim) * 5 * element
    assert cache.nbytes == 3 * 20 * (12 + rope_head_dim) * 5 * element
    assert m.cache_elements_per_token == 12 + rope_head_dim == cache_elements_per_token(
        "mla", kv_latent_dim=12, rope_head_dim=rope_head_dim)
    assert (cache.rope_keys is None) == (rope_head_dim == 0)


def test_latent_cache_appends_and_checks():
    cache = LatentKVCache(num_layers=2, batch_size=1, kv_latent_dim=3, rope_head_dim=2, max_len=4)
    latents, rope_keys = torch.randn(1, 3, 3), torch.randn(1, 3, 2)
    got_latents, got_keys = cache.update(0, latents, rope_keys)
    assert torch.equal(got_latents, latents) and torch.equal(got_keys, rope_keys) and cache.length == 3
    got_latents, _ = cache.update(0, latents[:, :1], rope_keys[:, :1])
    assert torch.equal(got_latents, torch.cat([latents, latents[:, :1]], dim=1))
    assert cache._lengths == [4, 0]
    with pytest.raises(ValueError, match="max_len=4"):
        cache.update(0, latents[:, :1], rope_keys[:, :1])
    with pytest.raises(ValueError, match="rope_keys must be given"):
        cache.update(1, latents)
    with pytest.raises(ValueError, match="latents must have shape"):
        cache.update(1, torch.randn(1, 3, 5), rope_keys)
    with pytest.raises(ValueError, match="same number of new positions"):
        cache.update(1, latents, rope_keys[:, :2])
    with pytest.raises(ValueError, match="rope_keys must be None"):
        LatentKVCache(1, 1, 3, 0, 4).update(0, latents, rope_keys)
    cache.reset()
    assert cache.length == 0


# -- Table 1 of DeepSeek-V2 ----------------------------------------------------------------------------
def test_cache_formulas_and_deepseek_v2_sizes():
    n_h, d_h, d_c, d_r = 128, 128, 512, 64  # DeepSeek-V2, section 3.1.2
    mla = cache_elements_per_token("mla", kv_latent_dim=d_c, rope_head_dim=d_r)
    assert mla == 576 == 9 * d_h // 2  # Table 1: (d_c + d_h^R) l = 9/2 d_h l with d_c = 4 d_h, d_h^R = d_h / 2
    one_group = cache_elements_per_token("gqa", num_kv_heads=1, head_dim=d_h)
    assert mla / one_group == 2.25  # "equal to GQA with only 2.25 groups"
    assert one_group == cache_elements_per_token("mqa", head_dim=d_h) == 2 * d_h
    assert cache_elements_per_token("gqa", num_kv_heads=2, head_dim=d_h) < mla < cache_elements_per_token(
        "gqa", num_kv_heads=3, head_dim=d_h)
    mha = cache_elements_per_token("mha", num_heads=n_h, head_dim=d_h)
    assert mha == 2 * n_h * d_h == 32768 and mha / mla == pytest.approx(56.9, abs=0.05)
    assert cache_elements_per_token("mla", kv_latent_dim=d_c, rope_head_dim=d_r, num_layers=60) == 576 * 60
    assert cache_elements_per_token("mla", kv_latent_dim=d_c) == d_c  # no rotary part


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(kind="mhq", head_dim=8), ValueError, "kind must be one of"),
    (dict(kind="mha", head_dim=8), ValueError, "needs num_heads"),
    (dict(kind="gqa", num_heads=8, head_dim=8), ValueError, "needs num_kv_heads"),
    (dict(kind="mqa", head_dim=8, num_kv_heads=2), ValueError, "does not use num_kv_heads"),
    (dict(kind="mha", num_heads=8, head_dim=8, rope_head_dim=4), ValueError, "does not use rope_head_dim"),
    (dict(kind="mla", kv_latent_dim=8, num_heads=8), ValueError, "does not use num_heads"),
    (dict(kind="mla", kv_latent_dim=8.0), TypeError, "kv_latent_dim"),
    (dict(kind="mla", kv_latent_dim=8, rope_head_dim=-2), ValueError, "rope_head_dim"),
    (dict(kind="mqa", head_dim=8, num_layers=0), ValueError, "num_layers"),
])
def test_cache_formula_rejects_bad_arguments(kwargs, error, words):
    kind = kwargs.pop("kind")
    with pytest.raises(error, match=words):
        cache_elements_per_token(kind, **kwargs)


# -- in the decoder-only model ----------------------------------------------------------------------
@pytest.mark.parametrize("position", ["rotary", "sinusoidal"])
@pytest.mark.parametrize("q_latent_dim", [None, 8])
def test_decoder_only_lm_with_mla_generates_the_same_with_the_cache(position, q_latent_dim):
    torch.manual_seed(3)
    model = ac.DecoderOnlyLM(13, d_model=32, num_heads=4, num_layers=2, d_ff=48, max_len=24, position=position,
                             attention="mla", kv_latent_dim=16, q_latent_dim=q_latent_dim).eval()
    assert all(isinstance(layer.self_attn, MultiHeadLatentAttention) for layer in model.layers)
    assert model.layers[0].self_attn.rope_head_dim == (4 if position == "rotary" else 0)
    prompt = torch.randint(0, 13, (2, 4))
    plain = ac.generate(model, prompt, 10, use_cache=False)
    assert torch.equal(ac.generate(model, prompt, 10), plain)
    assert torch.equal(ac.generate(model, prompt, 10, absorb=True), plain)
    cache = model.new_cache(2)
    assert isinstance(cache, LatentKVCache)
    assert cache.bytes_per_token == (16 + (4 if position == "rotary" else 0)) * 2 * 4  # (d_c + d_h^R) * layers * 4 bytes


def test_decoder_only_lm_forward_cached_equals_forward():
    torch.manual_seed(4)
    model = ac.DecoderOnlyLM(11, d_model=16, num_heads=2, num_layers=2, d_ff=32, max_len=16, position="rotary",
                             attention="mla", kv_latent_dim=6, rope_head_dim=2).double().eval()
    tokens = torch.randint(0, 11, (2, 12))
    full = model(tokens)
    for absorb in (False, True):
        cache = model.new_cache(2)
        pieces = [model.forward_cached(tokens[:, a:b], cache, absorb=absorb) for a, b in [(0, 5), (5, 6), (6, 12)]]
        torch.testing.assert_close(torch.cat(pieces, dim=1), full)


def test_decoder_only_lm_attention_choice_and_defaults():
    assert ac.DecoderOnlyLM(10, d_model=16, num_heads=4).attention == "mha"
    assert ac.DecoderOnlyLM(10, d_model=16, num_heads=4, num_kv_heads=2).attention == "gqa"
    gqa = ac.DecoderOnlyLM(10, d_model=16, num_heads=4, attention="gqa", num_kv_heads=1)
    assert gqa.layers[0].self_attn.num_kv_heads == 1


BAD_CALLS = [
    (lambda: MultiHeadLatentAttention(24, 4, 8, 0), ValueError, "kv_latent_dim"),
    (lambda: MultiHeadLatentAttention(24, 4, 8.0, 12), TypeError, "head_dim"),
    (lambda: MultiHeadLatentAttention(24, 4, 8, 12, q_latent_dim=0), ValueError, "q_latent_dim"),
    (lambda: MultiHeadLatentAttention(24, 4, 8, 12, rope_head_dim=3), ValueError, "rope_head_dim must be even"),
    (lambda: MultiHeadLatentAttention(24, 4, 8, 12, rope_head_dim=-2), ValueError, "rope_head_dim"),
    (lambda: MultiHeadLatentAttention(24, 4, 8, 12, rope_head_dim=4, rope_base=1.0), ValueError, "rope_base"),
    (lambda: MultiHeadLatentAttention(24, 4, 8, 12, rope_head_dim=4, rope_base="big"), TypeError, "rope_base"),
    (lambda: MultiHeadLatentAttention(24, 4, 8, 12, rope_base=500.0), ValueError, "rope_base=500.0 has no effect"),
    (lambda: MultiHeadLatentAttention(24, 4, 8, 12, bias=1), TypeError, "bias"),
    (lambda: MultiHeadLatentAttention(24, 4, 8, 12, dropout=1.0), ValueError, "dropout"),
    (lambda: MultiHeadLatentAttention(24, 4, 8, 12, backend="flash"), ValueError, "backend"),
    (lambda: _module()(torch.randn(1, 3, 16, dtype=torch.float64)), ValueError, r"x must have shape \(B, L, E=24\)"),
    (lambda: _module()(torch.randn(1, 3, 24, dtype=torch.float64), key_padding_mask=torch.zeros(1, 4, dtype=torch.bool)),
     ValueError, "key_padding_mask"),
    (lambda: _module()(torch.randn(1, 3, 24, dtype=torch.float64), is_causal=1), TypeError, "is_causal"),
    (lambda: _module().forward_cached(torch.randn(1, 3, 24, dtype=torch.float64), ac.KVCache(1, 1, 4, 8, 10)),
     TypeError, "LatentKVCache"),
    (lambda: _module().forward_cached(torch.randn(1, 3, 24, dtype=torch.float64), _module(kv_latent_dim=6).new_cache(1, 8)),
     ValueError, "kv_latent_dim=12"),
    (lambda: _module().forward_cached(torch.randn(1, 3, 24, dtype=torch.float64), _module().new_cache(1, 8), absorb="yes"),
     TypeError, "absorb"),
    (lambda: _module().forward_cached(torch.randn(1, 3, 24, dtype=torch.float64), _module().new_cache(1, 8), layer=1),
     ValueError, "layer"),
    (lambda: ac.DecoderOnlyLM(10, attention="flash"), ValueError, "attention must be one of"),
    (lambda: ac.DecoderOnlyLM(10, attention="mla"), ValueError, "needs kv_latent_dim"),
    (lambda: ac.DecoderOnlyLM(10, attention="mla", kv_latent_dim=8, num_kv_heads=2), ValueError, "num_kv_heads"),
    (lambda: ac.DecoderOnlyLM(10, attention="mla", kv_latent_dim=8, window=4), ValueError, "window"),
    (lambda: ac.DecoderOnlyLM(10, attention="mla", kv_latent_dim=8, position="alibi"), ValueError, "alibi"),
    (lambda: ac.DecoderOnlyLM(10, attention="mla", kv_latent_dim=8, rope_head_dim=4), ValueError, "position='rotary'"),
    (lambda: ac.DecoderOnlyLM(10, attention="mla", kv_latent_dim=8, position="rotary", rope_head_dim=0), ValueError,
     "rope_head_dim must be positive"),
    (lambda: ac.DecoderOnlyLM(10, kv_latent_dim=8), ValueError, "kv_latent_dim is an option of attention='mla'"),
    (lambda: ac.DecoderOnlyLM(10, num_heads=4, attention="mha", num_kv_heads=2), ValueError, "attention='gqa'"),
    (lambda: ac.DecoderOnlyLM(10, attention="gqa"), ValueError, "needs num_kv_heads"),
    (lambda: ac.generate(ac.DecoderOnlyLM(10), torch.zeros(1, 2, dtype=torch.long), 2, absorb=True), ValueError,
     "attention='mla'"),
    (lambda: ac.generate(ac.DecoderOnlyLM(10, attention="mla", kv_latent_dim=8), torch.zeros(1, 2, dtype=torch.long), 2,
                         use_cache=False, absorb=True), ValueError, "use_cache=True"),
    (lambda: ac.DecoderOnlyLM(10).forward_cached(torch.zeros(1, 2, dtype=torch.long), ac.DecoderOnlyLM(10).new_cache(1),
                                                 absorb=True), ValueError, "attention='mla'"),
]


@pytest.mark.parametrize("make_call, error, words", BAD_CALLS)
def test_bad_calls_raise_clear_errors(make_call, error, words):
    with pytest.raises(error, match=words):
        make_call()
