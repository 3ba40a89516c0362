"""Chapter 06: positional encodings and token embeddings."""

from __future__ import annotations

import math

import torch
from torch import nn

from ._checks import check_positive_int, check_probability, check_tensor, describe
from .scaled import _recording_graph

__all__ = ["sinusoidal_positional_encoding", "PositionalEncoding", "LearnedPositionalEmbedding", "TokenEmbedding"]


def sinusoidal_positional_encoding(max_len: int, d_model: int, *, device=None, dtype=None) -> torch.Tensor:
    """The fixed sinusoidal encoding of Vaswani et al. (2017).

    ``PE[pos, 2i] = sin(pos / 10000^(2i / d_model))`` and ``PE[pos, 2i+1] = cos(pos / 10000^(2i / d_model))``
    for ``i = 0 .. d_model/2 - 1``: wavelengths run geometrically from ``2*pi`` to (almost)
    ``10000 * 2*pi``. An odd ``d_model`` keeps the last sine column and drops its cosine.

    Args:
        max_len: number of positions.
        d_model: width of the encoding.
        device, dtype: of the result (default: torch's defaults).

    Shape:
        ``(max_len, d_model)``
    """
    check_positive_int("max_len", max_len, allow_zero=True)
    check_positive_int("d_model", d_model)
    dtype = torch.get_default_dtype() if dtype is None else dtype
    if not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point dtype, got {dtype}")
    # Computed in float64 for accuracy at large positions, then cast.
    position = torch.arange(max_len, dtype=torch.float64, device=device)[:, None]  # (max_len, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64, device=device)  # (ceil(d_model / 2),)
    inv_freq = torch.exp(-math.log(10000.0) * two_i / d_model)  # 1 / 10000^(2i / d_model)
    angles = position * inv_freq  # (max_len, ceil(d_model / 2))
    pe = torch.zeros(max_len, d_model, dtype=torch.float64, device=device)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return pe.to(dtype)


def _check_positions(x: torch.Tensor, start: int, d_model: int, max_len: int, advice: str) -> int:
    """Check the input of a position module's forward; return ``T``, the number of positions asked for."""
    check_tensor("x", x, min_dim=2, floating=True)
    check_positive_int("start", start, allow_zero=True)
    T = x.size(-2)
    if x.size(-1) != d_model:
        raise ValueError(f"x must have last dimension d_model={d_model}, got shape {tuple(x.shape)}")
    if start + T > max_len:
        raise ValueError(f"positions {start} to {start + T - 1} were asked for, but max_len={max_len} covers "
                         f"positions 0 to {max_len - 1}; {advice}")
    return T


