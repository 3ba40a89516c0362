"""The key/value cache: cached decoding computes exactly what decoding from scratch computes."""

import pytest
import torch

import attn_course as ac
from attn_course.caches import KVCache, cached_self_attention
from attn_course.decoder import DecoderOnlyLM, generate


def _model(backend="sdpa", dtype=torch.float64, device="cpu", seed=0, **kwargs):
    torch.manual_seed(seed)
    config = dict(vocab_size=23, d_model=32, num_heads=4, num_layers=2, d_ff=48, max_len=64)
    config.update(kwargs)
    return DecoderOnlyLM(backend=backend, **config).to(device=device, dtype=dtype).eval()


# --- the cache itself ------------------------------------------------------------------------------

def test_cache_appends_and_returns_everything_so_far():
    cache = KVCache(num_layers=2, batch_size=3, num_heads=4, head_dim=5, max_len=10)
    first, second = torch.randn(3, 4, 6, 5), torch.randn(3, 4, 1, 5)
    keys, values = cache.update(0, first, -first)
    assert keys.shape == (3, 4, 6, 5) and torch.equal(values, -first)
    assert cache.length == 6
    keys, values = cache.update(0, second, -second)
    assert torch.equal(keys, torch.cat([first, second], dim=2))
    assert cache.length == 7
    cache.update(1, first, first)  # layers are independent
    assert cache._lengths == [7, 6]
    assert cache.nbytes == 2 * 2 * 3 * 4 * 10 * 5 * 4
    cache.reset()
    assert cache.length == 0


def test_crop_forgets_the_last_positions_so_that_a_step_can_be_repeated():
    cache = KVCache(num_layers=2, batch_size=1, num_heads=2, head_dim=3, max_len=8)
    prompt, token = torch.randn(1, 2, 5, 3), torch.randn(1, 2, 1, 3)
    for layer in range(2):
        cache.update(layer, prompt, prompt)
    cache.update(0, token, token)
    with pytest.raises(ValueError, match="at most the 5 positions"):
        cache.crop(6)  # layer 1 holds only 5
    cache.crop(5)
    assert cache._lengths == [5, 5]
    keys, _ = cache.update(0, -token, -token)  # written at position 5 again
    assert torch.equal(keys[:, :, 5:], -token) and cache.length == 6
    cache.crop(0)
    assert cache.length == 0
    for bad, error in ((-1, ValueError), (1.5, TypeError)):
        with pytest.raises(error, match="length"):
            cache.crop(bad)


def test_a_rolling_cache_crops_only_before_it_wraps():
    cache = ac.RollingKVCache(num_layers=1, batch_size=1, num_heads=1, head_dim=2, window=3)
    cache.update(0, torch.randn(1, 1, 3, 2), torch.randn(1, 1, 3, 2))
    cache.crop(1)
    assert cache.length == 1
    cache.update(0, torch.randn(1, 1, 4, 2), torch.randn(1, 1, 4, 2))  # 5 seen: positions 0 and 1 overwritten
    with pytest.raises(ValueError, match="cannot go back"):
        cache.crop(4)


@pytest.mark.parametrize(
    "layer, keys, error, text",
    [
        (2, torch.zeros(1, 2, 1, 3), ValueError, "layer"),
        (0, torch.zeros(1, 2, 1, 4), ValueError, r"\(B, H, T_new, D\)"),
        (0, torch.zeros(2, 1, 3), ValueError, "keys"),
        (0, torch.zeros(1, 2, 5, 3), ValueError, "max_len=4"),
        (0, torch.zeros(1, 2, 1, 3, dtype=torch.long), TypeError, "floating-point"),
    ],
)
def test_cache_rejects_bad_updates(layer, keys, error, text):
    cache = KVCache(1, 1, 2, 3, max_len=4)
    with pytest.raises(error, match=text):
        cache.update(layer, keys, keys)


def test_cache_rejects_bad_construction():
    with pytest.raises(ValueError, match="max_len"):
        KVCache(1, 1, 1, 1, max_len=0)
    with pytest.raises(TypeError, match="dtype"):
        KVCache(1, 1, 1, 1, max_len=2, dtype=torch.long)


