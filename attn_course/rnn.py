"""Chapter 01: encoder-decoder RNNs, without attention and with Bahdanau or Luong attention.

Positions count from 0, as in chapter 01 (the papers count from 1). An encoder GRU reads the source
tokens ``x_0 .. x_{S-1}`` into states ``h_0 .. h_{S-1}``; a decoder GRU writes the target ``y_0 ..
y_{T-1}`` one token at a time, starting from the state ``s_{-1} = c`` (the encoder's summary) and the
begin-of-sequence token ``y_{-1}``. The three decoders differ only in what they know about the source
at step ``i``:

- ``"none"`` (Cho et al., 2014): one fixed summary ``c`` for every step, the bottleneck;
- ``"additive"`` (Bahdanau et al., 2015): a fresh context ``c_i`` from additive attention, with the
  *previous* decoder state ``s_{i-1}`` as the query, fed into the GRU that makes ``s_i``
  (``token_in_query=True``: the query is ``[s_{i-1}; y_{i-1}]``, chapter 01's exercise 4);
- ``"dot"`` (Luong et al., 2015): the GRU makes ``s_i`` first, then ``s_i`` queries the encoder
  states with a dot product, and ``tanh(W_c [c_i; s_i])`` makes the prediction.

The attention itself is :class:`attn_course.AdditiveAttention` or
:class:`attn_course.DotProductAttention`. This module also holds the chapter's toy task: copying or
reversing strings of digits, a "translation" whose word order is known exactly.

Shapes: ``B`` batch, ``S`` source length, ``T`` target length, ``E`` embedding width, ``D`` hidden
width, ``V`` vocabulary size. Padding masks are **True at padding** (as ``nn.MultiheadAttention``).
"""

from __future__ import annotations

import torch
from torch import nn

from ._checks import check_bool, check_positive_int, check_tensor, describe
from .alignment import AdditiveAttention, DotProductAttention

__all__ = [
    "ATTENTION_KINDS",
    "GRUEncoder",
    "AttentionDecoder",
    "Seq2Seq",
    "DIGIT_PAD",
    "DIGIT_BOS",
    "DIGIT_VOCAB_SIZE",
    "digit_task",
    "shift_right",
]

ATTENTION_KINDS = ("none", "additive", "dot")

# The toy task's vocabulary: the digits 0-9 are their own token ids, then padding and begin-of-sequence.
DIGIT_PAD = 10
DIGIT_BOS = 11
DIGIT_VOCAB_SIZE = 12


def _check_tokens(name: str, tokens, vocab_size: int) -> None:
    check_tensor(name, tokens)
    if tokens.dim() != 2:
        raise ValueError(f"{name} must be (B, length) token ids, got shape {tuple(tokens.shape)}")
    if tokens.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must hold integer token ids (int64), got dtype {tokens.dtype}")
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise ValueError(
            f"{name} must hold token ids in [0, {vocab_size}), got values from {int(tokens.min())} to {int(tokens.max())}"
        )


def _check_padding_mask(mask, source) -> None:
    """A (B, S) bool mask, True at padding, with the padding only at the end of each row."""
    if mask is None:
        return
    check_tensor("source_padding_mask", mask)
    if mask.dtype != torch.bool:
        raise TypeError(f"source_padding_mask must be a bool tensor (True = padding), got dtype {mask.dtype}")
    if tuple(mask.shape) != tuple(source.shape):
        raise ValueError(
            f"source_padding_mask must have the source's shape (B, S) = {tuple(source.shape)}, got {tuple(mask.shape)}"
        )
    if mask.size(1) > 1 and bool((mask[:, :-1] & ~mask[:, 1:]).any()):
        raise ValueError("source_padding_mask must mark padding only at the end of each row (right padding), "
                         "got a row with a real token after a padding position")


