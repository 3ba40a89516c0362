"""Online softmax and tiled (FlashAttention-style) attention against PyTorch's exact results."""

import pytest
import torch
import torch.nn.functional as F

import attn_course as ac
from attn_course.bench import peak_memory_bytes
from attn_course.efficient import online_softmax, tiled_attention

TOLERANCES = {torch.float64: dict(atol=1e-10, rtol=1e-8), torch.float32: dict(atol=2e-5, rtol=2e-5),
              torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _qkv(batch, L, S, E, Ev, dtype=torch.float64, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)
    return make(*batch, L, E), make(*batch, S, E), make(*batch, S, Ev)


# --- online softmax -----------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(7,), (3, 10), (2, 4, 13)])
@pytest.mark.parametrize("block_size", [1, 3, 4, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_online_softmax_matches_torch_softmax(shape, block_size, dtype):
    scores = torch.randn(shape, dtype=dtype) * 5
    torch.testing.assert_close(online_softmax(scores, block_size), torch.softmax(scores, dim=-1), **TOLERANCES[dtype])


def test_online_softmax_handles_large_scores_and_masked_rows():
    scores = torch.tensor([[1000.0, 1001.0, 1002.0, 999.0], [float("-inf")] * 4, [0.0, float("-inf"), 5.0, float("-inf")]])
    got = online_softmax(scores, block_size=2)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got[[0, 2]], torch.softmax(scores[[0, 2]], dim=-1))
    assert torch.equal(got[1], torch.zeros(4))


# --- tiled attention: forward -------------------------------------------------------------------

@pytest.mark.parametrize("L, S", [(1, 1), (7, 7), (5, 11), (11, 5), (64, 64), (33, 70)])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("blocks", [(4, 3), (16, 16), (128, 128)])
def test_tiled_attention_matches_sdpa(L, S, is_causal, blocks):
    q, k, v = _qkv((2, 3), L, S, 8, 6)
    got = tiled_attention(q, k, v, is_causal=is_causal, query_block_size=blocks[0], key_block_size=blocks[1])
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, is_causal=is_causal), **TOLERANCES[torch.float64])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_tiled_attention_dtypes(dtype, device):
    q, k, v = _qkv((2, 4), 37, 37, 16, 16, dtype=dtype, device=device)
    got = tiled_attention(q, k, v, is_causal=True, query_block_size=8, key_block_size=16)
    assert got.dtype == dtype and got.device == q.device
    expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True).to(dtype)
    torch.testing.assert_close(got, expected, **TOLERANCES[dtype])


@pytest.mark.parametrize("mask_kind", ["bool", "float"])
@pytest.mark.parametrize("mask_shape", [(9, 12), (2, 1, 9, 12), (2, 3, 9, 12), (1, 12)])
def test_tiled_attention_with_masks(mask_kind, mask_shape):
    q, k, v = _qkv((2, 3), 9, 12, 8, 5)
    allowed = torch.rand(mask_shape, generator=torch.Generator().manual_seed(1)) > 0.4
    allowed[..., 0] = True  # every row keeps a key, so that torch's result has no NaN to compare with
    mask = allowed if mask_kind == "bool" else ac.blocked_to_additive(~allowed, dtype=torch.float64)
    got = tiled_attention(q, k, v, attn_mask=mask, query_block_size=4, key_block_size=5)
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def test_tiled_attention_broadcasts_batch_dimensions_and_custom_scale():
    q, _, _ = _qkv((2, 3), 6, 6, 4, 4)
    _, k, v = _qkv((1, 3), 6, 10, 4, 7, seed=1)
    got = tiled_attention(q, k, v, scale=0.3, query_block_size=4, key_block_size=4)
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, scale=0.3))


def test_fully_masked_rows_give_zeros_not_nan():
    q, k, v = _qkv((2,), 5, 6, 4, 4)
    allowed = torch.rand(2, 5, 6, generator=torch.Generator().manual_seed(2)) > 0.5
    allowed[0, 1] = False  # query 1 of sequence 0 may attend to nothing
    got = tiled_attention(q, k, v, attn_mask=allowed, query_block_size=2, key_block_size=4)
    expected, _ = ac.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    assert torch.equal(got[0, 1], torch.zeros(4, dtype=got.dtype))
    torch.testing.assert_close(got, expected)


