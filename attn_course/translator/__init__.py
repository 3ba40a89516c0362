"""Chapter 07: a character-level English -> French translator for a small generated language.

The chapter's sections, one module each (every public name is importable from here too)::

    language.py     section 1  the toy grammar: Lexicon, toy_pairs, reference_translation, held_out_pairs
    vocab.py        section 2  characters <-> ids: CharVocab, pad_sequences
    model.py        section 3  Translator (the package's Transformer and its two vocabularies), build_translator
    training.py     section 4  train_step (one step of teacher forcing), train (the whole run) and
                               fine_tune (more steps for a trained model, exercise 1)
    decoding.py     sections 5-6  translate (greedy or sampled, with attention maps), evaluate,
                                  beam_search, beam_translate and sequence_log_probs (exercise 3)
    analysis.py     sections 6-7  reading the attention maps: word_attention, alignment_scores,
                                  reordering_scores, entropy_share, word_start_entropy, attention_grid,
                                  first_wrong_character (where a mistake begins)
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

from .analysis import (MISTAKE_PLACES, alignment_scores, attention_grid, entropy_share, first_wrong_character,
                       reordering_scores, visible_spaces, word_attention, word_dictionary, word_start_entropy,
                       word_ticks, words_of)
from .checkpoints import load_checkpoint, save_checkpoint
from .cli import main
from .decoding import beam_search, beam_translate, evaluate, next_char_log_probs, sequence_log_probs, translate
from .language import (
    ARTICLES,
    DEFAULT_LEXICON,
    ELIDING_INITIALS,
    GENDERS,
    POSITIONS,
    Lexicon,
    count_sentences,
    english_noun_phrase,
    french_noun_phrase,
    held_out_pairs,
    reference_translation,
    sentence_probability,
    toy_pairs,
)
from .model import Translator, build_translator
from .training import TrainingSettings, fine_tune, train, train_step
from .vocab import SOURCE_ALPHABET, TARGET_ALPHABET, CharVocab, pad_sequences

__all__ = [
    "Lexicon",
    "DEFAULT_LEXICON",
    "french_noun_phrase",
    "english_noun_phrase",
    "reference_translation",
    "count_sentences",
    "sentence_probability",
    "toy_pairs",
    "CharVocab",
    "pad_sequences",
    "Translator",
    "TrainingSettings",
    "build_translator",
    "train",
    "train_step",
    "fine_tune",
    "translate",
    "evaluate",
    "next_char_log_probs",
    "sequence_log_probs",
    "beam_search",
    "beam_translate",
    "words_of",
    "word_attention",
    "word_dictionary",
    "alignment_scores",
    "reordering_scores",
    "entropy_share",
    "word_start_entropy",
    "word_ticks",
    "visible_spaces",
    "attention_grid",
    "first_wrong_character",
    "MISTAKE_PLACES",
    "held_out_pairs",
    "save_checkpoint",
    "load_checkpoint",
    "main",
]
