"""simple_self_attention, get_device and set_seed."""

import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attn_course as ac


@pytest.mark.parametrize("shape", [(1, 1), (4, 3), (2, 5, 3), (0, 4, 2), (2, 3, 6, 4)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_simple_self_attention_is_softmax_of_x_xT(shape, dtype, device):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(device=device, dtype=dtype)
    context, weights = ac.simple_self_attention(x)
    xd = x.double()
    expected_weights = torch.softmax(xd @ xd.transpose(-2, -1), dim=-1)
    tol = {torch.bfloat16: dict(atol=2e-2, rtol=2e-2), torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float64: {}}[dtype]
    torch.testing.assert_close(weights.double(), expected_weights, **tol)
    torch.testing.assert_close(context.double(), expected_weights @ xd, **tol)
    # It is scaled dot-product attention with q = k = v = x and no scaling.
    torch.testing.assert_close(context.double(), F.scaled_dot_product_attention(xd, xd, xd, scale=1.0), **tol)
    assert context.dtype == dtype and context.device.type == device.type


def test_simple_self_attention_gradients_flow():
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: ac.simple_self_attention(t)[0], (x,))


def test_get_device_prefers_cuda_then_mps(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert ac.get_device() == torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert ac.get_device() == torch.device("mps")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert ac.get_device() == torch.device("cpu")


def test_set_seed_makes_every_generator_repeat():
    ac.set_seed(123)
    first = (random.random(), np.random.rand(), torch.rand(3))
    ac.set_seed(123)
    second = (random.random(), np.random.rand(), torch.rand(3))
    assert first[0] == second[0] and first[1] == second[1]
    torch.testing.assert_close(first[2], second[2])
    ac.set_seed(124)
    assert not torch.equal(torch.rand(3), first[2])


def test_public_api_names():
    for name in ["get_device", "set_seed", "simple_self_attention", "scaled_dot_product_attention", "SelfAttention",
                 "AdditiveAttention", "DotProductAttention", "MultiHeadAttention", "sinusoidal_positional_encoding",
                 "PositionalEncoding"]:
        assert hasattr(ac, name), name
    mha = ac.MultiHeadAttention(8, 2)
    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
        assert isinstance(getattr(mha, proj), torch.nn.Linear)
