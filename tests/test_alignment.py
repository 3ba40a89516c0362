"""AdditiveAttention (Bahdanau) and DotProductAttention (Luong) against direct formulas and PyTorch."""

import pytest
import torch
import torch.nn.functional as F

import attn_course as ac


pytestmark = pytest.mark.usefixtures("one_thread")

SHAPES = [
    # (B, L, S, Dq, Dk, Dv): L = None means one decoder step, a (B, Dq) query
    (2, None, 5, 6, 6, 6),
    (3, None, 1, 4, 4, 7),
    (2, 4, 5, 6, 6, 3),
    (1, 1, 7, 8, 8, 8),
    (4, 3, 2, 5, 5, 5),
]


def _tol(dtype):
    return {torch.float64: dict(atol=1e-10, rtol=1e-8), torch.float32: dict(atol=2e-6, rtol=1e-5),
            torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}[dtype]


def _inputs(B, L, S, Dq, Dk, Dv, *, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(B, Dq, generator=g, dtype=torch.float64) if L is None else torch.randn(B, L, Dq, generator=g, dtype=torch.float64)
    keys = torch.randn(B, S, Dk, generator=g, dtype=torch.float64)
    values = torch.randn(B, S, Dv, generator=g, dtype=torch.float64)
    return [t.to(device=device, dtype=dtype) for t in (query, keys, values)]


def _padding(B, S, device="cpu", seed=0):
    """Right padding with random lengths in 1..S (every row keeps at least one key)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    return (torch.arange(S)[None, :] >= lengths[:, None]).to(device)  # (B, S), True at padding


def _additive_by_hand(module, query, keys, values, key_padding_mask=None):
    """v^T tanh(W s + U h_j), softmax over j, weighted average of the values, in float64."""
    W, U, v = (m.weight.detach().double() for m in (module.W, module.U, module.v))
    q = query.double() if query.dim() == 3 else query.double()[:, None]  # (B, L, Dq)
    hidden = torch.tanh((q @ W.T)[:, :, None, :] + (keys.double() @ U.T)[:, None, :, :])  # (B, L, S, A)
    scores = (hidden @ v.T)[..., 0]  # (B, L, S)
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, :], float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    context = weights @ values.double()  # (B, L, Dv)
    return (context, weights) if query.dim() == 3 else (context[:, 0], weights[:, 0])


# --- shapes ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("kind", ["additive", "dot"])
def test_shapes_and_weights_sum_to_one(shape, kind, device):
    B, L, S, Dq, Dk, Dv = shape
    query, keys, values = _inputs(*shape, device=device)
    module = (ac.AdditiveAttention(Dq, Dk, 9) if kind == "additive" else ac.DotProductAttention()).to(device)
    context, weights = module(query, keys, values)
    lead = (B,) if L is None else (B, L)
    assert context.shape == (*lead, Dv) and weights.shape == (*lead, S)
    assert context.device == query.device and weights.device == query.device
    assert bool((weights >= 0).all())
    torch.testing.assert_close(weights.sum(-1), torch.ones(lead, device=device))
    # Without values, the keys are averaged.
    context_keys, _ = module(query, keys)
    assert context_keys.shape == (*lead, Dk)
    expected = (weights[:, None, :] @ keys)[:, 0] if L is None else weights @ keys  # (B, 1, S) @ (B, S, Dk)
    torch.testing.assert_close(context_keys, expected)


@pytest.mark.parametrize("kind", ["additive", "dot"])
def test_one_step_query_equals_a_sequence_of_length_one(kind):
    query, keys, values = _inputs(3, None, 6, 5, 5, 4, seed=3)
    module = ac.AdditiveAttention(5, 5, 7) if kind == "additive" else ac.DotProductAttention()
    context_step, weights_step = module(query, keys, values)
    context_seq, weights_seq = module(query[:, None, :], keys, values)  # (B, 1, Dq)
    torch.testing.assert_close(context_step, context_seq[:, 0])
    torch.testing.assert_close(weights_step, weights_seq[:, 0])


# --- against direct computations and PyTorch ----------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_additive_matches_the_formula(shape, masked, dtype, device):
    B, L, S, Dq, Dk, Dv = shape
    query, keys, values = _inputs(*shape, dtype=dtype, device=device, seed=1)
    module = ac.AdditiveAttention(Dq, Dk, 9).to(device=device, dtype=dtype)
    mask = _padding(B, S, device) if masked else None
    context, weights = module(query, keys, values, key_padding_mask=mask)
    want_context, want_weights = _additive_by_hand(module, query, keys, values, mask)
    assert context.dtype == dtype and weights.dtype == dtype
    torch.testing.assert_close(weights.double(), want_weights, **_tol(dtype))
    torch.testing.assert_close(context.double(), want_context, **_tol(dtype))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_dot_matches_softmax_q_kT_v_and_torch_sdpa_with_scale_one(shape, masked, dtype, device):
    B, L, S, Dq, Dk, Dv = shape
    query, keys, values = _inputs(*shape, dtype=dtype, device=device, seed=2)
    mask = _padding(B, S, device, seed=4) if masked else None
    context, weights = ac.DotProductAttention()(query, keys, values, key_padding_mask=mask)
    assert context.dtype == dtype and weights.dtype == dtype
    q = query.double() if L is not None else query.double()[:, None]  # (B, L, D)
    scores = q @ keys.double().transpose(1, 2)  # (B, L, S)
    if mask is not None:
        scores = scores.masked_fill(mask[:, None, :], float("-inf"))
    want_weights = torch.softmax(scores, dim=-1)
    want_context = want_weights @ values.double()
    sdpa = F.scaled_dot_product_attention(q, keys.double(), values.double(), scale=1.0,
                                          attn_mask=None if mask is None else ~mask[:, None, :])  # True = takes part
    torch.testing.assert_close(want_context, sdpa)
    if L is None:
        want_context, want_weights = want_context[:, 0], want_weights[:, 0]
    torch.testing.assert_close(weights.double(), want_weights, **_tol(dtype))
    torch.testing.assert_close(context.double(), want_context, **_tol(dtype))


# --- padding ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["additive", "dot"])
def test_padding_gets_zero_weight_and_matches_the_unpadded_keys(kind, device):
    B, S, D = 3, 6, 5
    query, keys, values = _inputs(B, 2, S, D, D, 4, device=device, seed=5)
    module = (ac.AdditiveAttention(D, D, 8) if kind == "additive" else ac.DotProductAttention()).to(device)
    lengths = [6, 3, 1]
    mask = torch.arange(S, device=device)[None, :] >= torch.tensor(lengths, device=device)[:, None]  # (B, S)
    context, weights = module(query, keys, values, key_padding_mask=mask)
    assert bool((weights.masked_select(mask[:, None, :].expand_as(weights)) == 0).all())
    for b, n in enumerate(lengths):  # each row alone, cut to its real length
        context_b, weights_b = module(query[b:b + 1], keys[b:b + 1, :n], values[b:b + 1, :n])
        torch.testing.assert_close(context[b:b + 1], context_b)
        torch.testing.assert_close(weights[b:b + 1, :, :n], weights_b)


@pytest.mark.parametrize("kind", ["additive", "dot"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_fully_padded_row_gives_zeros_not_nan_and_finite_gradients(kind, dtype, device):
    B, S, D = 2, 4, 6
    query, keys, values = _inputs(B, None, S, D, D, 3, dtype=dtype, device=device, seed=6)
    for t in (query, keys, values):
        t.requires_grad_(True)
    module = (ac.AdditiveAttention(D, D, 5) if kind == "additive" else ac.DotProductAttention()).to(device=device, dtype=dtype)
    mask = torch.zeros(B, S, dtype=torch.bool, device=device)
    mask[1] = True  # the second row has nothing to attend to
    context, weights = module(query, keys, values, key_padding_mask=mask)
    assert not bool(torch.isnan(context).any()) and not bool(torch.isnan(weights).any())
    assert bool((context[1] == 0).all()) and bool((weights[1] == 0).all())
    torch.testing.assert_close(weights[0].double().sum(), torch.tensor(1.0, dtype=torch.float64, device=device), **_tol(dtype))
    context.double().sum().backward()
    for name, t in (("query", query), ("keys", keys), ("values", values)):
        assert t.grad is not None and bool(torch.isfinite(t.grad).all()), f"{name} has a non-finite gradient"
    assert bool((values.grad[1] == 0).all())  # nothing flows through the empty row


# --- gradients ----------------------------------------------------------------------------------------

def test_additive_gradcheck_and_every_parameter_learns():
    query, keys, values = _inputs(2, 3, 4, 5, 6, 3, dtype=torch.float64, seed=7)
    module = ac.AdditiveAttention(5, 6, 4).double()
    mask = torch.tensor([[False, False, True, True], [False, False, False, False]])
    assert torch.autograd.gradcheck(lambda q, k, v: module(q, k, v, key_padding_mask=mask),
                                    (query.requires_grad_(), keys.requires_grad_(), values.requires_grad_()))
    context, _ = module(query, keys, values, key_padding_mask=mask)
    context.square().sum().backward()
    for name, parameter in module.named_parameters():
        assert parameter.grad is not None and float(parameter.grad.abs().sum()) > 0, f"{name} got no gradient"


def test_dot_gradcheck():
    query, keys, values = _inputs(2, None, 5, 4, 4, 3, dtype=torch.float64, seed=8)
    mask = torch.tensor([[False, False, False, True, True], [False] * 5])
    assert torch.autograd.gradcheck(lambda q, k, v: ac.DotProductAttention()(q, k, v, key_padding_mask=mask),
                                    (query.requires_grad_(), keys.requires_grad_(), values.requires_grad_()))
    assert list(ac.DotProductAttention().parameters()) == []


# --- bad input --------------------------------------------------------------------------------------

_q, _k, _v = torch.randn(2, 4), torch.randn(2, 3, 4), torch.randn(2, 3, 5)
BAD = [
    ("query not a tensor", lambda m: m([[0.0] * 4] * 2, _k), TypeError, r"query.*list"),
    ("integer query", lambda m: m(_q.long(), _k), TypeError, r"query.*int64"),
    ("integer keys", lambda m: m(_q, _k.long()), TypeError, r"keys.*int64"),
    ("1-D query", lambda m: m(torch.randn(4), _k), ValueError, r"query.*\(4,\)"),
    ("4-D query", lambda m: m(torch.randn(2, 1, 1, 4), _k), ValueError, r"query.*\(2, 1, 1, 4\)"),
    ("2-D keys", lambda m: m(_q, torch.randn(3, 4)), ValueError, r"keys.*\(3, 4\)"),
    ("batch mismatch", lambda m: m(_q, torch.randn(5, 3, 4)), ValueError, r"batch.*\(2, 4\).*\(5, 3, 4\)"),
    ("values length", lambda m: m(_q, _k, torch.randn(2, 2, 5)), ValueError, r"values.*\(2, 2, 5\)"),
    ("values integer", lambda m: m(_q, _k, _v.long()), TypeError, r"values.*int64"),
    ("mask not bool", lambda m: m(_q, _k, key_padding_mask=torch.zeros(2, 3)), TypeError, r"key_padding_mask.*float32"),
    ("mask shape", lambda m: m(_q, _k, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool)), ValueError, r"key_padding_mask.*\(2, 3\).*\(2, 4\)"),
    ("mask not a tensor", lambda m: m(_q, _k, key_padding_mask=[[True] * 3] * 2), TypeError, r"key_padding_mask.*list"),
]


@pytest.mark.parametrize("kind", ["additive", "dot"])
@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_names_the_argument(kind, case):
    _, call, error, pattern = case
    module = ac.AdditiveAttention(4, 4, 3) if kind == "additive" else ac.DotProductAttention()
    with pytest.raises(error, match=pattern):
        call(module)


@pytest.mark.parametrize("case", [
    (lambda: ac.AdditiveAttention(4, 6, 3)(torch.randn(2, 5), torch.randn(2, 3, 6)), ValueError, r"query_dim=4.*\(2, 5\)"),
    (lambda: ac.AdditiveAttention(4, 6, 3)(torch.randn(2, 4), torch.randn(2, 3, 5)), ValueError, r"key_dim=6.*\(2, 3, 5\)"),
    (lambda: ac.AdditiveAttention(0, 6, 3), ValueError, r"query_dim.*0"),
    (lambda: ac.AdditiveAttention(4, 6.0, 3), TypeError, r"key_dim.*float"),
    (lambda: ac.AdditiveAttention(4, 6, -1), ValueError, r"hidden_dim.*-1"),
    (lambda: ac.DotProductAttention()(torch.randn(2, 4), torch.randn(2, 3, 6)), ValueError, r"\(2, 4\).*\(2, 3, 6\)"),
], ids=["additive query width", "additive key width", "zero query_dim", "float key_dim", "negative hidden_dim", "dot widths"])
def test_bad_widths_name_the_argument(case):
    call, error, pattern = case
    with pytest.raises(error, match=pattern):
        call()
