"""Linear attention and the delta rule against references written from the papers' equations.

The references below are plain loops over tokens, written from the equations of Katharopoulos et
al. (2020, eq. 2-4 and 18-20), Schlag et al. (2021) / Yang et al. (2024) and Yang et al. (2025),
in the papers' own orientation (the DeltaNet state as ``d_v x d_k``, ``o_t = S_t q_t``); they
share no code with ``attn_course.linear``.
"""

import pytest
import torch
import torch.nn.functional as F

import attn_course as ac
from attn_course.linear import (
    DeltaNetAttention,
    LinearAttention,
    LinearAttentionState,
    delta_rule,
    delta_rule_step,
    linear_attention,
    linear_attention_step,
)

pytestmark = pytest.mark.usefixtures("one_thread")

F64 = dict(rtol=1e-10, atol=1e-10)
F32 = dict(rtol=1e-4, atol=1e-5)


# -- references, from the papers ---------------------------------------------------------------------
def elu_plus_one(x):
    return torch.where(x > 0, x + 1.0, torch.exp(x))  # elu(x) + 1 written out


def reference_linear_attention(q, k, v, phi, causal=True, normalize=True, eps=1e-6):
    """Katharopoulos et al. eq. 2-4: V'_i = sum_j sim(Q_i, K_j) V_j / sum_j sim(Q_i, K_j), sim = phi . phi."""
    B, H, L, _ = q.shape
    S = k.size(2)
    out = torch.zeros(B, H, L, v.size(-1), dtype=q.dtype, device=q.device)
    for b in range(B):
        for h in range(H):
            for i in range(L):
                numerator = torch.zeros(v.size(-1), dtype=q.dtype, device=q.device)
                denominator = torch.zeros((), dtype=q.dtype, device=q.device)
                for j in range(i + 1 if causal else S):
                    similarity = torch.dot(phi(q[b, h, i]), phi(k[b, h, j]))
                    numerator = numerator + similarity * v[b, h, j]
                    denominator = denominator + similarity
                out[b, h, i] = numerator / (denominator + eps) if normalize else numerator
    return out


def reference_delta_rule(q, k, v, beta, alpha=None):
    """DeltaNet in the papers' orientation: S_t (d_v x d_k), S_t = S_{t-1} - beta_t (S_{t-1} k_t - v_t) k_t^T,
    gated: S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T; o_t = S_t q_t.
    Returns the outputs and the final S (d_v x d_k)."""
    B, H, L, Dk = k.shape
    Dv = v.size(-1)
    out = torch.zeros(B, H, L, Dv, dtype=q.dtype, device=q.device)
    final = torch.zeros(B, H, Dv, Dk, dtype=q.dtype, device=q.device)
    eye = torch.eye(Dk, dtype=q.dtype, device=q.device)
    for b in range(B):
        for h in range(H):
            state = torch.zeros(Dv, Dk, dtype=q.dtype, device=q.device)
            for t in range(L):
                k_t, v_t, b_t = k[b, h, t], v[b, h, t], beta[b, h, t]
                if alpha is None:
                    state = state - b_t * torch.outer(state @ k_t - v_t, k_t)
                else:
                    state = alpha[b, h, t] * state @ (eye - b_t * torch.outer(k_t, k_t)) + b_t * torch.outer(v_t, k_t)
                out[b, h, t] = state @ q[b, h, t]
            final[b, h] = state
    return out, final


def _qkv(B=2, H=2, L=7, S=None, Dk=3, Dv=4, dtype=torch.float64, device="cpu", seed=0, unit=False):
    generator = torch.Generator().manual_seed(seed)
    S = L if S is None else S
    q = torch.randn(B, H, L, Dk, generator=generator, dtype=dtype)
    k = torch.randn(B, H, S, Dk, generator=generator, dtype=dtype)
    v = torch.randn(B, H, S, Dv, generator=generator, dtype=dtype)
    if unit:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    return q.to(device), k.to(device), v.to(device)


def _beta_gate(B=2, H=2, L=7, dtype=torch.float64, device="cpu", seed=1):
    generator = torch.Generator().manual_seed(seed)
    beta = torch.rand(B, H, L, generator=generator, dtype=dtype)
    gate = 0.5 + 0.5 * torch.rand(B, H, L, generator=generator, dtype=dtype)  # in (0.5, 1)
    return beta.to(device), gate.to(device)


# -- linear attention --------------------------------------------------------------------------------
FEATURE_MAPS = [("elu+1", elu_plus_one), ("relu", lambda x: torch.clamp(x, min=0))]


