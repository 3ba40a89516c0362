"""attn_course.masks against PyTorch's own mask conventions.

The package's masks are "True = may attend", as F.scaled_dot_product_attention reads them; after
allowed_to_blocked they are "True = blocked", as nn.MultiheadAttention reads them. Both routes must
give the same attention.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import attn_course as ac


def _by_loops_causal(L, S, offset=0):
    return torch.tensor([[j <= i + offset for j in range(S)] for i in range(L)], dtype=torch.bool).reshape(L, S)


def _by_loops_padding(lengths, S, side="right"):
    rows = [[(j < n) if side == "right" else (j >= S - n) for j in range(S)] for n in lengths]
    return torch.tensor(rows, dtype=torch.bool).reshape(len(lengths), S)


def _qkv(B, H, L, S, D, dtype=torch.float64, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, n, D, generator=g, dtype=torch.float64).to(device=device, dtype=dtype) for n in (L, S, S)]


# --- causal_mask ---------------------------------------------------------------------------------

@pytest.mark.parametrize("L, S", [(0, 0), (1, 1), (4, 4), (3, 6), (6, 3)])
def test_causal_mask_is_the_lower_triangle(L, S, device):
    mask = ac.causal_mask(L, S, device=device)
    assert mask.dtype == torch.bool and mask.shape == (L, S) and mask.device.type == device.type
    assert torch.equal(mask.cpu(), _by_loops_causal(L, S))
    assert torch.equal(ac.causal_mask(L, device=device).cpu(), _by_loops_causal(L, L))


@pytest.mark.parametrize("L, S", [(1, 1), (5, 5), (3, 7), (7, 3)])
def test_causal_mask_equals_is_causal_in_torch_sdpa(L, S, device):
    q, k, v = _qkv(2, 3, L, S, 4, device=device)
    with_mask = F.scaled_dot_product_attention(q, k, v, attn_mask=ac.causal_mask(L, S, device=device))
    torch.testing.assert_close(with_mask, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    ours, _ = ac.scaled_dot_product_attention(q, k, v, attn_mask=ac.causal_mask(L, S, device=device))
    torch.testing.assert_close(ours, with_mask)


@pytest.mark.parametrize("L, S", [(1, 5), (2, 5), (4, 4), (3, 8)])
def test_bottom_right_alignment_matches_torch_causal_lower_right(L, S, device):
    from torch.nn.attention.bias import causal_lower_right

    mask = ac.causal_mask(L, S, align="bottom_right", device=device)
    assert torch.equal(mask.cpu(), _by_loops_causal(L, S, offset=S - L))
    assert bool(mask[-1].all()), "the last query must see every key"
    q, k, v = _qkv(1, 2, L, S, 4, device=device)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(L, S))
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=mask), expected)


def test_the_two_alignments_agree_for_square_masks():
    assert torch.equal(ac.causal_mask(5, align="top_left"), ac.causal_mask(5, align="bottom_right"))
    assert not torch.equal(ac.causal_mask(2, 5, align="top_left"), ac.causal_mask(2, 5, align="bottom_right"))


# --- padding_mask --------------------------------------------------------------------------------

@pytest.mark.parametrize("lengths, max_len", [([3, 1, 4], None), ([2, 2], 5), ([0, 3], None), ([0], 2), ([], 3), ([1], None)])
@pytest.mark.parametrize("side", ["right", "left"])
def test_padding_mask_marks_the_real_tokens(lengths, max_len, side, device):
    S = max_len if max_len is not None else max(lengths, default=0)
    from_list = ac.padding_mask(lengths, max_len, side=side, device=device)
    from_tensor = ac.padding_mask(torch.tensor(lengths, dtype=torch.long, device=device), max_len, side=side)
    expected = _by_loops_padding(lengths, S, side)
    for mask in (from_list, from_tensor):
        assert mask.dtype == torch.bool and mask.shape == (len(lengths), S) and mask.device.type == device.type
        assert torch.equal(mask.cpu(), expected)
        assert mask.sum(-1).tolist() == list(lengths)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
def test_padding_mask_accepts_integer_tensors(dtype):
    assert torch.equal(ac.padding_mask(torch.tensor([2, 1], dtype=dtype)), torch.tensor([[True, True], [True, False]]))


# --- combine_masks -------------------------------------------------------------------------------

@pytest.mark.parametrize("lengths", [[3, 1, 2], [4, 4, 4, 4], [1, 2]], ids=str)  # [4, 4, 4, 4]: B == L
def test_combine_causal_and_padding_masks_keys_not_queries(lengths):
    T = 4 if max(lengths) == 4 else 3
    combined = ac.combine_masks(ac.causal_mask(T), padding=ac.padding_mask(lengths, T))
    expected = torch.tensor(
        [[[j <= i and j < n for j in range(T)] for i in range(T)] for n in lengths], dtype=torch.bool
    )
    assert combined.shape == (len(lengths), T, T)
    assert torch.equal(combined, expected)


def test_combine_masks_puts_padding_on_the_key_axis_of_4d_masks():
    B, H, L, S = 2, 3, 4, 5
    head_mask = torch.rand(B, H, L, S, generator=torch.Generator().manual_seed(0)) > 0.3
    padding = ac.padding_mask([5, 2])
    combined = ac.combine_masks(head_mask, padding=padding)
    assert combined.shape == (B, H, L, S)
    assert torch.equal(combined, head_mask & padding[:, None, None, :])


def test_combine_masks_with_none_and_single_masks():
    causal = ac.causal_mask(3)
    assert ac.combine_masks() is None
    assert ac.combine_masks(None, None) is None
    assert torch.equal(ac.combine_masks(causal, None), causal)
    padding = ac.padding_mask([2, 3])
    assert torch.equal(ac.combine_masks(padding=padding), padding[:, None, :])
    window = ~ac.causal_mask(3).T | ac.causal_mask(3)  # all True
    assert torch.equal(ac.combine_masks(causal, window), causal)


def test_combine_masks_refuses_a_positional_padding_mask_that_does_not_broadcast():
    with pytest.raises(ValueError, match="padding="):
        ac.combine_masks(ac.causal_mask(3), ac.padding_mask([1, 2]))  # (3, 3) & (2, 3)


# --- allowed_to_blocked and blocked_to_additive --------------------------------------------------

def test_allowed_to_blocked_is_its_own_inverse():
    mask = ac.combine_masks(ac.causal_mask(4), padding=ac.padding_mask([4, 2]))
    blocked = ac.allowed_to_blocked(mask)
    assert torch.equal(blocked, ~mask)
    assert torch.equal(ac.allowed_to_blocked(blocked), mask)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_additive_mask_gives_the_same_attention_as_the_bool_mask(dtype, device):
    allowed = ac.combine_masks(ac.causal_mask(4), padding=ac.padding_mask([4, 3]))[:, None]  # (B, 1, L, S)
    additive = ac.blocked_to_additive(ac.allowed_to_blocked(allowed), dtype=dtype)
    assert additive.dtype == dtype and additive.device == allowed.device
    assert bool(torch.isneginf(additive[~allowed]).all()) and bool((additive[allowed] == 0).all())
    q, k, v = _qkv(2, 2, 4, 4, 8, dtype=torch.float32, device=device)
    tol = dict(atol=2e-2, rtol=2e-2) if dtype in (torch.bfloat16, torch.float16) else {}
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed.to(device))
    got = F.scaled_dot_product_attention(q, k, v, attn_mask=additive.to(device=device, dtype=torch.float32))
    torch.testing.assert_close(got, expected, **tol)
    ours, _ = ac.scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype), attn_mask=additive.to(device))
    torch.testing.assert_close(ours.float(), expected, **(tol or dict(atol=1e-5, rtol=1e-5)))


# --- the two conventions: F.scaled_dot_product_attention vs nn.MultiheadAttention ---------------

def _mha_through_sdpa(mha: nn.MultiheadAttention, x: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """nn.MultiheadAttention's computation written with F.scaled_dot_product_attention (allowed masks)."""
    B, T, E = x.shape
    H = mha.num_heads
    D = E // H
    q, k, v = F.linear(x, mha.in_proj_weight, mha.in_proj_bias).chunk(3, dim=-1)  # 3 x (B, T, E)
    q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))  # (B, T, E) -> (B, H, T, D)
    if allowed is not None and allowed.dim() == 3:
        allowed = allowed[:, None]  # (B, L, S) -> (B, 1, L, S), the same for every head
    context = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)  # (B, H, T, D)
    return mha.out_proj(context.transpose(1, 2).reshape(B, T, E))  # (B, H, T, D) -> (B, T, E)