class GRUEncoder(nn.Module):
    """Embed the source tokens and read them with a GRU, in one direction or in both.

    One direction: ``h_j = GRU(x_j, h_{j-1})`` with ``h_{-1} = 0``, so ``h_j`` summarises
    ``x_0 .. x_j``. Both directions (as Bahdanau et al.): a forward GRU and a backward GRU, each
    ``hidden_dim // 2`` wide, and ``h_j = [h_j^fwd; h_j^bwd]`` summarises the whole source with
    the focus on ``x_j``.

    Args:
        vocab_size: number of source token ids ``V``.
        embed_dim: embedding width ``E``.
        hidden_dim: width ``D`` of each state ``h_j`` (even when ``bidirectional``).
        bidirectional: read the source in both directions.

    Shape:
        - source: ``(B, S)`` token ids
        - source_padding_mask: ``(B, S)`` bool, **True at padding**, padding on the right only
        - states: ``(B, S, D)``, one state per source position (the keys and values of attention);
          zeros at padding
        - final: ``(B, D)``, the summary of each row: the forward state after its last real token
          (and the backward state at its first token); zeros for an empty row
    """

    def __init__(self, vocab_size: int, embed_dim: int, hidden_dim: int, bidirectional: bool = False) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("embed_dim", embed_dim), ("hidden_dim", hidden_dim)):
            check_positive_int(name, value)
        check_bool("bidirectional", bidirectional)
        if bidirectional and hidden_dim % 2:
            raise ValueError(f"hidden_dim must be even when bidirectional (half per direction), got {hidden_dim}")
        self.vocab_size, self.embed_dim, self.hidden_dim = vocab_size, embed_dim, hidden_dim
        self.bidirectional = bidirectional
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.gru = nn.GRU(embed_dim, hidden_dim // 2 if bidirectional else hidden_dim, batch_first=True,
                          bidirectional=bidirectional)

    def forward(self, source: torch.Tensor, source_padding_mask: torch.Tensor | None = None):
        _check_tokens("source", source, self.vocab_size)
        _check_padding_mask(source_padding_mask, source)
        B, S = source.shape
        if S == 0:
            raise ValueError(f"source must hold at least one position, got shape {tuple(source.shape)}")
        embedded = self.embedding(source)  # (B, S) -> (B, S, E)
        if source_padding_mask is None:
            states, last = self.gru(embedded)  # states (B, S, D); last (directions, B, D / directions)
        else:
            # Packing runs each row only over its real tokens, so the backward GRU starts at the
            # row's last real token, not at the padding.
            lengths = (~source_padding_mask).sum(dim=1)  # (B,)
            packed = nn.utils.rnn.pack_padded_sequence(embedded, lengths.clamp_min(1).cpu(), batch_first=True,
                                                       enforce_sorted=False)
            packed_states, last = self.gru(packed)
            states, _ = nn.utils.rnn.pad_packed_sequence(packed_states, batch_first=True, total_length=S)  # (B, S, D)
            empty = (lengths == 0)  # (B,): such rows keep zeros, as if nothing had been read
            states = states.masked_fill(empty[:, None, None], 0.0)
            last = last.masked_fill(empty[None, :, None], 0.0)
        final = torch.cat(list(last), dim=-1)  # directions x (B, D / directions) -> (B, D)
        return states, final

    def extra_repr(self) -> str:
        return (f"vocab_size={self.vocab_size}, embed_dim={self.embed_dim}, hidden_dim={self.hidden_dim}, "
                f"bidirectional={self.bidirectional}")