@pytest.mark.parametrize("name, phi", FEATURE_MAPS, ids=[n for n, _ in FEATURE_MAPS])
def test_causal_parallel_recurrent_and_steps_equal_the_paper(name, phi, device):
    q, k, v = _qkv(device=device)
    expected = reference_linear_attention(q, k, v, phi)
    parallel = linear_attention(q, k, v, feature_map=name)
    recurrent = linear_attention(q, k, v, feature_map=name, method="recurrent")
    state, steps = None, []
    for t in range(q.size(2)):
        o_t, state = linear_attention_step(q[:, :, t], k[:, :, t], v[:, :, t], state, feature_map=name)
        steps.append(o_t)
    assert parallel.shape == (2, 2, 7, 4)  # D_v = 4 differs from D_k = 3
    torch.testing.assert_close(parallel, expected, **F64)
    torch.testing.assert_close(recurrent, expected, **F64)
    torch.testing.assert_close(torch.stack(steps, dim=2), expected, **F64)


@pytest.mark.parametrize("name, phi", FEATURE_MAPS, ids=[n for n, _ in FEATURE_MAPS])
def test_non_causal_form_with_more_keys_than_queries(name, phi, device):
    q, k, v = _qkv(L=4, S=9, device=device)
    expected = reference_linear_attention(q, k, v, phi, causal=False)
    torch.testing.assert_close(linear_attention(q, k, v, feature_map=name, causal=False), expected, **F64)


def test_identity_map_without_normalisation_is_masked_qk_times_v(device):
    q, k, v = _qkv(device=device)
    mask = torch.ones(7, 7, dtype=torch.bool, device=device).tril()
    expected = ((q @ k.transpose(-2, -1)) * mask) @ v  # (Q K^T * M) V, no softmax, no division
    for method in ("parallel", "recurrent"):
        out = linear_attention(q, k, v, feature_map="identity", method=method)  # normalize defaults to False
        torch.testing.assert_close(out, expected, **F64)
    torch.testing.assert_close(linear_attention(q, k, v, feature_map="identity", causal=False), (q @ k.transpose(-2, -1)) @ v, **F64)


def test_a_callable_feature_map_may_change_the_width():
    def phi(x):
        return torch.cat([F.relu(x), F.relu(-x)], dim=-1)  # (..., D_k) -> (..., 2 D_k), non-negative

    q, k, v = _qkv()
    out, state = linear_attention(q, k, v, feature_map=phi, return_state=True)
    torch.testing.assert_close(out, reference_linear_attention(q, k, v, phi), **F64)
    assert state.S.shape == (2, 2, 6, 4) and state.z.shape == (2, 2, 6)
    torch.testing.assert_close(linear_attention(q, k, v, feature_map=phi, method="recurrent"), out, **F64)


def test_unnormalised_elu_differs_from_normalised():
    q, k, v = _qkv()
    plain = linear_attention(q, k, v, normalize=False)
    torch.testing.assert_close(plain, reference_linear_attention(q, k, v, elu_plus_one, normalize=False), **F64)
    assert not torch.allclose(plain, linear_attention(q, k, v))


@pytest.mark.parametrize("method", ["parallel", "recurrent"])
def test_continuing_from_a_state_equals_one_pass(method, device):
    q, k, v = _qkv(L=9, device=device)
    full, full_state = linear_attention(q, k, v, return_state=True)
    first, state = linear_attention(q[:, :, :5], k[:, :, :5], v[:, :, :5], method=method, return_state=True)
    second, state = linear_attention(q[:, :, 5:], k[:, :, 5:], v[:, :, 5:], method=method, initial_state=state,
                                     return_state=True)
    torch.testing.assert_close(torch.cat([first, second], dim=2), full, **F64)
    torch.testing.assert_close(state.S, full_state.S, **F64)
    torch.testing.assert_close(state.z, full_state.z, **F64)


def test_the_state_is_the_sum_of_outer_products_and_its_size_does_not_grow():
    shapes = set()
    for L in (1, 5, 40):
        q, k, v = _qkv(L=L)
        _, state = linear_attention(q, k, v, return_state=True)
        phi_k = elu_plus_one(k)
        expected = sum(torch.einsum("bhi,bhj->bhij", phi_k[:, :, t], v[:, :, t]) for t in range(L))
        torch.testing.assert_close(state.S, expected, **F64)
        torch.testing.assert_close(state.z, phi_k.sum(dim=2), **F64)
        shapes.add((tuple(state.S.shape), tuple(state.z.shape)))
    assert shapes == {((2, 2, 3, 4), (2, 2, 3))}