# --- tiled attention: backward (recomputed tile by tile) ------------------------------------------

@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("L, S", [(8, 8), (5, 9), (13, 6)])
def test_tiled_attention_gradients_match_sdpa(is_causal, L, S):
    q, k, v = (t.requires_grad_() for t in _qkv((2, 2), L, S, 4, 3))
    grad_out = torch.randn(2, 2, L, 3, dtype=torch.float64)
    ours = torch.autograd.grad(tiled_attention(q, k, v, is_causal=is_causal, query_block_size=3, key_block_size=4), (q, k, v), grad_out)
    theirs = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=is_causal), (q, k, v), grad_out)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b)


def test_tiled_attention_gradcheck_with_mask_and_empty_row():
    q, k, v = (t.requires_grad_() for t in _qkv((2,), 4, 5, 3, 2))
    allowed = torch.rand(2, 4, 5, generator=torch.Generator().manual_seed(3)) > 0.4
    allowed[1, 2] = False
    assert torch.autograd.gradcheck(
        lambda a, b, c: tiled_attention(a, b, c, attn_mask=allowed, query_block_size=3, key_block_size=2), (q, k, v)
    )
    out = tiled_attention(q, k, v, attn_mask=allowed, query_block_size=3, key_block_size=2)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert all(torch.isfinite(g).all() for g in grads)


def test_broadcast_inputs_get_summed_gradients():
    q, _, _ = _qkv((2, 3), 6, 6, 4, 4)
    _, k, v = _qkv((1, 3), 6, 6, 4, 4, seed=1)
    k.requires_grad_()
    grad_ours = torch.autograd.grad(tiled_attention(q, k, v, query_block_size=4, key_block_size=4).sum(), k)[0]
    grad_torch = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v).sum(), k)[0]
    assert grad_ours.shape == k.shape
    torch.testing.assert_close(grad_ours, grad_torch)


# --- the point of tiling: no (L, S) matrix ---------------------------------------------------------

def test_tiled_attention_never_materialises_the_weights():
    L = 2048
    q, k, v = _qkv((1, 1), L, L, 16, 16, dtype=torch.float32)
    weights_bytes = L * L * 4  # 16 MiB for one (L, L) float32 matrix
    with torch.no_grad():
        tiled = peak_memory_bytes(lambda: tiled_attention(q, k, v, query_block_size=256, key_block_size=256), "cpu")
        explicit = peak_memory_bytes(lambda: ac.scaled_dot_product_attention(q, k, v), "cpu")
    assert explicit >= weights_bytes
    assert tiled < weights_bytes / 8, f"tiled attention used {tiled / 2**20:.1f} MiB"


# --- bad input ------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "kwargs, error, text",
    [
        (dict(query_block_size=0), ValueError, "query_block_size"),
        (dict(key_block_size=2.0), TypeError, "key_block_size"),
        (dict(is_causal=True, attn_mask=torch.ones(4, 4, dtype=torch.bool)), ValueError, "either attn_mask or is_causal"),
        (dict(attn_mask=torch.ones(4, 4, dtype=torch.long)), TypeError, "attn_mask"),
        (dict(scale="big"), TypeError, "scale"),
    ],
)
def test_bad_arguments(kwargs, error, text):
    q, k, v = _qkv((1,), 4, 4, 2, 2)
    with pytest.raises(error, match=text):
        tiled_attention(q, k, v, **kwargs)


def test_bad_tensors():
    with pytest.raises(TypeError, match="query"):
        tiled_attention(torch.ones(2, 2, dtype=torch.long), torch.ones(2, 2), torch.ones(2, 2))
    with pytest.raises(ValueError, match="block_size"):
        online_softmax(torch.ones(3), block_size=0)
    with pytest.raises(TypeError, match="scores"):
        online_softmax([1.0, 2.0])