class AttentionDecoder(nn.Module):
    """A GRU decoder that sees the source through a fixed vector or through attention.

    With ``y_{i-1}`` the embedded previous target token (``E``), ``s_i`` the decoder state
    (``D``) and ``h_0 .. h_{S-1}`` the encoder states (``(S, D)``), step ``i`` (from 0) is:

    - ``"none"``: ``s_i = GRU([y_{i-1}; c], s_{i-1})`` with ``c`` the encoder's summary;
      ``logits_i = W_o [s_i; c]``.
    - ``"additive"`` (Bahdanau): ``e_ij = v^T tanh(W s_{i-1} + U h_j)``, ``a_i = softmax_j(e_i)``,
      ``c_i = sum_j a_ij h_j``; ``s_i = GRU([y_{i-1}; c_i], s_{i-1})``; ``logits_i = W_o [s_i; c_i]``.
      With ``token_in_query=True`` the query is ``[s_{i-1}; y_{i-1}]`` (width ``D + E``) instead of
      ``s_{i-1}``: ``e_ij = v^T tanh(W [s_{i-1}; y_{i-1}] + U h_j)``.
    - ``"dot"`` (Luong): ``s_i = GRU(y_{i-1}, s_{i-1})``; ``e_ij = s_i . h_j``, ``a_i = softmax_j(e_i)``,
      ``c_i = sum_j a_ij h_j``; ``t_i = tanh(W_c [c_i; s_i])``; ``logits_i = W_o t_i``.

    In every case the first state is ``s_{-1} = c``, the encoder's summary (``encoder_final``), and
    the first input ``y_{-1}`` is the begin-of-sequence token. (The papers' output layers differ in
    details, a maxout layer in Bahdanau's; a linear layer keeps the three comparable.)

    Args:
        vocab_size: number of target token ids ``V``.
        embed_dim: embedding width ``E``.
        hidden_dim: decoder state width ``D``, equal to the encoder's.
        attention: ``"none"``, ``"additive"`` or ``"dot"``.
        attention_dim: hidden width of the additive scoring network (default ``hidden_dim``);
            only for ``"additive"``.
        token_in_query: only for ``"additive"``: the scoring network's query is the previous state
            and the embedded previous token, ``[s_{i-1}; y_{i-1}]``, instead of ``s_{i-1}`` alone.

    Shape:
        - decoder_inputs: ``(B, T)`` token ids ``y_{-1} .. y_{T-2}`` (teacher forcing: the target
          shifted right, starting with the begin-of-sequence token ``y_{-1}``; see :func:`shift_right`)
        - encoder_states: ``(B, S, D)``; encoder_final: ``(B, D)``
        - source_padding_mask: ``(B, S)`` bool, **True at padding**
        - logits: ``(B, T, V)``; weights: ``(B, T, S)``, or None for ``"none"``
    """

    def __init__(self, vocab_size: int, embed_dim: int, hidden_dim: int, attention: str = "additive",
                 attention_dim: int | None = None, token_in_query: bool = False) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("embed_dim", embed_dim), ("hidden_dim", hidden_dim)):
            check_positive_int(name, value)
        if attention not in ATTENTION_KINDS:
            raise ValueError(f"attention must be one of {ATTENTION_KINDS}, got {attention!r}")
        if attention_dim is not None:
            check_positive_int("attention_dim", attention_dim)
            if attention != "additive":
                raise ValueError(f"attention_dim is only used by attention='additive', got attention={attention!r}")
        check_bool("token_in_query", token_in_query)
        if token_in_query and attention != "additive":
            raise ValueError(f"token_in_query is only used by attention='additive', got attention={attention!r}")
        self.vocab_size, self.embed_dim, self.hidden_dim = vocab_size, embed_dim, hidden_dim
        self.attention_kind = attention
        self.token_in_query = token_in_query
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        if attention == "dot":
            self.cell = nn.GRUCell(embed_dim, hidden_dim)  # Luong: the context is not a GRU input
            self.attention = DotProductAttention()
            self.combine = nn.Linear(2 * hidden_dim, hidden_dim)  # W_c [c_i; s_i]
            self.output = nn.Linear(hidden_dim, vocab_size)  # W_o t_i
        else:
            self.cell = nn.GRUCell(embed_dim + hidden_dim, hidden_dim)  # input [y_{i-1}; c_i]
            query_dim = hidden_dim + (embed_dim if token_in_query else 0)  # s_{i-1}, or [s_{i-1}; y_{i-1}]
            self.attention = (AdditiveAttention(query_dim, hidden_dim, attention_dim or hidden_dim)
                              if attention == "additive" else None)
            self.output = nn.Linear(2 * hidden_dim, vocab_size)  # W_o [s_i; c_i]

    def step(self, previous_tokens, state, encoder_states, encoder_final, source_padding_mask=None):
        """One decoder step.

        Shape:
            - previous_tokens: ``(B,)``; state: ``(B, D)``; encoder_states: ``(B, S, D)``;
              encoder_final: ``(B, D)``; source_padding_mask: ``(B, S)``, True at padding
            - returns logits ``(B, V)``, the new state ``(B, D)`` and weights ``(B, S)`` (None for "none")
        """
        embedded = self.embedding(previous_tokens)  # (B,) -> (B, E)
        if self.attention_kind == "none":
            context = encoder_final  # (B, D): the same summary at every step
            state = self.cell(torch.cat([embedded, context], dim=-1), state)  # (B, E + D) -> (B, D)
            return self.output(torch.cat([state, context], dim=-1)), state, None  # (B, 2D) -> (B, V)
        if self.attention_kind == "additive":
            # Bahdanau: attend with the previous state, then update the state with the context.
            query = torch.cat([state, embedded], dim=-1) if self.token_in_query else state  # (B, D + E) or (B, D)
            context, weights = self.attention(query, encoder_states, key_padding_mask=source_padding_mask)  # (B, D), (B, S)
            state = self.cell(torch.cat([embedded, context], dim=-1), state)  # (B, E + D) -> (B, D)
            return self.output(torch.cat([state, context], dim=-1)), state, weights  # (B, 2D) -> (B, V)
        # Luong: update the state first, then attend with the new state.
        state = self.cell(embedded, state)  # (B, E) -> (B, D)
        context, weights = self.attention(state, encoder_states, key_padding_mask=source_padding_mask)  # (B, D), (B, S)
        attentional = torch.tanh(self.combine(torch.cat([context, state], dim=-1)))  # (B, 2D) -> (B, D)
        return self.output(attentional), state, weights  # (B, D) -> (B, V)

    def forward(self, decoder_inputs, encoder_states, encoder_final, source_padding_mask=None):
        _check_tokens("decoder_inputs", decoder_inputs, self.vocab_size)
        check_tensor("encoder_states", encoder_states, floating=True)
        if encoder_states.dim() != 3 or encoder_states.size(-1) != self.hidden_dim:
            raise ValueError(f"encoder_states must be (B, S, hidden_dim={self.hidden_dim}), got shape {tuple(encoder_states.shape)}")
        if tuple(encoder_final.shape) != (encoder_states.size(0), self.hidden_dim):
            raise ValueError(f"encoder_final must be (B, hidden_dim) = {(encoder_states.size(0), self.hidden_dim)}, "
                             f"got shape {tuple(encoder_final.shape)}")
        if decoder_inputs.size(0) != encoder_states.size(0):
            raise ValueError(f"decoder_inputs and encoder_states must share the batch size, got "
                             f"{tuple(decoder_inputs.shape)} and {tuple(encoder_states.shape)}")
        state = encoder_final  # s_{-1} = c, (B, D)
        all_logits, all_weights = [], []
        for i in range(decoder_inputs.size(1)):
            logits, state, weights = self.step(decoder_inputs[:, i], state, encoder_states, encoder_final, source_padding_mask)
            all_logits.append(logits)
            all_weights.append(weights)
        B, S = encoder_states.shape[:2]
        if not all_logits:  # T = 0
            empty = encoder_states.new_zeros(B, 0, self.vocab_size)
            return empty, (None if self.attention is None else encoder_states.new_zeros(B, 0, S))
        logits = torch.stack(all_logits, dim=1)  # T x (B, V) -> (B, T, V)
        weights = None if self.attention is None else torch.stack(all_weights, dim=1)  # T x (B, S) -> (B, T, S)
        return logits, weights

    def extra_repr(self) -> str:
        return f"attention={self.attention_kind!r}" + (", token_in_query=True" if self.token_in_query else "")