def test_float32_matches_float64(device):
    q, k, v = _qkv(L=16, device=device)
    expected = linear_attention(q, k, v)
    for method in ("parallel", "recurrent"):
        out = linear_attention(q.float(), k.float(), v.float(), method=method)
        assert out.dtype == torch.float32 and out.device.type == torch.device(device).type
        torch.testing.assert_close(out.double(), expected, **F32)


def test_relu_query_with_no_features_gives_zeros_not_nan():
    q, k, v = _qkv()
    q = -q.abs()  # relu(q) = 0: nothing to attend with
    out = linear_attention(q, k, v, feature_map="relu")
    assert torch.equal(out, torch.zeros_like(out))


# -- the delta rule ----------------------------------------------------------------------------------
@pytest.mark.parametrize("gated", [False, True], ids=["deltanet", "gated"])
def test_delta_rule_recurrence_equals_the_paper(gated, device):
    q, k, v = _qkv(unit=True, device=device)
    beta, gate = _beta_gate(device=device)
    expected, final = reference_delta_rule(q, k, v, beta, gate if gated else None)
    out, state = delta_rule(q, k, v, beta, gate=gate if gated else None, return_state=True)
    torch.testing.assert_close(out, expected, **F64)
    torch.testing.assert_close(state, final.transpose(-2, -1), **F64)  # ours is (D_k, D_v), the paper's (d_v, d_k)


@pytest.mark.parametrize("gated", [False, True], ids=["deltanet", "gated"])
@pytest.mark.parametrize("chunk_size", [1, 2, 3, 4, 5, 13, 32])
def test_chunkwise_form_equals_the_recurrence(gated, chunk_size, device):
    L = 13  # chunk sizes 2, 3, 4 and 5 leave a shorter last chunk; 32 is one chunk longer than L
    q, k, v = _qkv(L=L, unit=True, device=device)
    beta, gate = _beta_gate(L=L, device=device)
    gate = gate if gated else None
    recurrent, recurrent_state = delta_rule(q, k, v, beta, gate=gate, return_state=True)
    chunked, chunked_state = delta_rule(q, k, v, beta, gate=gate, chunk_size=chunk_size, return_state=True)
    torch.testing.assert_close(chunked, recurrent, **F64)
    torch.testing.assert_close(chunked_state, recurrent_state, **F64)
    # float32: the same up to rounding
    args32 = [x.float() for x in (q, k, v, beta)]
    chunked32 = delta_rule(*args32, gate=None if gate is None else gate.float(), chunk_size=chunk_size)
    assert chunked32.dtype == torch.float32
    torch.testing.assert_close(chunked32.double(), recurrent, **F32)


@pytest.mark.parametrize("chunk_size", [None, 4])
def test_strong_decay_and_long_sequences_stay_finite(chunk_size):
    q, k, v = _qkv(L=64, unit=True)
    beta, _ = _beta_gate(L=64)
    gate = torch.full_like(beta, 1e-30)  # log(gamma) summed over a chunk: far below float32's range
    reference, _ = reference_delta_rule(q, k, v, beta, gate)
    torch.testing.assert_close(delta_rule(q, k, v, beta, gate=gate, chunk_size=chunk_size), reference, **F64)
    out32 = delta_rule(q.float(), k.float(), v.float(), beta.float(), gate=gate.float(), chunk_size=chunk_size)
    assert torch.isfinite(out32).all()
    torch.testing.assert_close(out32.double(), reference, **F32)


@pytest.mark.parametrize("chunk_size", [None, 3])
@pytest.mark.parametrize("gated", [False, True], ids=["deltanet", "gated"])
def test_delta_rule_continues_from_a_state_and_steps_agree(chunk_size, gated):
    q, k, v = _qkv(L=10, unit=True)
    beta, gate = _beta_gate(L=10)
    gate = gate if gated else None
    full, full_state = delta_rule(q, k, v, beta, gate=gate, return_state=True)
    first, state = delta_rule(q[:, :, :4], k[:, :, :4], v[:, :, :4], beta[:, :, :4],
                              gate=None if gate is None else gate[:, :, :4], chunk_size=chunk_size, return_state=True)
    second, state = delta_rule(q[:, :, 4:], k[:, :, 4:], v[:, :, 4:], beta[:, :, 4:],
                               gate=None if gate is None else gate[:, :, 4:], chunk_size=chunk_size,
                               initial_state=state, return_state=True)
    torch.testing.assert_close(torch.cat([first, second], dim=2), full, **F64)
    torch.testing.assert_close(state, full_state, **F64)
    state, steps = None, []
    for t in range(10):
        o_t, state = delta_rule_step(q[:, :, t], k[:, :, t], v[:, :, t], beta[:, :, t], state,
                                     gate_t=None if gate is None else gate[:, :, t])
        steps.append(o_t)
    torch.testing.assert_close(torch.stack(steps, dim=2), full, **F64)
    torch.testing.assert_close(state, full_state, **F64)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("chunk_size", [None, 3])
