"""Chapter 09: rotary position embeddings (RoPE, Su et al. 2021, "RoFormer").

Chapter 06 showed that the sinusoidal encoding of position ``p + k`` is a rotation ``M_k`` of the
encoding of ``p``. Rotary embeddings use that rotation directly: instead of *adding* a position
vector to the input, they *rotate* every query and key by an angle proportional to its position.
Split a head's ``D`` numbers into ``D / 2`` pairs; pair ``i`` of the vector at position ``m`` turns by
``m * theta_i`` with ``theta_i = base ** (-2i / D)``. A rotation preserves dot products up to the
*difference* of the angles, so the score of a query at ``m`` and a key at ``n`` depends on ``m - n``
only: attention sees relative positions, although each vector was rotated by its absolute one.

Two layouts pair the numbers differently, and a checkpoint works only with the one it was trained with:

- ``interleaved=True`` pairs neighbours ``(0, 1), (2, 3), ...`` as the RoFormer paper writes it;
- ``interleaved=False`` pairs the two halves ``(0, D/2), (1, D/2 + 1), ...``, as the GPT-NeoX and
  Hugging Face Llama code does (``rotate_half``; Meta's own Llama code pairs neighbours).

The two compute the same thing up to a fixed permutation of the ``D`` coordinates (evens first, then
odds), which is why a model converted between them needs its query and key weights permuted.

Shapes: ``T`` positions, ``D`` head width (even); any leading dimensions (``B``, ``H``) pass through.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ._checks import check_bool, check_positive_int, check_tensor, describe

__all__ = ["apply_rotary_embedding", "RotaryEmbedding", "rotary_frequencies"]


def _check_base(base) -> float:
    if isinstance(base, bool) or not isinstance(base, (int, float)):
        raise TypeError(f"base must be a float greater than 1, got {describe(base)}")
    if not (math.isfinite(base) and base > 1.0):
        raise ValueError(f"base must be a finite float greater than 1, got {base}")
    return float(base)


def _check_head_dim(name: str, head_dim: int) -> None:
    if head_dim % 2:
        raise ValueError(f"{name} must be even (rotary embeddings rotate pairs of numbers), got {head_dim}")


def rotary_frequencies(head_dim: int, base: float = 10000.0, *, device=None, dtype=torch.float32) -> torch.Tensor:
    """The angle per position of each pair, ``theta_i = base ** (-2i / D)`` for ``i = 0 .. D/2 - 1``.

    Pair 0 turns by one radian per position (a wavelength of ``2 pi`` positions); the last pair turns
    by almost ``1 / base`` radians (a wavelength of almost ``2 pi base`` positions).

    Shape:
        ``(D / 2,)``
    """
    check_positive_int("head_dim", head_dim)
    _check_head_dim("head_dim", head_dim)
    base = _check_base(base)
    two_i = torch.arange(0, head_dim, 2, device=device, dtype=torch.float64)  # (D/2,)
    return torch.pow(base, -two_i / head_dim).to(dtype)  # computed in float64, then cast


def _positions_for(x: torch.Tensor, positions, name: str = "positions") -> torch.Tensor:
    """Check ``positions`` against ``x`` (``(..., T, D)``) and return them as a tensor (default ``arange(T)``)."""
    T = x.size(-2)
    if positions is None:
        return torch.arange(T, device=x.device)
    check_tensor(name, positions, min_dim=1)
    if positions.dtype == torch.bool or positions.is_complex():
        raise TypeError(f"{name} must hold integer or float positions, got dtype {positions.dtype}")
    if positions.size(-1) != T:
        raise ValueError(
            f"{name} must have one entry per position: its last dimension must be T={T} (x has shape "
            f"{tuple(x.shape)}), got shape {tuple(positions.shape)}"
        )
    try:
        torch.broadcast_shapes(tuple(positions.shape), tuple(x.shape[:-1]))
    except RuntimeError:
        raise ValueError(
            f"{name} of shape {tuple(positions.shape)} does not broadcast to x's leading dimensions and T, "
            f"{tuple(x.shape[:-1])}"
        ) from None
    if positions.device != x.device:
        raise ValueError(f"{name} is on {positions.device} but x is on {x.device}")
    return positions


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Rotate the pairs of ``x`` by the angles whose cosines and sines are given: the one rotation of the package.

    ``x`` ``(..., T, D)`` in the compute dtype; ``cos``, ``sin`` ``(..., T, D/2)`` broadcastable to it.
    """
    half = x.size(-1) // 2
    if interleaved:
        first, second = x[..., 0::2], x[..., 1::2]  # (..., T, D/2) each: pairs (2i, 2i+1)
    else:
        first, second = x[..., :half], x[..., half:]  # (..., T, D/2) each: pairs (i, i + D/2)
    rotated_first = first * cos - second * sin  # [cos -sin; sin cos] @ [first; second]
    rotated_second = first * sin + second * cos
    if interleaved:
        return torch.stack((rotated_first, rotated_second), dim=-1).flatten(-2)  # (..., T, D/2, 2) -> (..., T, D)
    return torch.cat((rotated_first, rotated_second), dim=-1)  # (..., T, D)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)  # float32 at least (float64 stays float64)