class PositionalEncoding(nn.Module):
    """Add the sinusoidal encoding to a batch of embeddings, then apply dropout.

    Args:
        d_model: width ``E`` of the embeddings.
        max_len: the longest sequence it accepts.
        dropout: dropout probability after the addition.

    Shape:
        - x: ``(B, T, E)`` (any leading dimensions work), with ``start + T <= max_len``
        - output: same as x, on x's device and in x's dtype (a float64 x gets a float64-exact
          encoding even when the stored table is float32).
    """

    def __init__(self, d_model: int, max_len: int = 5000, dropout: float = 0.0) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("max_len", max_len)
        check_probability("dropout", dropout)
        self.d_model, self.max_len = d_model, max_len
        self.dropout = nn.Dropout(dropout)
        # Not a parameter and not saved in the state dict: it is a fixed function of the position.
        self.register_buffer("pe", sinusoidal_positional_encoding(max_len, d_model), persistent=False)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, max_len={self.max_len}"

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Add the encodings of positions ``start .. start+T-1`` (``start`` serves cached decoding)."""
        T = _check_positions(x, start, self.d_model, self.max_len, "build PositionalEncoding with a larger max_len")
        if torch.finfo(x.dtype).bits > torch.finfo(self.pe.dtype).bits:  # e.g. float64 x, float32 table
            pe = sinusoidal_positional_encoding(start + T, self.d_model, device=x.device, dtype=x.dtype)[start:]  # (T, E)
        else:
            pe = self.pe[start : start + T].to(device=x.device, dtype=x.dtype)  # (T, E)
        return self.dropout(x + pe)


class LearnedPositionalEmbedding(nn.Module):
    """Add a trained vector per position (as in BERT and GPT-2), then apply dropout.

    The alternative to :class:`PositionalEncoding`: a table of ``max_len`` vectors learned with the
    rest of the model. It can fit whatever the task needs, but it knows nothing about a position it
    has not been trained on, and nothing at all beyond ``max_len`` (asking for it raises).

    Args:
        max_len: number of positions in the table (the longest sequence it accepts).
        d_model: width ``E`` of the embeddings.
        dropout: dropout probability after the addition.
        init_std: standard deviation of the initial table (0.02, as GPT-2 and BERT).

    Shape:
        - x: ``(B, T, E)`` (any leading dimensions work), with ``start + T <= max_len``
        - output: same as x, in x's dtype; the table must be on x's device (it is trained, so it
          is not copied silently).
    """

    def __init__(self, max_len: int, d_model: int, dropout: float = 0.0, init_std: float = 0.02) -> None:
        super().__init__()
        check_positive_int("max_len", max_len)
        check_positive_int("d_model", d_model)
        check_probability("dropout", dropout)
        if isinstance(init_std, bool) or not isinstance(init_std, (int, float)):
            raise TypeError(f"init_std must be a float, got {describe(init_std)}")
        if not init_std > 0:
            raise ValueError(f"init_std must be positive, got {init_std}")
        self.max_len, self.d_model = max_len, d_model
        self.embedding = nn.Embedding(max_len, d_model)  # one row per position
        nn.init.normal_(self.embedding.weight, mean=0.0, std=float(init_std))
        self.dropout = nn.Dropout(dropout)

    def extra_repr(self) -> str:
        return f"max_len={self.max_len}, d_model={self.d_model}"

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Add the vectors of positions ``start .. start+T-1``."""
        T = _check_positions(x, start, self.d_model, self.max_len, "a learned table has no vector beyond its "
                             "last row (build it with a larger max_len, and train on such lengths)")
        weight = self.embedding.weight
        if x.device != weight.device:
            raise ValueError(f"x is on {x.device} but the position table is on {weight.device}; call module.to(x.device)")
        positions = torch.arange(start, start + T, device=weight.device)  # (T,)
        return self.dropout(x + self.embedding(positions).to(x.dtype))  # (..., T, E) + (T, E)


class TokenEmbedding(nn.Module):
    """Token ids to vectors, scaled by ``sqrt(d_model)`` as in Vaswani et al. (2017).

    The weights start as ``N(0, 1/d_model)``, the size of a ``d_model``-wide linear layer's weights
    (Vaswani et al. share this matrix with the output layer), so a raw embedding has norm about 1.
    The scaling by ``sqrt(d_model)`` gives entries of size about 1 and norm about ``sqrt(d_model)``,
    comparable to the sinusoidal encoding's norm ``sqrt(d_model / 2)``: neither the token nor its
    position drowns the other when the two are added.

    Args:
        vocab_size: number of distinct tokens.
        d_model: width ``E``.
        padding_idx: optional id whose vector stays zero and gets no gradient.

    Shape:
        - tokens: ``(B, T)`` integer ids
        - output: ``(B, T, E)``
    """

    def __init__(self, vocab_size: int, d_model: int, padding_idx: int | None = None) -> None:
        super().__init__()
        check_positive_int("vocab_size", vocab_size)
        check_positive_int("d_model", d_model)
        if padding_idx is not None:
            check_positive_int("padding_idx", padding_idx, allow_zero=True)
            if padding_idx >= vocab_size:
                raise ValueError(f"padding_idx must be below vocab_size={vocab_size}, got {padding_idx}")
        self.d_model = d_model
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=padding_idx)
        with torch.no_grad():
            self.embedding.weight.normal_(0.0, d_model**-0.5)
            if padding_idx is not None:
                self.embedding.weight[padding_idx].zero_()

    def extra_repr(self) -> str:
        return f"scale=sqrt({self.d_model})"

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        check_tensor("tokens", tokens)
        if tokens.is_floating_point() or tokens.dtype == torch.bool:
            raise TypeError(f"tokens must be integer ids, got dtype {tokens.dtype}")
        vocab_size = self.embedding.num_embeddings
        # The friendly range check reads the ids' values, which a recorded graph (torch.export, the
        # ONNX exporter, torch.jit.trace) cannot: there, whoever feeds the graph checks the ids.
        if tokens.numel() and not _recording_graph() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
            raise ValueError(
                f"token ids must lie in [0, {vocab_size}), got ids from {int(tokens.min())} to {int(tokens.max())}"
            )
        return self.embedding(tokens) * math.sqrt(self.d_model)  # (B, T, E)