def test_beta_one_and_orthonormal_keys_store_and_retrieve_exactly(seed, chunk_size):
    """Property: with beta = 1 and orthonormal keys, querying key j after all writes returns v_j,
    even when key j was written twice (the second value replaces the first)."""
    generator = torch.Generator().manual_seed(seed)
    Dk, Dv, n = 6, 5, 4 + seed % 3  # n <= D_k pairs
    keys = torch.linalg.qr(torch.randn(Dk, Dk, generator=generator, dtype=torch.float64))[0][:n]  # (n, D_k), orthonormal
    values = torch.randn(n, Dv, generator=generator, dtype=torch.float64)
    overwrite = torch.randn(Dv, generator=generator, dtype=torch.float64)  # key 0 again, with a new value
    k = torch.cat([keys, keys[:1]])[None, None]  # (1, 1, n + 1, D_k)
    v = torch.cat([values, overwrite[None]])[None, None]  # (1, 1, n + 1, D_v)
    _, state = delta_rule(k, k, v, 1.0, chunk_size=chunk_size, return_state=True)
    retrieved = keys @ state[0, 0]  # (n, D_v): q^T S for q = each key
    expected = torch.cat([overwrite[None], values[1:]])
    torch.testing.assert_close(retrieved, expected, **F64)
    # Plain linear attention (identity map, no normalisation) stores by adding: key 0 returns the sum.
    _, linear_state = linear_attention(k, k, v, feature_map="identity", return_state=True)
    torch.testing.assert_close(keys[0] @ linear_state.S[0, 0], values[0] + overwrite, **F64)


def test_gate_one_is_deltanet_and_gate_zero_forgets(device):
    q, k, v = _qkv(unit=True, device=device)
    beta, _ = _beta_gate(device=device)
    plain = delta_rule(q, k, v, beta)
    torch.testing.assert_close(delta_rule(q, k, v, beta, gate=torch.ones_like(beta), chunk_size=3), plain, **F64)
    gate = torch.ones_like(beta)
    gate[:, :, 4] = 0.0  # erase everything before token 4
    out = delta_rule(q, k, v, beta, gate=gate, chunk_size=3)
    fresh = delta_rule(q[:, :, 4:], k[:, :, 4:], v[:, :, 4:], beta[:, :, 4:])
    torch.testing.assert_close(out[:, :, 4:], fresh, **F64)


def test_state_size_does_not_depend_on_length():
    shapes = set()
    for L in (1, 8, 50):
        q, k, v = _qkv(L=L, unit=True)
        beta, gate = _beta_gate(L=L)
        _, state = delta_rule(q, k, v, beta, gate=gate, chunk_size=8, return_state=True)
        shapes.add(tuple(state.shape))
    assert shapes == {(2, 2, 3, 4)}


def test_beta_broadcasts_and_float_beta():
    q, k, v = _qkv(unit=True)
    half = torch.full((2, 2, 7), 0.5, dtype=torch.float64)
    torch.testing.assert_close(delta_rule(q, k, v, 0.5), delta_rule(q, k, v, half), **F64)
    torch.testing.assert_close(delta_rule(q, k, v, half[:, :, :1]), delta_rule(q, k, v, half), **F64)


# -- gradients ---------------------------------------------------------------------------------------
def test_gradcheck_linear_attention():
    q, k, v = (x.requires_grad_() for x in _qkv(B=1, H=1, L=4, Dk=2, Dv=3))
    assert torch.autograd.gradcheck(lambda a, b, c: linear_attention(a, b, c), (q, k, v))
    assert torch.autograd.gradcheck(lambda a, b, c: linear_attention(a, b, c, method="recurrent"), (q, k, v))
    assert torch.autograd.gradcheck(lambda a, b, c: linear_attention(a, b, c, causal=False), (q, k, v))


@pytest.mark.parametrize("chunk_size", [None, 2])
def test_gradcheck_delta_rule(chunk_size):
    q, k, v = _qkv(B=1, H=1, L=5, Dk=2, Dv=2, unit=True)
    beta, gate = _beta_gate(B=1, H=1, L=5)
    inputs = tuple(x.clone().requires_grad_() for x in (q, k, v, beta, gate))
    assert torch.autograd.gradcheck(lambda a, b, c, d, e: delta_rule(a, b, c, d, gate=e, chunk_size=chunk_size), inputs)