class Seq2Seq(nn.Module):
    """An encoder-decoder: :class:`GRUEncoder` followed by :class:`AttentionDecoder`.

    Args:
        vocab_size: number of token ids ``V`` (shared by source and target, as in the digit task).
        embed_dim: embedding width ``E``.
        hidden_dim: GRU state width ``D``.
        attention: ``"none"``, ``"additive"`` (Bahdanau) or ``"dot"`` (Luong).
        attention_dim: hidden width of the additive scoring network (default ``hidden_dim``).
        bidirectional: a bidirectional encoder (each direction ``hidden_dim // 2`` wide).
        token_in_query: only for ``"additive"``: the query is ``[s_{i-1}; y_{i-1}]`` (see
            :class:`AttentionDecoder`).

    Shape:
        - source: ``(B, S)`` token ids; decoder_inputs: ``(B, T)`` token ids
        - source_padding_mask: ``(B, S)`` bool, **True at padding**, padding on the right only
        - logits: ``(B, T, V)``; weights: ``(B, T, S)`` (None without attention)

    Example::

        model = Seq2Seq(DIGIT_VOCAB_SIZE, embed_dim=16, hidden_dim=64, attention="additive")
        source, target = digit_task(32, length=8)
        logits, weights = model(source, shift_right(target, DIGIT_BOS))
    """

    def __init__(self, vocab_size: int, embed_dim: int = 16, hidden_dim: int = 64, attention: str = "additive",
                 attention_dim: int | None = None, bidirectional: bool = False, token_in_query: bool = False) -> None:
        super().__init__()
        self.encoder = GRUEncoder(vocab_size, embed_dim, hidden_dim, bidirectional)
        self.decoder = AttentionDecoder(vocab_size, embed_dim, hidden_dim, attention, attention_dim, token_in_query)

    @property
    def attention_kind(self) -> str:
        return self.decoder.attention_kind

    def forward(self, source, decoder_inputs, source_padding_mask=None):
        encoder_states, encoder_final = self.encoder(source, source_padding_mask)  # (B, S, D), (B, D)
        return self.decoder(decoder_inputs, encoder_states, encoder_final, source_padding_mask)

    @torch.no_grad()
    def greedy_decode(self, source, steps: int, bos_id: int, source_padding_mask=None):
        """Generate ``steps`` tokens, each step feeding back the most likely token of the last.

        Args:
            source: ``(B, S)`` token ids.
            steps: how many tokens to generate (the toy task's output is as long as its input).
            bos_id: the begin-of-sequence token fed at the first step.
            source_padding_mask: ``(B, S)`` bool, **True at padding**.

        Returns:
            ``(tokens, weights)``: ``(B, steps)`` token ids and ``(B, steps, S)`` attention weights
            (None without attention).
        """
        check_positive_int("steps", steps, allow_zero=True)
        check_positive_int("bos_id", bos_id, allow_zero=True)
        if bos_id >= self.decoder.vocab_size:
            raise ValueError(f"bos_id must be a token id below vocab_size={self.decoder.vocab_size}, got {bos_id}")
        encoder_states, encoder_final = self.encoder(source, source_padding_mask)  # (B, S, D), (B, D)
        B, S = source.shape
        token = torch.full((B,), bos_id, dtype=torch.long, device=source.device)  # (B,)
        state = encoder_final  # s_{-1} = c
        tokens, all_weights = [], []
        for _ in range(steps):
            logits, state, weights = self.decoder.step(token, state, encoder_states, encoder_final, source_padding_mask)
            token = logits.argmax(dim=-1)  # (B, V) -> (B,)
            tokens.append(token)
            all_weights.append(weights)
        out = torch.stack(tokens, dim=1) if tokens else source.new_zeros(B, 0)  # (B, steps)
        if self.decoder.attention is None:
            return out, None
        weights = torch.stack(all_weights, dim=1) if all_weights else encoder_states.new_zeros(B, 0, S)  # (B, steps, S)
        return out, weights