MASK_KINDS = ["causal", "padding", "causal+padding", "left_padding", "random"]


def _masks(kind, B, T, device):
    """(allowed mask for F.sdpa, kwargs for nn.MultiheadAttention in its own blocked convention)."""
    lengths = [T, max(1, T - 2), 1][:B]
    if kind == "causal":
        causal = ac.causal_mask(T, device=device)
        return causal, dict(attn_mask=ac.allowed_to_blocked(causal))
    if kind == "padding":
        padding = ac.padding_mask(lengths, T, device=device)
        return ac.combine_masks(padding=padding), dict(key_padding_mask=ac.allowed_to_blocked(padding))
    if kind == "causal+padding":
        causal, padding = ac.causal_mask(T, device=device), ac.padding_mask(lengths, T, device=device)
        return ac.combine_masks(causal, padding=padding), dict(
            attn_mask=ac.allowed_to_blocked(causal), key_padding_mask=ac.allowed_to_blocked(padding)
        )
    if kind == "left_padding":  # no causal mask, so no query is left with nothing to attend to
        padding = ac.padding_mask(lengths, T, side="left", device=device)
        return ac.combine_masks(padding=padding), dict(key_padding_mask=ac.allowed_to_blocked(padding))
    random = torch.rand(T, T, generator=torch.Generator().manual_seed(3)) > 0.5
    random[:, 0] = True  # every query keeps one key (nn.MultiheadAttention gives NaN otherwise)
    random = random.to(device)
    return random, dict(attn_mask=ac.allowed_to_blocked(random))