# -- modules -----------------------------------------------------------------------------------------
def _projections(module, x):
    B, L, _ = x.shape
    H, Dk, D = module.num_heads, module.qk_head_dim, module.head_dim
    q = module.q_proj(x).view(B, L, H, Dk).transpose(1, 2)
    k = module.k_proj(x).view(B, L, H, Dk).transpose(1, 2)
    v = module.v_proj(x).view(B, L, H, D).transpose(1, 2)
    return q, k, v


def test_linear_attention_module_equals_the_reference_and_caches(device):
    torch.manual_seed(0)
    module = LinearAttention(12, 3, qk_head_dim=2).to(device=device, dtype=torch.float64)
    x = torch.randn(2, 6, 12, dtype=torch.float64, device=device)
    q, k, v = _projections(module, x)
    context = reference_linear_attention(q, k, v, elu_plus_one)  # (B, H, L, D)
    expected = module.out_proj(context.transpose(1, 2).reshape(2, 6, 12))
    torch.testing.assert_close(module(x), expected, **F64)
    # prefill 2 tokens, then one at a time: the state keeps its shape
    state = module.new_state(2)
    assert isinstance(state, LinearAttentionState) and state.S.shape == (2, 3, 2, 4) and state.S.device.type == torch.device(device).type
    outputs = []
    for chunk in (x[:, :2], x[:, 2:3], x[:, 3:4], x[:, 4:5], x[:, 5:]):
        out, state = module.forward_cached(chunk, state)
        outputs.append(out)
        assert state.S.shape == (2, 3, 2, 4) and state.z.shape == (2, 3, 2)
    torch.testing.assert_close(torch.cat(outputs, dim=1), expected, **F64)


def test_linear_attention_module_non_causal():
    torch.manual_seed(0)
    module = LinearAttention(8, 2, feature_map="relu", causal=False).double()
    x = torch.randn(1, 5, 8, dtype=torch.float64)
    q, k, v = _projections(module, x)
    context = reference_linear_attention(q, k, v, F.relu, causal=False)
    torch.testing.assert_close(module(x), module.out_proj(context.transpose(1, 2).reshape(1, 5, 8)), **F64)
    with pytest.raises(ValueError, match="causal"):
        module.forward_cached(x, module.new_state(1))


@pytest.mark.parametrize("use_gate", [False, True])
def test_deltanet_module_equals_the_reference_and_caches(use_gate, device):
    torch.manual_seed(0)
    module = DeltaNetAttention(12, 3, use_gate=use_gate, chunk_size=4).to(device=device, dtype=torch.float64)
    x = torch.randn(2, 9, 12, dtype=torch.float64, device=device)
    q, k, v = _projections(module, x)
    q, k = F.normalize(F.silu(q), dim=-1), F.normalize(F.silu(k), dim=-1)
    beta = torch.sigmoid(module.beta_proj(x)).transpose(1, 2)  # (B, H, L)
    alpha = None
    if use_gate:  # Gated DeltaNet: alpha = exp(-exp(A_log) softplus(a + dt_bias))
        alpha = torch.exp(-module.A_log.exp() * F.softplus(module.gate_proj(x) + module.dt_bias)).transpose(1, 2)
        assert bool(((alpha > 0) & (alpha < 1)).all())
    context, _ = reference_delta_rule(q, k, v, beta, alpha)
    expected = module.out_proj(context.transpose(1, 2).reshape(2, 9, 12))
    torch.testing.assert_close(module(x), expected, **F64)
    module.chunk_size = None
    torch.testing.assert_close(module(x), expected, **F64)
    module.chunk_size = 4
    state = module.new_state(2)
    assert state.shape == (2, 3, 4, 4)
    outputs = []
    for chunk in (x[:, :5], x[:, 5:6], x[:, 6:7], x[:, 7:]):
        out, state = module.forward_cached(chunk, state)
        outputs.append(out)
        assert state.shape == (2, 3, 4, 4)
    torch.testing.assert_close(torch.cat(outputs, dim=1), expected, **F64)


def test_modules_train():
    torch.manual_seed(0)
    for module in (LinearAttention(8, 2), DeltaNetAttention(8, 2, use_gate=True, chunk_size=2)):
        x = torch.randn(2, 5, 8)
        module(x).square().mean().backward()
        grads = {name: p.grad for name, p in module.named_parameters()}
        assert all(g is not None and torch.isfinite(g).all() for g in grads.values()), module
        assert any(g.abs().sum() > 0 for g in grads.values())