# --- one attention layer ---------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["reference", "sdpa"])
@pytest.mark.parametrize("chunks", [[9], [1] * 9, [4, 1, 1, 3], [2, 7]])
def test_cached_self_attention_equals_full_causal_attention(backend, chunks):
    torch.manual_seed(0)
    attn = ac.MultiHeadAttention(16, 4, backend=backend).double()
    x = torch.randn(2, sum(chunks), 16, dtype=torch.float64)
    full, _ = attn(x, x, x, is_causal=True, need_weights=False)  # (B, T, E)
    cache = KVCache(1, 2, 4, 4, max_len=sum(chunks), dtype=torch.float64)
    pieces, start = [], 0
    for size in chunks:
        pieces.append(cached_self_attention(attn, x[:, start:start + size], cache, 0))
        start += size
    torch.testing.assert_close(torch.cat(pieces, dim=1), full)


def test_cached_self_attention_checks_its_arguments():
    attn = ac.MultiHeadAttention(8, 2)
    cache = KVCache(1, 1, 2, 4, max_len=4)
    with pytest.raises(TypeError, match="attn"):
        cached_self_attention(torch.nn.Linear(8, 8), torch.zeros(1, 1, 8), cache, 0)
    with pytest.raises(ValueError, match="x must have shape"):
        cached_self_attention(attn, torch.zeros(1, 1, 6), cache, 0)


# --- the whole model -------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["reference", "sdpa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forward_cached_equals_forward(backend, dtype, device):
    model = _model(backend, dtype=dtype, device=device)
    tokens = torch.randint(0, 23, (3, 20), generator=torch.Generator().manual_seed(1)).to(device)
    full = model(tokens)  # (B, T, V)
    cache = model.new_cache(3)
    assert cache.keys[0].device == full.device and cache.keys[0].dtype == dtype
    pieces = [model.forward_cached(tokens[:, a:b], cache) for a, b in [(0, 6), (6, 7), (7, 8), (8, 20)]]
    tolerance = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else {}
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, **tolerance)
    assert cache.length == 20


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
@pytest.mark.parametrize("batch_size, prompt_len, new_tokens", [(1, 1, 15), (4, 5, 20), (2, 30, 3)])
def test_generate_gives_the_same_tokens_with_and_without_cache(backend, batch_size, prompt_len, new_tokens, device):
    model = _model(backend, dtype=torch.float32, device=device, seed=batch_size)
    prompt = torch.randint(0, 23, (batch_size, prompt_len), generator=torch.Generator().manual_seed(2)).to(device)
    with_cache = generate(model, prompt, new_tokens, use_cache=True)
    without = generate(model, prompt, new_tokens, use_cache=False)
    assert with_cache.shape == (batch_size, prompt_len + new_tokens)
    assert torch.equal(with_cache[:, :prompt_len], prompt)
    assert torch.equal(with_cache, without)


def test_generate_is_greedy():
    model = _model(dtype=torch.float64)
    prompt = torch.tensor([[3, 1, 4]])
    tokens = generate(model, prompt, 4)
    for t in range(3, 7):
        assert tokens[0, t] == model(tokens[:, :t])[0, -1].argmax()
    assert torch.equal(generate(model, prompt, 0), prompt)


def test_decoder_only_lm_is_causal():
    model = _model()
    tokens = torch.randint(0, 23, (1, 10), generator=torch.Generator().manual_seed(3))
    changed = tokens.clone()
    changed[0, 7] = (changed[0, 7] + 1) % 23
    torch.testing.assert_close(model(tokens)[:, :7], model(changed)[:, :7])
    assert not torch.allclose(model(tokens)[:, 7:], model(changed)[:, 7:])


@pytest.mark.parametrize(
    "call, error, text",
    [
        (lambda m: generate(m, torch.zeros(1, 60, dtype=torch.long), 10), ValueError, "max_len=64"),
        (lambda m: generate(m, torch.zeros(1, 0, dtype=torch.long), 1), ValueError, "at least one token"),
        (lambda m: generate(m, torch.zeros(1, 3), 1), ValueError, "integer ids"),
        (lambda m: generate(m, torch.zeros(1, 3, dtype=torch.long), -1), ValueError, "max_new_tokens"),
        (lambda m: generate(torch.nn.Linear(2, 2), torch.zeros(1, 3, dtype=torch.long), 1), TypeError, "DecoderOnlyLM"),
        (lambda m: m.forward_cached(torch.zeros(1, 3, dtype=torch.long), None), TypeError, "KVCache"),
        (lambda m: DecoderOnlyLM(10, d_model=30, num_heads=4), ValueError, "num_heads must divide"),
        (lambda m: DecoderOnlyLM(10, backend="flash"), ValueError, "backend"),
    ],
)
def test_bad_calls(call, error, text):
    with pytest.raises(error, match=text):
        call(_model())