def digit_task(batch_size: int, length: int, *, task: str = "reverse", generator: torch.Generator | None = None,
               device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of random digit strings and their translations: the same digits reversed or copied.

    Reversing is a small translation problem whose alignment is known exactly: output step ``i``
    writes the digit at source position ``S - 1 - i`` (both counted from 0), its mirror position.

    Args:
        batch_size: number of strings ``B``.
        length: digits per string ``S``.
        task: ``"reverse"`` or ``"copy"``.
        generator: a ``torch.Generator`` for reproducible batches (default: the global one).
        device: where the tensors go (default: the CPU).

    Returns:
        ``(source, target)``, both ``(B, S)`` int64 token ids in ``0..9``.
    """
    check_positive_int("batch_size", batch_size, allow_zero=True)
    check_positive_int("length", length, allow_zero=True)
    if task not in ("reverse", "copy"):
        raise ValueError(f"task must be 'reverse' or 'copy', got {task!r}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {describe(generator)}")
    source = torch.randint(0, 10, (batch_size, length), generator=generator)  # on the generator's device (CPU)
    target = source.flip(1) if task == "reverse" else source.clone()
    return source.to(device), target.to(device)


def shift_right(target: torch.Tensor, bos_id: int) -> torch.Tensor:
    """The decoder's inputs under teacher forcing: ``[BOS, y_0, ..., y_{T-2}]``.

    At step ``i`` the decoder sees the true previous token and must predict ``y_i``; it never sees
    ``y_i`` itself.

    Args:
        target: ``(B, T)`` token ids.
        bos_id: the begin-of-sequence token id.

    Returns:
        ``(B, T)`` token ids, on the target's device.
    """
    check_tensor("target", target)
    if target.dim() != 2:
        raise ValueError(f"target must be (B, T) token ids, got shape {tuple(target.shape)}")
    check_positive_int("bos_id", bos_id, allow_zero=True)
    bos = torch.full_like(target[:, :1], bos_id)  # (B, 1)
    return torch.cat([bos, target[:, :-1]], dim=1)  # (B, 1) + (B, T - 1) -> (B, T)