def test_exported_from_the_package():
    for name in ("linear_attention", "linear_attention_step", "delta_rule", "delta_rule_step", "LinearAttention",
                 "DeltaNetAttention", "LinearAttentionState", "associative_recall"):
        assert getattr(ac, name) is getattr(__import__("attn_course.linear", fromlist=[name]), name)


# -- the recall task ---------------------------------------------------------------------------------
def test_associative_recall_asks_for_the_value_stored_with_each_key():
    tokens, targets = ac.associative_recall(50, 6, num_keys=10, num_values=7, generator=torch.Generator().manual_seed(0))
    assert tokens.shape == targets.shape == (50, 18) and tokens.dtype == torch.int64
    for row, target in zip(tokens.tolist(), targets.tolist()):
        keys, values, queries = row[0:12:2], row[1:12:2], row[12:]
        assert len(set(keys)) == 6 and all(0 <= key < 10 for key in keys)
        assert all(10 <= value < 17 for value in values)
        assert sorted(queries) == sorted(keys) and target[:12] == [-100] * 12
        stored = dict(zip(keys, values))
        assert target[12:] == [stored[query] for query in queries]
    again, _ = ac.associative_recall(50, 6, num_keys=10, num_values=7, generator=torch.Generator().manual_seed(0))
    assert torch.equal(again, tokens)
    with pytest.raises(ValueError, match="num_pairs must be at most num_keys"):
        ac.associative_recall(2, 11, num_keys=10)
    with pytest.raises(TypeError, match="generator"):
        ac.associative_recall(2, 3, generator=0)


# -- bad arguments -----------------------------------------------------------------------------------
q4, k4, v4 = _qkv(dtype=torch.float32)
beta4 = torch.rand(2, 2, 7)
la_module = LinearAttention(8, 2)
dn_module = DeltaNetAttention(8, 2)

