"""Rotary position embeddings against a reference written from the RoFormer paper (Su et al. 2021)."""

import math

import pytest
import torch

import attn_course as ac
from attn_course.rotary import rotary_frequencies


def paper_rotary(x: torch.Tensor, positions, base: float = 10000.0) -> torch.Tensor:
    """Eq. (34) of RoFormer, one position and one pair at a time, in float64: R_{theta,m} x."""
    x64 = x.double()
    T, D = x.shape[-2], x.shape[-1]
    out = torch.empty_like(x64)
    for t in range(T):
        m = float(positions[t])
        for i in range(D // 2):
            theta = base ** (-2.0 * i / D)
            c, s = math.cos(m * theta), math.sin(m * theta)
            a, b = x64[..., t, 2 * i], x64[..., t, 2 * i + 1]
            out[..., t, 2 * i] = a * c - b * s
            out[..., t, 2 * i + 1] = a * s + b * c
    return out


def halves_to_interleaved(D: int) -> torch.Tensor:
    """The permutation that maps the half-split layout to the interleaved one: (0, D/2, 1, D/2+1, ...)."""
    half = D // 2
    return torch.stack([torch.arange(half), torch.arange(half) + half], dim=-1).flatten()


@pytest.mark.parametrize("D", [2, 8, 16])
@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_interleaved_matches_the_paper(D, base):
    x = torch.randn(2, 3, 7, D, dtype=torch.float64)
    positions = torch.arange(7)
    torch.testing.assert_close(ac.apply_rotary_embedding(x, base=base), paper_rotary(x, positions, base))
    shifted = torch.tensor([3, 5, 8, 13, 21, 34, 1000])
    torch.testing.assert_close(ac.apply_rotary_embedding(x, shifted, base=base), paper_rotary(x, shifted, base))


@pytest.mark.parametrize("D", [4, 16])
def test_the_two_layouts_agree_after_the_permutation(D):
    x = torch.randn(2, 9, D, dtype=torch.float64)
    perm = halves_to_interleaved(D)  # column k of the interleaved layout is column perm[k] of the halves
    halves = ac.apply_rotary_embedding(x, interleaved=False)
    interleaved = ac.apply_rotary_embedding(x[..., perm], interleaved=True)
    torch.testing.assert_close(interleaved, halves[..., perm])
    # and the half layout is the paper's rotation of the pairs (i, i + D/2)
    torch.testing.assert_close(halves[..., perm], paper_rotary(x[..., perm], torch.arange(9)))


def test_frequencies():
    theta = rotary_frequencies(8, 10000.0, dtype=torch.float64)
    torch.testing.assert_close(theta, torch.tensor([1.0, 10000 ** -0.25, 10000 ** -0.5, 10000 ** -0.75], dtype=torch.float64))


@pytest.mark.parametrize("interleaved", [True, False])
def test_score_depends_on_the_offset_only(interleaved):
    D = 16
    q, k = torch.randn(D, dtype=torch.float64), torch.randn(D, dtype=torch.float64)

    def score(m, n):
        qm = ac.apply_rotary_embedding(q[None], torch.tensor([m]), interleaved=interleaved)[0]
        kn = ac.apply_rotary_embedding(k[None], torch.tensor([n]), interleaved=interleaved)[0]
        return float(qm @ kn)

    for offset in (0, 1, 5, -3):
        reference = score(10 + offset, 10)
        for m in (offset + 40, offset + 200, offset + 3):
            assert score(m, m - offset) == pytest.approx(reference, rel=1e-9, abs=1e-9)
    assert score(5, 0) != pytest.approx(score(0, 5), abs=1e-6)  # not symmetric: the sign of m - n matters


def test_norm_is_preserved_and_position_zero_is_identity():
    x = torch.randn(4, 11, 8, dtype=torch.float64)
    y = ac.apply_rotary_embedding(x)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(y[:, 0], x[:, 0])


def test_broadcast_positions():
    x = torch.randn(2, 3, 5, 8)
    positions = torch.tensor([[0, 1, 2, 3, 4], [10, 11, 12, 13, 14]])[:, None, :]  # (B, 1, T)
    y = ac.apply_rotary_embedding(x, positions)
    torch.testing.assert_close(y[0], ac.apply_rotary_embedding(x[0]))
    torch.testing.assert_close(y[1], ac.apply_rotary_embedding(x[1], torch.arange(10, 15)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_dtype_and_device_follow_the_input(device, dtype):
    if device.type == "mps" and dtype == torch.float64:
        pytest.skip("MPS has no float64")
    x = torch.randn(2, 6, 8, device=device).to(dtype)
    y = ac.apply_rotary_embedding(x, interleaved=False)
    assert y.dtype == dtype and y.device == x.device
    reference = paper_rotary(x.cpu().float()[..., halves_to_interleaved(8)], torch.arange(6))[..., torch.argsort(halves_to_interleaved(8))]
    tol = {torch.float32: 1e-5, torch.float64: 1e-9, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
    torch.testing.assert_close(y.cpu().double(), reference, atol=tol, rtol=tol)


def test_module_matches_the_function_and_grows(device):
    rope = ac.RotaryEmbedding(8, base=500.0, interleaved=False).to(device)
    q, k = torch.randn(2, 3, 5, 8, device=device), torch.randn(2, 3, 5, 8, device=device)
    rq, rk = rope(q, k)
    torch.testing.assert_close(rq, ac.apply_rotary_embedding(q, base=500.0, interleaved=False))
    torch.testing.assert_close(rk, ac.apply_rotary_embedding(k, base=500.0, interleaved=False))
    assert rope.cos_cached.size(0) >= 5
    far = torch.arange(100, 105, device=device)
    rq, _ = rope(q, k, far)
    assert rope.cos_cached.size(0) >= 105
    torch.testing.assert_close(rq, ac.apply_rotary_embedding(q, far, base=500.0, interleaved=False))
    assert not any("cached" in name for name in rope.state_dict())


BAD_CALLS = [
    (lambda: ac.apply_rotary_embedding(torch.randn(4, 7)), ValueError, "even"),
    (lambda: ac.apply_rotary_embedding(torch.randn(4, 8), torch.arange(5)), ValueError, "T=4"),
    (lambda: ac.apply_rotary_embedding(torch.randn(2, 4, 8), torch.zeros(3, 4, dtype=torch.long)), ValueError, "broadcast"),
    (lambda: ac.apply_rotary_embedding(torch.arange(8).view(1, 8)), TypeError, "floating-point"),
    (lambda: ac.apply_rotary_embedding(torch.randn(8)), ValueError, "at least 2 dimensions"),
    (lambda: ac.apply_rotary_embedding(torch.randn(4, 8), base=1.0), ValueError, "base"),
    (lambda: ac.apply_rotary_embedding(torch.randn(4, 8), base="big"), TypeError, "base"),
    (lambda: ac.apply_rotary_embedding(torch.randn(4, 8), interleaved=1), TypeError, "interleaved"),
    (lambda: ac.apply_rotary_embedding(torch.randn(4, 8), [0, 1, 2, 3]), TypeError, "positions"),
    (lambda: ac.RotaryEmbedding(7), ValueError, "even"),
    (lambda: ac.RotaryEmbedding(0), ValueError, "head_dim"),
    (lambda: ac.RotaryEmbedding(8)(torch.randn(3, 6), torch.randn(3, 6)), ValueError, "head_dim=8"),
]


@pytest.mark.parametrize("make_call, error, words", BAD_CALLS)
def test_bad_calls_raise_clear_errors(make_call, error, words):
    with pytest.raises(error, match=words):
        make_call()