@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("B, T, E, H", [(3, 5, 8, 2), (2, 4, 6, 1)])
def test_sdpa_with_allowed_masks_equals_multihead_with_blocked_masks(kind, dtype, B, T, E, H, device):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(E, H, batch_first=True).to(device=device, dtype=dtype).eval()
    x = torch.randn(B, T, E, device=device, dtype=dtype)
    allowed, torch_kwargs = _masks(kind, B, T, device)
    expected, _ = mha(x, x, x, **torch_kwargs)
    tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else {}
    torch.testing.assert_close(_mha_through_sdpa(mha, x, allowed), expected, **tol)
    # The package's multi-head attention, which takes nn.MultiheadAttention's convention.
    ours, _ = ac.MultiHeadAttention.from_torch(mha)(x, x, x, **torch_kwargs)
    torch.testing.assert_close(ours, expected, **tol)


@pytest.mark.parametrize("kind", ["padding", "causal+padding", "random"])
def test_mixing_up_the_conventions_gives_a_different_answer(kind):
    """Passing an allowed mask where a blocked one is expected raises nothing: it attends elsewhere."""
    torch.manual_seed(1)
    B, T, E = 3, 5, 8
    mha = nn.MultiheadAttention(E, 2, batch_first=True).eval()
    x = torch.randn(B, T, E)
    allowed, torch_kwargs = _masks(kind, B, T, "cpu")
    right, _ = mha(x, x, x, **torch_kwargs)
    wrong_kwargs = {name: ac.allowed_to_blocked(m) for name, m in torch_kwargs.items()}  # back to "allowed"
    wrong, _ = mha(x, x, x, **wrong_kwargs)
    finite = torch.isfinite(wrong).all(dim=-1)
    assert bool(finite.any()), "some rows come out finite, so the mistake is easy to miss"
    assert not torch.allclose(wrong[finite], right[finite], atol=1e-3)


# --- what masks are for: no leaks, no NaN --------------------------------------------------------

@pytest.mark.parametrize("position", [0, 2, 5])
def test_causal_mask_stops_the_future_from_leaking(position, device):
    torch.manual_seed(2)
    T, E = 7, 6
    attention = ac.SelfAttention(E, E).to(device)
    x = torch.randn(1, T, E, device=device)
    changed = x.clone()
    changed[:, position + 1:] = torch.randn(1, T - position - 1, E, device=device)
    mask = ac.causal_mask(T, device=device)
    before, _ = attention(x, attn_mask=mask)
    after, _ = attention(changed, attn_mask=mask)
    torch.testing.assert_close(after[:, : position + 1], before[:, : position + 1], atol=0, rtol=0)
    if position < T - 1:
        assert not torch.allclose(after[:, position + 1:], before[:, position + 1:])
        unmasked_before, _ = attention(x)
        unmasked_after, _ = attention(changed)
        assert not torch.allclose(unmasked_after[:, : position + 1], unmasked_before[:, : position + 1])


