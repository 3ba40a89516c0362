"""attn_course.scaled_dot_product_attention and SelfAttention against PyTorch's own kernels."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import attn_course as ac

SHAPES = [
    # (batch dims, L, S, E, Ev)
    ((), 1, 1, 1, 1),
    ((2,), 5, 7, 8, 3),
    ((2, 3), 4, 4, 16, 16),
    ((0,), 3, 5, 4, 4),  # empty batch
    ((1, 1), 1, 6, 2, 5),
    ((3, 2), 9, 2, 4, 7),
]


def _qkv(batch, L, S, E, Ev, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, L, E, generator=g, dtype=torch.float64)
    k = torch.randn(*batch, S, E, generator=g, dtype=torch.float64)
    v = torch.randn(*batch, S, Ev, generator=g, dtype=torch.float64)
    return [t.to(device=device, dtype=dtype) for t in (q, k, v)]


def _tol(dtype):
    return {torch.float64: dict(atol=1e-10, rtol=1e-8), torch.float32: dict(atol=2e-6, rtol=1e-5),
            torch.bfloat16: dict(atol=3e-2, rtol=3e-2), torch.float16: dict(atol=3e-3, rtol=3e-3)}[dtype]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_matches_torch_without_mask(shape, dtype, device):
    q, k, v = _qkv(*shape, dtype=dtype, device=device)
    out, weights = ac.scaled_dot_product_attention(q, k, v)
    expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double()).to(dtype)
    torch.testing.assert_close(out, expected, **_tol(dtype))
    assert weights.shape == (*shape[0], shape[1], shape[2])
    assert out.dtype == dtype and out.device == q.device
    if weights.numel():
        torch.testing.assert_close(weights.double().sum(-1), torch.ones(weights.shape[:-1], dtype=torch.float64, device=device), **_tol(dtype))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("mask_kind", ["bool_LS", "bool_full", "float_LS", "float_broadcast", "causal", "scale"])
def test_matches_torch_with_masks(shape, mask_kind, device):
    batch, L, S, E, Ev = shape
    q, k, v = _qkv(*shape, dtype=torch.float64, device=device, seed=1)
    g = torch.Generator().manual_seed(2)
    kwargs = {}
    if mask_kind == "bool_LS":
        mask = torch.rand(L, S, generator=g) > 0.3
        mask[:, 0] = True  # every query keeps a key: PyTorch's own kernels may give NaN otherwise
        kwargs["attn_mask"] = mask.to(device)
    elif mask_kind == "bool_full":
        mask = torch.rand(*batch, L, S, generator=g) > 0.5
        mask[..., -1] = True
        kwargs["attn_mask"] = mask.to(device)
    elif mask_kind == "float_LS":
        kwargs["attn_mask"] = torch.randn(L, S, generator=g, dtype=torch.float64).to(device)
    elif mask_kind == "float_broadcast":
        kwargs["attn_mask"] = torch.randn(*([1] * len(batch)), 1, S, generator=g, dtype=torch.float64).to(device)
    elif mask_kind == "causal":
        kwargs["is_causal"] = True
    else:
        kwargs["scale"] = 0.37
    out, weights = ac.scaled_dot_product_attention(q, k, v, **kwargs)
    expected = F.scaled_dot_product_attention(q, k, v, **kwargs)
    torch.testing.assert_close(out, expected)
    # The weights really are the ones used: recompute the output from them.
    torch.testing.assert_close(weights @ v, out)


@pytest.mark.parametrize("L, S", [(3, 5), (5, 3), (4, 4), (1, 6)])
def test_causal_is_top_left_aligned_as_in_pytorch(L, S):
    q, k, v = _qkv((2,), L, S, 4, 4, dtype=torch.float64)
    _, weights = ac.scaled_dot_product_attention(q, k, v, is_causal=True)
    allowed = torch.ones(L, S, dtype=torch.bool).tril()
    assert torch.all(weights[..., ~allowed] == 0)
    assert torch.all(weights[..., allowed] > 0)
    torch.testing.assert_close(
        ac.scaled_dot_product_attention(q, k, v, is_causal=True)[0], F.scaled_dot_product_attention(q, k, v, is_causal=True)
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gradients_match_torch(dtype, device):
    q, k, v = _qkv((2, 2), 5, 6, 8, 3, dtype=dtype, device=device, seed=3)
    mask = torch.rand(5, 6, generator=torch.Generator().manual_seed(4)) > 0.4
    mask[:, 2] = True
    mask = mask.to(device)
    grads = []
    for fn in (lambda *a: ac.scaled_dot_product_attention(*a, attn_mask=mask)[0],
               lambda *a: F.scaled_dot_product_attention(*a, attn_mask=mask)):
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        (fn(*inputs) * torch.linspace(-1, 1, 3, dtype=dtype, device=device)).sum().backward()
        grads.append([t.grad for t in inputs])
    for ours, theirs in zip(*grads):
        torch.testing.assert_close(ours, theirs, **_tol(dtype))


def test_gradcheck_float64():
    q, k, v = [t.requires_grad_() for t in _qkv((2,), 3, 4, 5, 2, dtype=torch.float64, seed=5)]
    assert torch.autograd.gradcheck(lambda *a: ac.scaled_dot_product_attention(*a, is_causal=True)[0], (q, k, v))


@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_fully_masked_row_gives_zeros_and_finite_gradients(mask_kind, device):
    q, k, v = [t.requires_grad_() for t in _qkv((2,), 4, 5, 8, 3, device=device, seed=6)]
    allowed = torch.ones(4, 5, dtype=torch.bool, device=device)
    allowed[1] = False  # query 1 may attend to nothing
    mask = allowed if mask_kind == "bool" else torch.zeros(4, 5, device=device).masked_fill(~allowed, float("-inf"))
    out, weights = ac.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    assert torch.all(out[:, 1] == 0) and torch.all(weights[:, 1] == 0)
    torch.testing.assert_close(weights[:, [0, 2, 3]].sum(-1), torch.ones(2, 3, device=device))
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_no_keys_at_all_gives_zeros():
    q, k, v = _qkv((2,), 3, 0, 4, 5)
    out, weights = ac.scaled_dot_product_attention(q, k, v)
    assert out.shape == (2, 3, 5) and weights.shape == (2, 3, 0)
    assert torch.all(out == 0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_does_not_overflow(dtype, device):
    if dtype == torch.float16 and device.type == "cpu" and not hasattr(torch, "float16"):
        pytest.skip("no float16")
    # Scores of about 1.6e5 overflow float16 (max 65504) if computed in float16.
    q = torch.full((1, 2, 256), 100.0, device=device, dtype=dtype)
    k = torch.full((1, 3, 256), 100.0, device=device, dtype=dtype)
    k[0, 1] = -100.0
    v = torch.arange(3, dtype=dtype, device=device).repeat(4, 1).T[None]  # (1, 3, 4)
    causal = torch.tensor([[True, False, False], [True, True, True]], device=device)
    out, weights = ac.scaled_dot_product_attention(q, k, v, attn_mask=causal)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    torch.testing.assert_close(weights.float(), torch.tensor([[[1.0, 0.0, 0.0], [0.5, 0.0, 0.5]]], device=device))


def test_dropout_scales_the_kept_weights():
    q, k, v = _qkv((4, 8), 16, 16, 8, 8, seed=7)
    clean = ac.scaled_dot_product_attention(q, k, v)[1]
    torch.manual_seed(0)
    out, dropped = ac.scaled_dot_product_attention(q, k, v, dropout_p=0.25)
    kept = dropped != 0
    assert 0.65 < kept.float().mean() < 0.85
    torch.testing.assert_close(dropped[kept], clean[kept] / 0.75)
    torch.testing.assert_close(out, dropped @ v)


@settings(max_examples=40, deadline=None)
@given(
    L=st.integers(1, 6), S=st.integers(1, 6), E=st.integers(1, 6), batch=st.integers(0, 3),
    seed=st.integers(0, 2**16), causal=st.booleans(),
)
def test_property_weights_are_a_convex_combination(L, S, E, batch, seed, causal):
    q, k, v = _qkv((batch,), L, S, E, 3, dtype=torch.float64, seed=seed)
    out, weights = ac.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert torch.all(weights >= 0)
    sums = weights.sum(-1)
    assert torch.all((sums - 1).abs() < 1e-9)
    # Each output lies between the smallest and largest value, feature by feature.
    if batch:
        assert torch.all(out <= v.max(dim=-2, keepdim=True).values + 1e-9)
        assert torch.all(out >= v.min(dim=-2, keepdim=True).values - 1e-9)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=causal))


# --- SelfAttention ---------------------------------------------------------------------------

@pytest.mark.parametrize("qkv_bias", [False, True])
def test_self_attention_matches_manual_projections(qkv_bias, device):
    torch.manual_seed(0)
    layer = ac.SelfAttention(6, 4, qkv_bias=qkv_bias).to(device)
    x = torch.randn(3, 5, 6, device=device)
    context, weights = layer(x, is_causal=True)
    q, k, v = layer.W_query(x), layer.W_key(x), layer.W_value(x)
    torch.testing.assert_close(context, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert weights.shape == (3, 5, 5) and context.shape == (3, 5, 4)
    assert (layer.W_query.bias is not None) == qkv_bias


def test_self_attention_trains():
    torch.manual_seed(0)
    layer = ac.SelfAttention(4, 4)
    x = torch.randn(8, 5, 4)
    target = x.flip(1)
    optimizer = torch.optim.Adam(layer.parameters(), lr=0.05)
    losses = []
    for _ in range(60):
        loss = F.mse_loss(layer(x)[0], target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())


def test_default_scale_is_one_over_sqrt_width():
    q, k, v = _qkv((1,), 2, 3, 9, 2, dtype=torch.float64)
    torch.testing.assert_close(
        ac.scaled_dot_product_attention(q, k, v)[0], ac.scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(9))[0]
    )


def test_dropout_matches_torch_for_the_same_seed():
    # On the CPU PyTorch's math path draws the same dropout mask from the same generator state.
    q, k, v = _qkv((2, 3), 5, 6, 8, 4, seed=8)
    torch.manual_seed(1)
    expected = F.scaled_dot_product_attention(q, k, v, dropout_p=0.3)
    torch.manual_seed(1)
    torch.testing.assert_close(ac.scaled_dot_product_attention(q, k, v, dropout_p=0.3)[0], expected)


def test_batch_dimensions_broadcast_as_in_torch():
    g = torch.Generator().manual_seed(9)
    q, k, v = torch.randn(2, 1, 5, 8, generator=g), torch.randn(1, 3, 6, 8, generator=g), torch.randn(1, 3, 6, 4, generator=g)
    out, weights = ac.scaled_dot_product_attention(q, k, v)
    assert out.shape == (2, 3, 5, 4) and weights.shape == (2, 3, 5, 6)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
