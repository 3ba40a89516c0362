"""Chapter 07, section 3: the translator model, the package's Transformer with its two vocabularies."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from .._checks import describe
from ..transformer import Transformer, TransformerConfig
from .vocab import SOURCE_ALPHABET, TARGET_ALPHABET, CharVocab, pad_sequences

__all__ = ["Translator", "build_translator"]


class Translator(nn.Module):
    """A :class:`~attn_course.Transformer` together with its source and target vocabularies.

    Args:
        config: the model's configuration (vocabulary sizes must match the vocabularies).
        source_vocab, target_vocab: the character vocabularies.

    Shape:
        - src: ``(B, S)`` source ids; tgt: ``(B, T)`` target ids starting with the start symbol
        - logits: ``(B, T, V_tgt)``
    """

    def __init__(self, config: TransformerConfig, source_vocab: CharVocab, target_vocab: CharVocab) -> None:
        super().__init__()
        for name, vocab, size in (("source_vocab", source_vocab, config.src_vocab_size), ("target_vocab", target_vocab, config.tgt_vocab_size)):
            if not isinstance(vocab, CharVocab):
                raise TypeError(f"{name} must be a CharVocab, got {describe(vocab)}")
            if len(vocab) != size:
                raise ValueError(f"{name} has {len(vocab)} symbols but the config says {size}")
        if config.pad_id != CharVocab.pad_id:
            raise ValueError(f"config.pad_id must be {CharVocab.pad_id}, the vocabularies' padding id, got {config.pad_id}")
        self.config = config
        self.source_vocab, self.target_vocab = source_vocab, target_vocab
        self.transformer = Transformer(config)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, need_weights: bool = False):
        """Teacher forcing; see :meth:`attn_course.Transformer.forward`."""
        return self.transformer(src, tgt, need_weights=need_weights)

    def encode_sources(self, sentences: Sequence[str], device=None) -> torch.Tensor:
        """English sentences -> padded ``(B, S)`` source ids (unknown characters raise ValueError)."""
        rows = []
        for i, sentence in enumerate(sentences):
            if not isinstance(sentence, str):
                raise TypeError(f"sentences[{i}] must be a str, got {describe(sentence)}")
            missing = self.source_vocab.unknown(sentence)
            if missing:
                raise ValueError(
                    f"sentences[{i}] = {sentence!r} contains character(s) {missing} that the model never saw; "
                    f"it knows only {''.join(self.source_vocab.characters)!r}"
                )
            rows.append(self.source_vocab.encode(sentence))
        for i, row in enumerate(rows):
            if len(row) + 2 > self.config.max_len:
                raise ValueError(f"sentences[{i}] has {len(row)} characters, but this model reads at most "
                                 f"max_len - 2 = {self.config.max_len - 2}")
        return pad_sequences(rows, CharVocab.pad_id, device)


def build_translator(pairs: Sequence[tuple[str, str]], **config_overrides) -> Translator:
    """A fresh, untrained :class:`Translator` whose vocabularies cover ``pairs`` (and the basic alphabets).

    ``config_overrides`` are fields of :class:`~attn_course.TransformerConfig`; the defaults
    (``d_model=64``, 4 heads, 2 + 2 layers, ``d_ff=256``, no dropout) are those of the config.
    """
    source_vocab = CharVocab.from_texts((e for e, _ in pairs), extra=SOURCE_ALPHABET)
    target_vocab = CharVocab.from_texts((f for _, f in pairs), extra=TARGET_ALPHABET)
    config = TransformerConfig(src_vocab_size=len(source_vocab), tgt_vocab_size=len(target_vocab), pad_id=CharVocab.pad_id,
                               **config_overrides)
    return Translator(config, source_vocab, target_vocab)