def test_left_padding_with_causal_leaves_rows_with_nothing_to_attend_and_the_package_gives_zeros(device):
    lengths, T = [4, 2], 4
    allowed = ac.combine_masks(ac.causal_mask(T, device=device), padding=ac.padding_mask(lengths, T, side="left", device=device))
    empty_rows = ~allowed.any(dim=-1)  # (B, L)
    assert empty_rows.tolist() == [[False] * 4, [True, True, False, False]]
    q, k, v = _qkv(2, 1, T, T, 3, dtype=torch.float32, device=device)
    q, k, v = (t[:, 0].requires_grad_() for t in (q, k, v))  # (B, T, D)
    out, weights = ac.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    assert bool((out[empty_rows] == 0).all()) and bool((weights[empty_rows] == 0).all())
    assert bool(torch.isfinite(out).all())
    out.sum().backward()
    assert all(bool(torch.isfinite(t.grad).all()) for t in (q, k, v))
    naive = torch.softmax((q @ k.transpose(-2, -1)).masked_fill(~allowed, float("-inf")), dim=-1)
    assert bool(torch.isnan(naive[empty_rows]).all()), "a naive softmax gives NaN on those rows"


# --- bad input -----------------------------------------------------------------------------------

BAD_INPUT = [
    ("causal: str length", lambda: ac.causal_mask("3"), TypeError, "query_len"),
    ("causal: bool length", lambda: ac.causal_mask(True), TypeError, "query_len"),
    ("causal: negative key_len", lambda: ac.causal_mask(3, -1), ValueError, "key_len.*-1"),
    ("causal: align", lambda: ac.causal_mask(3, align="lower_right"), ValueError, "align.*lower_right"),
    ("padding: floats", lambda: ac.padding_mask([1.5, 2]), TypeError, "lengths"),
    ("padding: float tensor", lambda: ac.padding_mask(torch.tensor([1.0, 2.0])), ValueError, "lengths.*float32"),
    ("padding: 2-D", lambda: ac.padding_mask(torch.tensor([[1, 2]])), ValueError, r"lengths.*\(1, 2\)"),
    ("padding: side", lambda: ac.padding_mask([1, 2], side="middle"), ValueError, "side.*middle"),
    ("padding: max_len", lambda: ac.padding_mask([1, 2], max_len=1.5), TypeError, "max_len"),
    ("combine: int mask", lambda: ac.combine_masks(torch.ones(2, 2, dtype=torch.int64)), TypeError, r"masks\[0\].*int64"),
    ("combine: not a tensor", lambda: ac.combine_masks([[True]]), TypeError, r"masks\[0\].*list"),
    ("combine: no broadcast", lambda: ac.combine_masks(ac.causal_mask(3), ac.causal_mask(4)), ValueError, r"\(3, 3\).*\(4, 4\)"),
    ("combine: padding 3-D", lambda: ac.combine_masks(padding=torch.ones(2, 1, 3, dtype=torch.bool)), ValueError, r"padding.*\(2, 1, 3\)"),
    ("combine: padding float", lambda: ac.combine_masks(padding=torch.ones(2, 3)), TypeError, "padding.*float32"),
    ("combine: padding batch", lambda: ac.combine_masks(torch.ones(2, 3, 3, dtype=torch.bool), padding=ac.padding_mask([1, 2, 3])), ValueError, "broadcast"),
    ("to_blocked: float", lambda: ac.allowed_to_blocked(torch.ones(2, 2)), TypeError, "mask.*float32"),
    ("to_blocked: list", lambda: ac.allowed_to_blocked([[True]]), TypeError, "mask.*list"),
    ("to_additive: int mask", lambda: ac.blocked_to_additive(torch.ones(2, 2, dtype=torch.int8)), TypeError, "mask.*int8"),
    ("to_additive: int dtype", lambda: ac.blocked_to_additive(ac.causal_mask(2), dtype=torch.int64), TypeError, "dtype.*int64"),
    ("to_additive: dtype str", lambda: ac.blocked_to_additive(ac.causal_mask(2), dtype="float16"), TypeError, "dtype.*float16"),
]


@pytest.mark.parametrize("make, error, match", [case[1:] for case in BAD_INPUT], ids=[case[0] for case in BAD_INPUT])
def test_bad_input_raises_a_clear_error(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_combine_masks_refuses_masks_on_two_devices():
    with pytest.raises(ValueError, match="device"):
        ac.combine_masks(ac.causal_mask(3), padding=ac.padding_mask([3], device=torch.device("cuda")))
