"""Chapter 07: a character-level English -> French translator for a small generated language.

The chapter's sections, one module each (every public name is importable from here too)::

    language.py     section 1  the toy grammar: Lexicon, toy_pairs, reference_translation, held_out_pairs
    vocab.py        section 2  characters <-> ids: CharVocab, pad_sequences
    model.py        section 3  Translator (the package's Transformer and its two vocabularies), build_translator
    training.py     section 4  train_step (one step of teacher forcing) and train (the whole run)
    decoding.py     sections 5-6  translate (greedy or sampled, with attention maps), evaluate
    checkpoints.py  save_checkpoint, load_checkpoint
    cli.py          the command line (``python -m attn_course.translator``)

The language is small but has real structure (word order, gender agreement, elision), so that a
model cannot pass by memorising: :func:`count_sentences` = 1,179,648 distinct sentences. The
attention itself comes from earlier chapters: :class:`~attn_course.Transformer` (``attn_course.transformer``).

Command line (``python -m attn_course.translator --help``)::

    python -m attn_course.translator train --out translator.pt
    python -m attn_course.translator translate --checkpoint translator.pt "the red cat sees a small dog"
    python -m attn_course.translator evaluate --checkpoint translator.pt --num-sentences 1000
"""

from __future__ import annotations

from .checkpoints import load_checkpoint, save_checkpoint
from .cli import main
from .decoding import evaluate, translate
from .language import (
    ARTICLES,
    DEFAULT_LEXICON,
    GENDERS,
    POSITIONS,
    Lexicon,
    count_sentences,
    english_noun_phrase,
    french_noun_phrase,
    held_out_pairs,
    reference_translation,
    toy_pairs,
)
from .model import Translator, build_translator
from .training import TrainingSettings, train, train_step
from .vocab import SOURCE_ALPHABET, TARGET_ALPHABET, CharVocab, pad_sequences

__all__ = [
    "Lexicon",
    "DEFAULT_LEXICON",
    "french_noun_phrase",
    "english_noun_phrase",
    "reference_translation",
    "count_sentences",
    "toy_pairs",
    "CharVocab",
    "pad_sequences",
    "Translator",
    "TrainingSettings",
    "build_translator",
    "train",
    "train_step",
    "translate",
    "evaluate",
    "held_out_pairs",
    "save_checkpoint",
    "load_checkpoint",
    "main",
]