BAD = [
    ("la: 3-D q", lambda: linear_attention(q4[0], k4, v4), ValueError, r"q must have shape \(B, H, length, width\)"),
    ("la: list", lambda: linear_attention([[1.0]], k4, v4), TypeError, "q must be a torch.Tensor"),
    ("la: ints", lambda: linear_attention(q4.long(), k4.long(), v4.long()), TypeError, "q must be a floating-point"),
    ("la: widths differ", lambda: linear_attention(q4, k4[..., :2], v4), ValueError, r"q and k must have the same width"),
    ("la: lengths differ", lambda: linear_attention(q4, k4, v4[:, :, :3]), ValueError, r"k and v must have the same length"),
    ("la: heads differ", lambda: linear_attention(q4, k4[:, :1], v4[:, :1]), ValueError, "share B and H"),
    ("la: causal L != S", lambda: linear_attention(q4[:, :, :3], k4, v4), ValueError, "causal=False"),
    ("la: dtypes", lambda: linear_attention(q4, k4.double(), v4), TypeError, "float64"),
    ("la: unknown map", lambda: linear_attention(q4, k4, v4, feature_map="softmax"), ValueError, "feature_map.*softmax"),
    ("la: map not callable", lambda: linear_attention(q4, k4, v4, feature_map=3), TypeError, "feature_map.*int"),
    ("la: identity normalised", lambda: linear_attention(q4, k4, v4, feature_map="identity", normalize=True), ValueError, "normalize=True"),
    ("la: normalize string", lambda: linear_attention(q4, k4, v4, normalize="yes"), TypeError, "normalize"),
    ("la: method", lambda: linear_attention(q4, k4, v4, method="chunked"), ValueError, "method.*chunked"),
    ("la: recurrent non-causal", lambda: linear_attention(q4, k4, v4, causal=False, method="recurrent"), ValueError, "causal=False"),
    ("la: eps negative", lambda: linear_attention(q4, k4, v4, eps=-1.0), ValueError, "eps.*-1"),
    ("la: eps string", lambda: linear_attention(q4, k4, v4, eps="1e-6"), TypeError, "eps"),
    ("la: causal not bool", lambda: linear_attention(q4, k4, v4, causal=1), TypeError, "causal"),
    ("la: state not a state", lambda: linear_attention(q4, k4, v4, initial_state=torch.zeros(2, 2, 3, 4)), TypeError, "LinearAttentionState"),
    ("la: state wrong shape", lambda: linear_attention(q4, k4, v4, initial_state=LinearAttentionState(torch.zeros(2, 2, 4, 4), torch.zeros(2, 2, 3))),
     ValueError, r"state.S must have shape \(2, 2, 3, 4\)"),
    ("la: state non-causal", lambda: linear_attention(q4, k4, v4, causal=False, initial_state=LinearAttentionState(torch.zeros(2, 2, 3, 4), torch.zeros(2, 2, 3))),
     ValueError, "initial_state"),
    ("la: map shape", lambda: linear_attention(q4, k4, v4, feature_map=lambda x: x.sum()), ValueError, "feature_map must map"),
    ("step: 4-D", lambda: linear_attention_step(q4, k4, v4), ValueError, r"q_t must have shape \(B, H, width\)"),
    ("step: v batch", lambda: linear_attention_step(q4[:, :, 0], k4[:, :, 0], v4[:1, :, 0]), ValueError, "v_t"),
    ("delta: beta shape", lambda: delta_rule(q4, k4, v4, torch.rand(2, 2, 6)), ValueError, r"beta must have shape \(B, H, L\)"),
    ("delta: beta 4-D", lambda: delta_rule(q4, k4, v4, beta4[..., None]), ValueError, r"beta must have shape"),
    ("delta: beta string", lambda: delta_rule(q4, k4, v4, "0.5"), TypeError, "beta must be a torch.Tensor"),
    ("delta: beta dtype", lambda: delta_rule(q4, k4, v4, beta4.double()), TypeError, "beta has dtype torch.float64"),
    ("delta: gate shape", lambda: delta_rule(q4, k4, v4, beta4, gate=torch.rand(3)), ValueError, "gate must have shape"),
    ("delta: chunk 0", lambda: delta_rule(q4, k4, v4, beta4, chunk_size=0), ValueError, "chunk_size.*0"),
    ("delta: chunk float", lambda: delta_rule(q4, k4, v4, beta4, chunk_size=2.0), TypeError, "chunk_size.*float"),
    ("delta: state shape", lambda: delta_rule(q4, k4, v4, beta4, initial_state=torch.zeros(2, 2, 4, 3)), ValueError,
     r"initial_state must have shape \(2, 2, 3, 4\)"),
    ("delta: L != S", lambda: delta_rule(q4[:, :, :3], k4, v4, beta4), ValueError, "as many queries as keys"),
    ("delta step: state", lambda: delta_rule_step(q4[:, :, 0], k4[:, :, 0], v4[:, :, 0], 1.0, torch.zeros(2, 2, 3)), ValueError,
     r"state must have shape \(2, 2, 3, 4\)"),
    ("delta step: beta_t", lambda: delta_rule_step(q4[:, :, 0], k4[:, :, 0], v4[:, :, 0], beta4), ValueError, r"beta_t must have shape \(B, H\)"),
    ("module: heads", lambda: LinearAttention(10, 3), ValueError, r"embed_dim=10.*num_heads=3"),
    ("module: map", lambda: LinearAttention(8, 2, feature_map="cosine"), ValueError, "feature_map.*cosine"),
    ("module: identity normalised", lambda: LinearAttention(8, 2, feature_map="identity", normalize=True), ValueError, "normalize"),
    ("module: qk_head_dim", lambda: DeltaNetAttention(8, 2, qk_head_dim=0), ValueError, "qk_head_dim"),
    ("module: use_gate", lambda: DeltaNetAttention(8, 2, use_gate="yes"), TypeError, "use_gate"),
    ("module: chunk_size", lambda: DeltaNetAttention(8, 2, chunk_size=-4), ValueError, "chunk_size.*-4"),
    ("module: x width", lambda: la_module(torch.randn(2, 3, 6)), ValueError, r"E=8.*\(2, 3, 6\)"),
    ("module: x dtype", lambda: dn_module(torch.randn(2, 3, 8, dtype=torch.float64)), TypeError, "float64"),
    ("module: state type", lambda: la_module.forward_cached(torch.randn(2, 1, 8), torch.zeros(2, 2, 4, 4)), TypeError, "LinearAttentionState"),
    ("module: state batch", lambda: dn_module.forward_cached(torch.randn(2, 1, 8), dn_module.new_state(3)), ValueError,
     r"state must have shape \(2, 2, 4, 4\)"),
    ("module: batch 0", lambda: dn_module.new_state(0), ValueError, "batch_size"),
]


