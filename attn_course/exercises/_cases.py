"""Inputs unlike the notebook's: other sizes, padding on either side, large scores, seeded randomness.

A check that tries only the notebook's ``B, T, E`` grades the notebook, not the student. These helpers
give every check the same few awkward cases; the chapter's check decides which it needs. All
randomness comes from a :func:`rng` generator, so every check is reproducible and never draws from
(or reseeds) the global generator that the notebook seeded (``exercise`` also restores the global
states of torch, Python's ``random`` and numpy after each check, in case the student's code drew
from them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

__all__ = ["rng", "randn", "Sizes", "other_sizes", "padding_mask_for", "padding_cases", "large_scores"]


def rng(seed: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with ``seed``: pass it to every random draw of a check."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__} {seed!r}")
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, generator: torch.Generator, dtype: torch.dtype = torch.float32, device=None,
          scale: float = 1.0) -> torch.Tensor:
    """Standard normal numbers times ``scale``, drawn from ``generator`` on the CPU (so a check gives the
    same numbers on every device), then moved to ``dtype`` and ``device``."""
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator (see rng), got {type(generator).__name__}")
    draw_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    x = torch.randn(*shape, generator=generator, dtype=draw_dtype) * scale
    return x.to(dtype=dtype, device=device)


@dataclass(frozen=True)
class Sizes:
    """One combination of the course's sizes: batch ``B``, query length ``L``, key length ``S``, model
    width ``E`` and heads ``H`` (``E`` is a multiple of ``H``; ``D = E // H``)."""

    B: int
    L: int
    S: int
    E: int
    H: int

    @property
    def D(self) -> int:
        return self.E // self.H

    @property
    def T(self) -> int:
        """The sequence length of self-attention (``L``)."""
        return self.L

    def shape(self, *axes: str) -> tuple[int, ...]:
        """``sizes.shape("B", "H", "L", "D")`` -> ``(B, H, L, D)``."""
        try:
            return tuple(getattr(self, axis) for axis in axes)
        except AttributeError:
            raise ValueError(f"axes must be letters among B, L, S, T, E, H, D, got {axes!r}") from None

    def __str__(self) -> str:
        return f"B={self.B}, L={self.L}, S={self.S}, E={self.E}, H={self.H}"


# Each size is there for a mistake: batch 1 (a squeeze too many), batch 3 (code that assumes 2),
# L != S both ways (a transpose on the wrong axis or a mask of the wrong shape), one query (decoding),
# B == L == S (a broadcast on the wrong axis runs), odd widths and one head (a hard-coded width or
# head count), a head width of 1.
_SIZES = (
    Sizes(B=1, L=3, S=5, E=6, H=2),
    Sizes(B=3, L=5, S=2, E=9, H=3),
    Sizes(B=2, L=1, S=4, E=8, H=4),
    Sizes(B=3, L=3, S=3, E=5, H=1),
    Sizes(B=2, L=6, S=7, E=4, H=4),
)


def other_sizes(*, same_length: bool = False, max_heads: int | None = None) -> list[Sizes]:
    """Several :class:`Sizes` unlike a notebook's: batch 1 and 3, ``L < S``, ``L > S``, one query,
    ``B == L == S``, odd widths, one head and head width 1.

    Args:
        same_length: self-attention: every case has ``S == L`` (``L`` is kept).
        max_heads: leave out cases with more heads than this.
    """
    sizes = []
    for size in _SIZES:
        if same_length:
            size = Sizes(B=size.B, L=size.L, S=size.L, E=size.E, H=size.H)
        if max_heads is not None and size.H > max_heads:
            continue
        if size not in sizes:
            sizes.append(size)
    return sizes


def padding_mask_for(lengths, max_len: int, *, side: str = "right", convention: str = "blocked",
                     device=None) -> torch.Tensor:
    """The ``(B, max_len)`` padding mask of sequences of the given lengths.

    Args:
        lengths: one length per sequence, each in ``0..max_len``.
        max_len: the padded length ``S``.
        side: ``"right"`` (tokens first, padding after) or ``"left"`` (padding first).
        convention: ``"blocked"``: True at padding (``key_padding_mask`` of ``nn.MultiheadAttention``);
            ``"allowed"``: True at real tokens (``attn_mask`` of ``F.scaled_dot_product_attention``).
    """
    if side not in ("right", "left"):
        raise ValueError(f"side must be 'right' or 'left', got {side!r}")
    if convention not in ("blocked", "allowed"):
        raise ValueError(f"convention must be 'blocked' or 'allowed', got {convention!r}")
    lengths = torch.as_tensor([int(n) for n in lengths], device=device)  # (B,)
    if bool(((lengths < 0) | (lengths > max_len)).any()):
        raise ValueError(f"lengths must be in 0..{max_len}, got {lengths.tolist()}")
    position = torch.arange(max_len, device=device)[None, :]  # (1, S)
    if side == "right":
        real = position < lengths[:, None]  # (B, S)
    else:
        real = position >= (max_len - lengths)[:, None]  # (B, S)
    return ~real if convention == "blocked" else real


def padding_cases(batch_size: int = 3, max_len: int = 5, *, convention: str = "blocked", empty_row: bool = False,
                  device=None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(description, mask)``: no padding, right padding, left padding, and, with
    ``empty_row=True``, right padding with one sequence that is all padding.

    The lengths differ from one sequence to the next (the first is full), so a mask rebuilt from
    lengths on the wrong side, or applied to the wrong sequence, shows.
    """
    if batch_size < 1 or max_len < 2:
        raise ValueError(f"padding_cases needs batch_size >= 1 and max_len >= 2, got {batch_size} and {max_len}")
    lengths = [max(1, max_len - 2 * b) for b in range(batch_size)]  # e.g. 5, 3, 1
    yield "no padding", padding_mask_for([max_len] * batch_size, max_len, convention=convention, device=device)
    yield f"right padding (lengths {lengths})", padding_mask_for(lengths, max_len, side="right",
                                                                 convention=convention, device=device)
    yield f"left padding (lengths {lengths})", padding_mask_for(lengths, max_len, side="left",
                                                                convention=convention, device=device)
    if empty_row:
        empty = lengths[:-1] + [0] if batch_size > 1 else [0]
        yield f"a sequence that is all padding (lengths {empty})", padding_mask_for(
            empty, max_len, side="right", convention=convention, device=device)


def large_scores(*shape: int, generator: torch.Generator, level: float = 100.0, spread: float = 3.0,
                 dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """Scores near ``+level`` and ``-level`` in float32: where a softmax without its max shift breaks.

    Rows (the last axis holds a row) alternate between about ``+level`` and about ``-level``, each with
    a spread of ``spread``. exp(88.7) overflows float32, so ``exp(score)`` of the high rows is inf and a
    softmax that does not subtract the row maximum returns NaN; a single maximum for the whole tensor
    (rather than each row's) underflows the low rows to 0 / 0. A 1-D shape is one high row.
    """
    scores = randn(*shape, generator=generator, dtype=torch.float64, scale=spread)
    if scores.dim() >= 2:
        sign = torch.ones(scores.shape[-2], dtype=torch.float64)
        sign[1::2] = -1.0
        scores = scores + level * sign[:, None]
    else:
        scores = scores + level
    return scores.to(dtype=dtype, device=device)