def apply_rotary_embedding(
    x: torch.Tensor, positions: torch.Tensor | None = None, *, base: float = 10000.0, interleaved: bool = True
) -> torch.Tensor:
    """Rotate each pair of numbers of ``x`` by ``position * base ** (-2i / D)`` (RoPE).

    Args:
        x: queries or keys, one vector of width ``D`` (even) per position.
        positions: the position of each of the ``T`` vectors, ``(T,)`` (default ``arange(T)``) or any
            shape broadcastable to ``x.shape[:-1]`` whose last dimension is ``T`` (for example
            ``(B, 1, T)`` for ``(B, H, T, D)`` inputs at different offsets). Integers or floats.
        base: the frequency base (10000 in RoFormer; larger bases turn more slowly, for longer contexts).
        interleaved: pair ``(2i, 2i + 1)`` as in the paper (True) or ``(i, i + D/2)`` as in GPT-NeoX
            and Hugging Face Llama code (False).

    Returns:
        The rotated tensor, in ``x``'s dtype and on its device; the angles, cosines and sines are
        computed in float32 at least (float64 for float64 inputs).

    Shape:
        x: ``(..., T, D)`` -> ``(..., T, D)``

    Equivalent to (interleaved)::

        theta = base ** (-torch.arange(0, D, 2) / D)              # (D/2,)
        angle = positions[..., None] * theta                      # (..., T, D/2)
        even, odd = x[..., 0::2], x[..., 1::2]
        out[..., 0::2] = even * cos(angle) - odd * sin(angle)
        out[..., 1::2] = even * sin(angle) + odd * cos(angle)
    """
    check_tensor("x", x, min_dim=2, floating=True)
    _check_head_dim("the last dimension of x (the head width D)", x.size(-1))
    base = _check_base(base)
    check_bool("interleaved", interleaved)
    positions = _positions_for(x, positions)
    compute = _compute_dtype(x.dtype)
    theta = rotary_frequencies(x.size(-1), base, device=x.device, dtype=compute)  # (D/2,)
    angles = positions.to(compute)[..., None] * theta  # (..., T, 1) * (D/2,) -> (..., T, D/2)
    return _rotate(x.to(compute), angles.cos(), angles.sin(), interleaved).to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Rotary embeddings for a query/key pair, with a cosine/sine table that grows on demand.

    The table holds ``cos`` and ``sin`` of ``position * theta_i`` for positions ``0 .. n - 1`` in
    float32 (not saved with the state dict: it is a fixed function of the position); a longer input
    or larger positions extend it. Float64 inputs and non-integer positions are computed exactly by
    :func:`apply_rotary_embedding`, which gives the same numbers as the table.

    Args:
        head_dim: ``D``, even.
        base: frequency base.
        interleaved: the pair layout, see :func:`apply_rotary_embedding`.

    Shape:
        - query: ``(..., L, D)``, key: ``(..., S, D)``; positions: as in :func:`apply_rotary_embedding`,
          used for both (then ``L == S``); None gives each its own ``arange``.
        - output: ``(query, key)`` rotated, same shapes, dtypes and devices.
    """

    def __init__(self, head_dim: int, base: float = 10000.0, interleaved: bool = True) -> None:
        super().__init__()
        check_positive_int("head_dim", head_dim)
        _check_head_dim("head_dim", head_dim)
        self.head_dim, self.base = head_dim, _check_base(base)
        check_bool("interleaved", interleaved)
        self.interleaved = interleaved
        self.register_buffer("cos_cached", torch.empty(0, head_dim // 2), persistent=False)
        self.register_buffer("sin_cached", torch.empty(0, head_dim // 2), persistent=False)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base}, interleaved={self.interleaved}"

    def _table(self, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cos_cached.size(0) < length or self.cos_cached.device != device:
            size = max(length, 2 * self.cos_cached.size(0))  # grow geometrically
            theta = rotary_frequencies(self.head_dim, self.base, device=device)  # (D/2,)
            angles = torch.arange(size, device=device, dtype=torch.float32)[:, None] * theta  # (n, D/2)
            self.cos_cached, self.sin_cached = angles.cos(), angles.sin()
        return self.cos_cached, self.sin_cached

    def rotate(self, x: torch.Tensor, positions: torch.Tensor | None = None, name: str = "x") -> torch.Tensor:
        """Rotate one tensor ``(..., T, D)`` (queries or keys)."""
        check_tensor(name, x, min_dim=2, floating=True)
        if x.size(-1) != self.head_dim:
            raise ValueError(f"{name} must have last dimension head_dim={self.head_dim}, got shape {tuple(x.shape)}")
        positions = _positions_for(x, positions)
        integer = not positions.is_floating_point()
        if x.dtype == torch.float64 or not integer or (positions.numel() and int(positions.min()) < 0):
            return apply_rotary_embedding(x, positions, base=self.base, interleaved=self.interleaved)
        cos, sin = self._table(int(positions.max()) + 1 if positions.numel() else 0, x.device)
        compute = _compute_dtype(x.dtype)
        return _rotate(x.to(compute), cos[positions], sin[positions], self.interleaved).to(x.dtype)  # (..., T, D/2) tables

    def forward(self, query: torch.Tensor, key: torch.Tensor, positions: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rotate(query, positions, "query"), self.rotate(key, positions, "key")
