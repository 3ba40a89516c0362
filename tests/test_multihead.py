"""attn_course.MultiHeadAttention against torch.nn.MultiheadAttention, both backends."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import attn_course as ac

BACKENDS = ["reference", "sdpa"]
CASES = [
    # (B, L, S, E, H)
    (2, 5, 5, 16, 4),
    (1, 1, 1, 8, 1),
    (3, 4, 7, 12, 3),
    (2, 6, 2, 8, 8),
]


def _pair(E, H, backend, dtype=torch.float64, device="cpu", bias=True, seed=0):
    torch.manual_seed(seed)
    theirs = nn.MultiheadAttention(E, H, bias=bias, batch_first=True).to(device=device, dtype=dtype).eval()
    ours = ac.MultiHeadAttention.from_torch(theirs, backend=backend)
    return ours, theirs


def _inputs(B, L, S, E, dtype=torch.float64, device="cpu", seed=1):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, L, E, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)
    kv = torch.randn(B, S, E, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)
    return q, kv


def _masks(kind, B, L, S, H, device, dtype):
    g = torch.Generator().manual_seed(3)
    kpm = am = None
    if kind in ("padding", "padding+attn", "float"):
        lengths = torch.randint(1, S + 1, (B,), generator=g)
        kpm = (torch.arange(S)[None] >= lengths[:, None]).to(device)  # True = padding
    if kind in ("attn", "padding+attn"):
        am = (torch.rand(L, S, generator=g) > 0.6).to(device)
        am[:, 0] = False  # never block everything
    if kind == "per_head":
        am = (torch.rand(B * H, L, S, generator=g) > 0.6).to(device)
        am[..., 0] = False
    if kind == "float":
        kpm = torch.zeros(B, S, dtype=dtype, device=device).masked_fill(kpm, float("-inf"))
        am = torch.randn(L, S, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)
    return kpm, am


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("mask_kind", ["none", "padding", "attn", "padding+attn", "per_head", "float"])
def test_matches_nn_multihead_attention(backend, case, mask_kind, device):
    B, L, S, E, H = case
    ours, theirs = _pair(E, H, backend, device=device, dtype=torch.float32 if device.type == "mps" else torch.float64)
    dtype = ours.q_proj.weight.dtype
    query, memory = _inputs(B, L, S, E, dtype=dtype, device=device)
    kpm, am = _masks(mask_kind, B, L, S, H, device, dtype)
    out, weights = ours(query, memory, memory, key_padding_mask=kpm, attn_mask=am)
    ref_out, ref_weights = theirs(query, memory, memory, key_padding_mask=kpm, attn_mask=am, average_attn_weights=False)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(weights, ref_weights)
    assert weights.shape == (B, H, L, S)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("L", [1, 4, 9])
def test_is_causal_alone_applies_the_causal_mask(backend, L, device):
    ours, theirs = _pair(8, 2, backend, device=device, dtype=torch.float32)
    x, _ = _inputs(2, L, L, 8, dtype=torch.float32, device=device)
    causal_blocked = torch.ones(L, L, dtype=torch.bool, device=device).triu(1)
    out, weights = ours(x, x, x, is_causal=True)
    ref, ref_w = theirs(x, x, x, attn_mask=causal_blocked, is_causal=True, average_attn_weights=False)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(weights, ref_w, atol=1e-5, rtol=1e-4)
    assert torch.all(weights[..., causal_blocked] == 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_causal_together_with_padding(backend):
    ours, theirs = _pair(8, 2, backend)
    x, _ = _inputs(3, 5, 5, 8)
    kpm = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]])
    causal = torch.ones(5, 5, dtype=torch.bool).triu(1)
    out, w = ours(x, x, x, key_padding_mask=kpm, is_causal=True)
    ref, ref_w = theirs(x, x, x, key_padding_mask=kpm, attn_mask=causal, average_attn_weights=False)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(w, ref_w)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dtypes_follow_the_module(backend, dtype, device):
    ours, theirs = _pair(16, 4, backend, dtype=dtype, device=device)
    query, memory = _inputs(2, 3, 4, 16, dtype=dtype, device=device)
    out, weights = ours(query, memory, memory)
    expected = ac.MultiHeadAttention.from_torch(theirs.double().to(device), backend)(query.double(), memory.double(), memory.double())[0]
    assert out.dtype == dtype and weights.dtype == dtype and out.device.type == device.type
    tol = dict(atol=5e-2, rtol=5e-2) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out.double(), expected, **tol)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_match_nn_multihead_attention(backend, device):
    dtype = torch.float32 if device.type == "mps" else torch.float64
    ours, theirs = _pair(12, 3, backend, dtype=dtype, device=device)
    query, memory = _inputs(2, 4, 6, 12, dtype=dtype, device=device)
    kpm, am = _masks("padding+attn", 2, 4, 6, 3, device, dtype)
    q1, m1 = query.clone().requires_grad_(), memory.clone().requires_grad_()
    q2, m2 = query.clone().requires_grad_(), memory.clone().requires_grad_()
    ours(q1, m1, m1, key_padding_mask=kpm, attn_mask=am)[0].square().sum().backward()
    theirs(q2, m2, m2, key_padding_mask=kpm, attn_mask=am)[0].square().sum().backward()
    torch.testing.assert_close(q1.grad, q2.grad)
    torch.testing.assert_close(m1.grad, m2.grad)
    E = 12
    in_grad = theirs.in_proj_weight.grad
    torch.testing.assert_close(ours.q_proj.weight.grad, in_grad[:E])
    torch.testing.assert_close(ours.k_proj.weight.grad, in_grad[E : 2 * E])
    torch.testing.assert_close(ours.v_proj.weight.grad, in_grad[2 * E :])
    torch.testing.assert_close(ours.out_proj.weight.grad, theirs.out_proj.weight.grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fully_masked_query_gives_zeros_not_nan(backend, device):
    ours, _ = _pair(8, 2, backend, dtype=torch.float32, device=device)
    x, _ = _inputs(2, 3, 3, 8, dtype=torch.float32, device=device)
    x.requires_grad_()
    kpm = torch.tensor([[True, True, True], [False, False, True]], device=device)  # sequence 0 is all padding
    out, weights = ours(x, x, x, key_padding_mask=kpm)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    assert torch.all(weights[0] == 0)
    # The output of an empty row is out_proj applied to a zero context: just the output bias.
    torch.testing.assert_close(out[0], ours.out_proj.bias.expand(3, 8))
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_need_weights_false_returns_none_and_same_output():
    ours, _ = _pair(8, 2, "sdpa")
    x, _ = _inputs(2, 3, 3, 8)
    out, weights = ours(x, x, x, need_weights=False)
    assert weights is None
    torch.testing.assert_close(out, ours(x, x, x)[0])


def test_backends_agree_and_bias_false():
    torch.manual_seed(0)
    ref = ac.MultiHeadAttention(16, 4, bias=False).double()
    fused = ac.MultiHeadAttention(16, 4, bias=False, backend="sdpa").double()
    fused.load_state_dict(ref.state_dict())
    assert ref.q_proj.bias is None
    x, _ = _inputs(3, 7, 7, 16)
    for kwargs in ({}, {"is_causal": True}):
        torch.testing.assert_close(ref(x, x, x, **kwargs)[0], fused(x, x, x, **kwargs)[0])


def test_empty_batch():
    ours = ac.MultiHeadAttention(8, 2)
    x = torch.randn(0, 4, 8)
    out, weights = ours(x, x, x)
    assert out.shape == (0, 4, 8) and weights.shape == (0, 2, 4, 4)


def test_dropout_only_in_training_mode():
    torch.manual_seed(0)
    mha = ac.MultiHeadAttention(16, 4, dropout=0.5)
    x = torch.randn(2, 6, 16)
    mha.eval()
    torch.testing.assert_close(mha(x, x, x)[0], mha(x, x, x)[0])
    mha.train()
    _, weights = mha(x, x, x)
    assert (weights == 0).float().mean() > 0.3  # about half the weights dropped
    kept = weights[weights != 0]
    assert kept.max() <= 2.0 + 1e-6  # scaled by 1 / (1 - p) = 2


def test_from_torch_copies_training_mode_and_dropout():
    theirs = nn.MultiheadAttention(8, 2, dropout=0.1, batch_first=True)
    ours = ac.MultiHeadAttention.from_torch(theirs)
    assert ours.training and ours.dropout == 0.1
    assert ours.q_proj.weight.data_ptr() != theirs.in_proj_weight.data_ptr()  # a copy, not a view


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: nn.MultiheadAttention(8, 2), "batch_first=True"),
        (lambda: nn.MultiheadAttention(8, 2, kdim=4, batch_first=True), "kdim"),
        (lambda: nn.MultiheadAttention(8, 2, add_bias_kv=True, batch_first=True), "add_bias_kv"),
        (lambda: nn.Linear(8, 8), "MultiheadAttention"),
    ],
)
def test_from_torch_rejects_what_it_cannot_copy(make, match):
    with pytest.raises((TypeError, ValueError), match=match):
        ac.MultiHeadAttention.from_torch(make())


def test_sdpa_backend_calls_the_fused_kernel(monkeypatch):
    calls = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs.get("is_causal"))
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    ours = ac.MultiHeadAttention(8, 2, backend="sdpa")
    x = torch.randn(1, 3, 8)
    ours(x, x, x, is_causal=True, need_weights=False)
    assert calls == [True]


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
@pytest.mark.parametrize("qk_head_dim", [1, 3, 8])
@pytest.mark.parametrize("is_causal", [False, True])
def test_qk_head_dim_against_sdpa(backend, qk_head_dim, is_causal, device):
    """Narrower (or wider) queries and keys than values, the paper's d_k (Table 3, rows B): the scale
    is 1/sqrt(d_k), values and output keep their width."""
    torch.manual_seed(qk_head_dim)
    B, L, E, H = 2, 5, 12, 3
    mha = ac.MultiHeadAttention(E, H, qk_head_dim=qk_head_dim, backend=backend).to(device)
    x = torch.randn(B, L, E, device=device)
    out, weights = mha(x, x, x, is_causal=is_causal)
    q = mha.q_proj(x).view(B, L, H, qk_head_dim).transpose(1, 2)  # (B, H, L, d_k)
    k = mha.k_proj(x).view(B, L, H, qk_head_dim).transpose(1, 2)  # (B, H, L, d_k)
    v = mha.v_proj(x).view(B, L, H, E // H).transpose(1, 2)       # (B, H, L, D)
    context = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)  # (B, H, L, D)
    expected = mha.out_proj(context.transpose(1, 2).reshape(B, L, E))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    assert mha.q_proj.weight.shape == (H * qk_head_dim, E) and mha.v_proj.weight.shape == (E, E)
    if weights is not None:
        assert weights.shape == (B, H, L, L)


@pytest.mark.parametrize("qk_head_dim", [0, -2, 2.5, True])
def test_qk_head_dim_must_be_a_positive_int(qk_head_dim):
    with pytest.raises((TypeError, ValueError), match="qk_head_dim"):
        ac.MultiHeadAttention(12, 3, qk_head_dim=qk_head_dim)