@pytest.mark.parametrize("call, error, pattern", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_arguments_raise_clear_errors(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()


# -- in the decoder-only model ------------------------------------------------------------------------
MODEL_KINDS = [
    ("linear", {}),
    ("delta", {}),
    ("gated_delta", {}),
    (["gated_delta", "gated_delta", "mha"], {}),  # a hybrid: two delta-rule layers, then one softmax layer
    (["linear", "gqa", "delta"], dict(num_kv_heads=2, position="rotary")),
    (["delta", "mla", "delta"], dict(kv_latent_dim=8)),
]


@pytest.mark.parametrize("attention, options", MODEL_KINDS, ids=[str(a) for a, _ in MODEL_KINDS])
def test_decoder_only_lm_cached_equals_uncached(attention, options, device):
    torch.manual_seed(0)
    model = ac.DecoderOnlyLM(17, d_model=16, num_heads=4, num_layers=3, d_ff=32, max_len=20, attention=attention,
                             **options).to(device=device, dtype=torch.float64).eval()
    kinds = [attention] * 3 if isinstance(attention, str) else attention
    for layer, kind in zip(model.layers, kinds):
        attn = layer.self_attn
        if kind == "linear":
            assert isinstance(attn, LinearAttention)
        elif kind in ("delta", "gated_delta"):
            assert isinstance(attn, DeltaNetAttention) and attn.use_gate == (kind == "gated_delta")
        else:
            assert not isinstance(attn, (LinearAttention, DeltaNetAttention))
    tokens = torch.randint(0, 17, (2, 9), device=device)
    full = model(tokens)
    cache = model.new_cache(2)
    assert isinstance(cache, ac.decoder.RecurrentCache)
    outputs = [model.forward_cached(tokens[:, :4], cache)]  # a prompt, then one token at a time
    bytes_after_prompt = cache.nbytes
    outputs += [model.forward_cached(tokens[:, t:t + 1], cache) for t in range(4, 9)]
    assert cache.length == 9 and cache.nbytes == bytes_after_prompt  # states do not grow (softmax caches are preallocated)
    torch.testing.assert_close(torch.cat(outputs, dim=1), full, **F64)
    prompt = tokens[:, :3]
    assert torch.equal(ac.generate(model, prompt, 8), ac.generate(model, prompt, 8, use_cache=False))


def test_decoder_only_lm_recurrent_states_are_smaller_than_a_cache():
    common = dict(vocab_size=11, d_model=32, num_heads=4, num_layers=4, d_ff=32, max_len=512)
    softmax = ac.DecoderOnlyLM(**common).new_cache(1).nbytes
    delta = ac.DecoderOnlyLM(**common, attention="delta").new_cache(1).nbytes
    hybrid = ac.DecoderOnlyLM(**common, attention=["delta"] * 3 + ["mha"]).new_cache(1).nbytes
    assert delta == 4 * 4 * 8 * 8 * 4  # 4 layers of 4 heads of (D_k, D) = (8, 8), float32
    assert hybrid == 3 * 4 * 8 * 8 * 4 + softmax // 4  # one softmax layer keeps its keys and values
    assert delta < hybrid < softmax


MODEL_BAD = [
    ("two lists", lambda: ac.DecoderOnlyLM(10, num_layers=2, attention=["delta"]), ValueError, "one kind per layer"),
    ("unknown kind", lambda: ac.DecoderOnlyLM(10, num_layers=2, attention=["delta", "flash"]), ValueError, "flash"),
    ("two softmax kinds", lambda: ac.DecoderOnlyLM(10, num_layers=2, attention=["mha", "gqa"], num_kv_heads=2), ValueError,
     "one softmax kind"),
    ("not a list", lambda: ac.DecoderOnlyLM(10, attention=3), TypeError, "attention"),
    ("rotary without softmax", lambda: ac.DecoderOnlyLM(10, attention="linear", position="rotary"), ValueError, "rotary"),
    ("kv heads without softmax", lambda: ac.DecoderOnlyLM(10, attention="delta", num_kv_heads=2), ValueError, "num_kv_heads"),
    ("gqa hybrid needs kv heads", lambda: ac.DecoderOnlyLM(10, num_layers=2, attention=["delta", "gqa"]), ValueError, "num_kv_heads"),
    ("a KV cache for a linear model", lambda: ac.DecoderOnlyLM(10, attention="linear").forward_cached(
        torch.zeros(1, 2, dtype=torch.long), ac.KVCache(2, 1, 4, 16, 8)), TypeError, "RecurrentCache"),
    ("absorb without mla", lambda: ac.generate(ac.DecoderOnlyLM(10, attention="delta"), torch.zeros(1, 2, dtype=torch.long), 2,
                                               absorb=True), ValueError, "mla"),
]


@pytest.mark.parametrize("call, error, pattern", [c[1:] for c in MODEL_BAD], ids=[c[0] for c in MODEL_BAD])
def test_decoder_only_lm_rejects_bad_attention_choices(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()
