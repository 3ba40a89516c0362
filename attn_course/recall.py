"""Chapter 12: a one-layer model for multi-query associative recall, and its training.

Multi-query associative recall (MQAR, Arora et al., 2023, "Zoology", arXiv 2312.04927) lists
key-value pairs and then asks for every key again (:func:`~attn_course.linear.associative_recall`).
Softmax attention looks each key up among the stored tokens; a recurrent layer must have written
all pairs into its fixed-size state first. This module holds the small model with which chapter 12
compares the two, so that the notebook shows the experiment and not its harness.

The model is one layer with a **token shift**: the input at position ``t`` is the embedding of
token ``t`` plus a second embedding of token ``t - 1``. At a value position the layer then sees the
key just before it, so one attention layer can write the pair (key -> value) into its state, or, for
softmax attention, find the value token whose previous token is the queried key. Published linear
layers get the same information from a short causal convolution on their queries, keys and values
(DeltaNet, Yang et al. 2024; Gated DeltaNet; Qwen3-Next's kernel of width 4); without it a plain
stack of linear layers stays near chance on this task at our budget. The shift is a convolution of
width 2 on the embeddings, the same for every kind of attention, so the comparison stays fair::

    x_t = Embed(tok_t) + Embed_prev(tok_{t-1})           (B, T, E); tok_{-1} is a start token
    x = x + Attention(LayerNorm(x))                       causal, one head, D_k = qk_head_dim
    x = x + MLP(LayerNorm(x))
    logits = Linear(x)                                    (B, T, V)

Shapes: ``B`` batch, ``T`` tokens (``3 N`` for ``N`` pairs), ``E`` model width, ``V`` vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import check_bool, check_positive_int, check_tensor, describe
from .linear import DeltaNetAttention, LinearAttention, associative_recall
from .multihead import MultiHeadAttention

__all__ = ["RECALL_ATTENTIONS", "RecallModel", "train_recall", "recall_accuracy"]

RECALL_ATTENTIONS = ("softmax", "linear", "delta", "gated_delta")


def _check_attention(attention) -> None:
    if not isinstance(attention, str) or attention not in RECALL_ATTENTIONS:
        raise ValueError(f"attention must be one of {RECALL_ATTENTIONS}, got {describe(attention)}")


class RecallModel(nn.Module):
    """One causal attention layer with a token shift, for multi-query associative recall.

    Args:
        vocab_size: tokens ``V`` (keys and values together; :func:`associative_recall` uses
            ``num_keys + num_values``).
        attention: ``"softmax"`` (:class:`~attn_course.MultiHeadAttention`), ``"linear"``
            (:class:`~attn_course.LinearAttention`, elu+1), ``"delta"`` or ``"gated_delta"``
            (:class:`~attn_course.DeltaNetAttention` without or with its gate).
        d_model: model width ``E``.
        num_heads: heads ``H``.
        qk_head_dim: width ``D_k`` of each head's queries and keys. For the linear kinds the state
            of a head is ``(D_k, E / H)``, so ``D_k`` bounds how many pairs it can read back exactly.
        token_shift: add the embedding of the previous token (see the module docstring); False
            gives each position its own token only.
        chunk_size: the delta rule's chunk length (the chunkwise form; the same numbers as the
            recurrence, fewer sequential steps).
        feature_map, normalize: for ``"linear"`` only, passed to
            :class:`~attn_course.LinearAttention` (default ``"elu+1"``, normalised; ``"identity"``
            gives signed features without the normaliser).

    Shape:
        - tokens: ``(B, T)`` integer ids in ``[0, V)`` -> logits ``(B, T, V)``, or ``(B, last, V)`` with
          ``forward(tokens, last=...)``
    """

    def __init__(self, vocab_size: int, attention: str, *, d_model: int = 64, num_heads: int = 1,
                 qk_head_dim: int = 8, token_shift: bool = True, chunk_size: int = 32,
                 feature_map="elu+1", normalize: bool | None = None) -> None:
        super().__init__()
        check_positive_int("vocab_size", vocab_size)
        _check_attention(attention)
        check_positive_int("d_model", d_model)
        check_positive_int("num_heads", num_heads)
        check_positive_int("qk_head_dim", qk_head_dim)
        check_bool("token_shift", token_shift)
        check_positive_int("chunk_size", chunk_size)
        if attention != "linear" and (not (isinstance(feature_map, str) and feature_map == "elu+1") or normalize is not None):
            raise ValueError(f"feature_map and normalize apply to attention='linear' only, got attention={attention!r}")
        if d_model % num_heads != 0:
            raise ValueError(f"num_heads must divide d_model, got d_model={d_model} and num_heads={num_heads}")
        self.vocab_size, self.attention_kind, self.token_shift = vocab_size, attention, token_shift
        self.embedding = nn.Embedding(vocab_size, d_model)
        # the previous token's embedding; id vocab_size is the start token before position 0
        self.previous_embedding = nn.Embedding(vocab_size + 1, d_model) if token_shift else None
        self.attention_norm = nn.LayerNorm(d_model)
        if attention == "softmax":
            self.attention = MultiHeadAttention(d_model, num_heads, qk_head_dim=qk_head_dim, backend="sdpa")
        elif attention == "linear":
            self.attention = LinearAttention(d_model, num_heads, feature_map=feature_map, normalize=normalize,
                                             qk_head_dim=qk_head_dim)
        else:
            self.attention = DeltaNetAttention(d_model, num_heads, use_gate=attention == "gated_delta",
                                               qk_head_dim=qk_head_dim, chunk_size=chunk_size)
        self.mlp = nn.Sequential(nn.LayerNorm(d_model), nn.Linear(d_model, 2 * d_model), nn.GELU(),
                                 nn.Linear(2 * d_model, d_model))
        self.head = nn.Linear(d_model, vocab_size)

    def extra_repr(self) -> str:
        return f"attention={self.attention_kind!r}, token_shift={self.token_shift}"

    def forward(self, tokens: torch.Tensor, *, last: int | None = None) -> torch.Tensor:
        """Logits for every position, or for the last ``last`` positions only (associative recall's
        queries): after the attention everything works position by position, so the MLP and the output
        layer need not run on the others. Their logits are the same either way."""
        check_tensor("tokens", tokens)
        if tokens.dim() != 2 or tokens.is_floating_point() or tokens.dtype == torch.bool:
            raise TypeError(f"tokens must be a (B, T) tensor of integer ids, got {describe(tokens)}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size):
            raise ValueError(f"tokens must be ids in [0, {self.vocab_size}), got values from {int(tokens.min())} "
                             f"to {int(tokens.max())}")
        x = self.embedding(tokens)  # (B, T, E)
        if self.previous_embedding is not None:
            previous = F.pad(tokens, (1, 0), value=self.vocab_size)[:, :-1]  # (B, T): token t - 1, start token first
            x = x + self.previous_embedding(previous)  # (B, T, E)
        h = self.attention_norm(x)
        if self.attention_kind == "softmax":
            mixed, _ = self.attention(h, h, h, is_causal=True, need_weights=False)  # (B, T, E)
        else:
            mixed = self.attention(h)  # (B, T, E), causal
        x = x + mixed  # (B, T, E)
        if last is not None:
            check_positive_int("last", last)
            x = x[:, -last:]  # (B, last, E)
        x = x + self.mlp(x)
        return self.head(x)  # (B, T, V), or (B, last, V)


def train_recall(attention: str, num_pairs: int, *, steps: int = 300, batch_size: int = 64, lr: float = 1e-2,
                 num_keys: int = 64, num_values: int = 64, seed: int = 0, device=None, **model_options) -> RecallModel:
    """Train a :class:`RecallModel` on fresh batches of multi-query associative recall.

    AdamW at a constant learning rate; every step draws a new batch of ``batch_size`` sequences of
    ``num_pairs`` pairs (so the model never sees one twice), and the loss is the cross-entropy at
    the query positions only (the pairs themselves are random and cannot be predicted). The queries
    are the last ``num_pairs`` positions, so only their logits are computed (``forward(tokens,
    last=num_pairs)``: the same loss for about two thirds of the work after the attention).

    Args:
        attention: the kind of attention, one of :data:`RECALL_ATTENTIONS`.
        num_pairs: key-value pairs ``N`` per sequence.
        steps: optimizer steps.
        batch_size: sequences per step.
        lr: AdamW's learning rate.
        num_keys, num_values: the vocabulary of keys and of values (see :func:`associative_recall`).
        seed: seeds the model's initial weights and the training batches (the global generator is
            left as it was).
        device: where to train (default: the CPU).
        **model_options: passed to :class:`RecallModel` (``d_model``, ``num_heads``,
            ``qk_head_dim``, ``token_shift``, ``chunk_size``, and for ``"linear"`` ``feature_map`` and
            ``normalize``).

    Returns:
        The trained model, in eval mode.
    """
    _check_attention(attention)
    check_positive_int("num_pairs", num_pairs)
    check_positive_int("steps", steps)
    check_positive_int("batch_size", batch_size)
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
        raise ValueError(f"lr must be a positive number, got {describe(lr)}")
    check_positive_int("seed", seed, allow_zero=True)
    with torch.random.fork_rng(devices=[]):  # the model's initial weights, without touching the global generator
        torch.manual_seed(seed)
        model = RecallModel(num_keys + num_values, attention, **model_options)
    model = model.to(device)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        tokens, targets = associative_recall(batch_size, num_pairs, num_keys=num_keys, num_values=num_values,
                                             generator=generator, device=device)  # (B, 3N) each
        logits = model(tokens, last=num_pairs)  # (B, N, V): the query positions only
        loss = F.cross_entropy(logits.flatten(0, 1), targets[:, -num_pairs:].flatten())  # every one has a target
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


@torch.no_grad()
def recall_accuracy(model: nn.Module, num_pairs: int, *, num_sequences: int = 1000, num_keys: int = 64,
                    num_values: int = 64, seed: int = 1234) -> float:
    """The fraction of queries whose value ``model`` predicts (argmax), on fresh sequences.

    Args:
        model: maps ``(B, T)`` token ids to ``(B, T, V)`` logits (a :class:`RecallModel`).
        num_pairs: pairs ``N`` per sequence.
        num_sequences: test sequences (each asks ``N`` queries).
        num_keys, num_values: as in training.
        seed: the test set's seed (a different stream from training's).

    Returns:
        The accuracy in ``[0, 1]``; guessing a value at random gives about ``1 / num_values``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {describe(model)}")
    check_positive_int("num_pairs", num_pairs)
    check_positive_int("num_sequences", num_sequences)
    check_positive_int("seed", seed, allow_zero=True)
    parameter = next(model.parameters(), None)
    device = parameter.device if parameter is not None else None
    generator = torch.Generator().manual_seed(seed)
    tokens, targets = associative_recall(num_sequences, num_pairs, num_keys=num_keys, num_values=num_values,
                                         generator=generator, device=device)
    was_training = model.training
    model.eval()
    predictions = model(tokens).argmax(dim=-1)  # (B, 3N)
    model.train(was_training)
    asked = targets != -100  # (B, 3N): the query positions
    return float((predictions[asked] == targets[asked]).float().mean())
