"""Chapter 07, section 2: characters <-> ids, with padding, start and end symbols."""

from __future__ import annotations

from typing import Iterable, Sequence

import torch

from .._checks import describe

__all__ = ["CharVocab", "SOURCE_ALPHABET", "TARGET_ALPHABET", "pad_sequences"]


class CharVocab:
    """A character vocabulary with three special symbols: padding (id 0), start (1) and end (2).

    Args:
        characters: the characters to know (duplicates are fine; they are sorted).

    Example::

        >>> vocab = CharVocab("abc ")
        >>> vocab.encode("cab", add_start=True, add_end=True)
        [1, 6, 4, 5, 2]
        >>> vocab.decode([1, 6, 4, 5, 2, 0, 0])
        'cab'
    """

    PAD, START, END = "<pad>", "<s>", "</s>"
    pad_id, start_id, end_id = 0, 1, 2

    def __init__(self, characters: Iterable[str]) -> None:
        characters = list(characters)
        for c in characters:
            if not isinstance(c, str) or len(c) != 1:
                raise ValueError(f"characters must be single characters, got {c!r}")
        self.characters: list[str] = sorted(set(characters))
        self.symbols: list[str] = [self.PAD, self.START, self.END, *self.characters]
        self._ids = {symbol: i for i, symbol in enumerate(self.symbols)}

    @classmethod
    def from_texts(cls, texts: Iterable[str], extra: str = "") -> "CharVocab":
        """The vocabulary of every character in ``texts`` (plus those in ``extra``)."""
        return cls(set("".join(texts)) | set(extra))

    def __len__(self) -> int:
        return len(self.symbols)

    def __repr__(self) -> str:
        return f"CharVocab({len(self)} symbols: {''.join(self.characters)!r} + pad, start, end)"

    def __eq__(self, other) -> bool:
        return isinstance(other, CharVocab) and other.characters == self.characters

    def unknown(self, text: str) -> list[str]:
        """The characters of ``text`` that the vocabulary does not know, in order of appearance."""
        return list(dict.fromkeys(c for c in text if c not in self._ids or c in (self.PAD, self.START, self.END)))

    def encode(self, text: str, *, add_start: bool = False, add_end: bool = False) -> list[int]:
        """Character ids of ``text``, optionally framed by the start and end symbols.

        Raises:
            ValueError: ``text`` contains a character that is not in the vocabulary.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {describe(text)}")
        missing = self.unknown(text)
        if missing:
            raise ValueError(
                f"text {text!r} contains character(s) {missing} that the vocabulary does not know; "
                f"known characters: {''.join(self.characters)!r}"
            )
        ids = [self._ids[c] for c in text]
        return ([self.start_id] if add_start else []) + ids + ([self.end_id] if add_end else [])

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``: skips padding and start, stops at the first end symbol."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        chars = []
        for i in ids:
            if i == self.end_id:
                break
            if i in (self.pad_id, self.start_id):
                continue
            chars.append(self._symbol(i))
        return "".join(chars)

    def symbols_of(self, ids: Iterable[int]) -> list[str]:
        """Every id as its symbol (special symbols included), for plot labels."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return [self._symbol(i) for i in ids]

    def _symbol(self, i: int) -> str:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(self.symbols):
            raise ValueError(f"ids must be ints from 0 to {len(self.symbols) - 1} (the vocabulary has {len(self.symbols)} symbols), got {i!r}")
        return self.symbols[i]


# Characters known even if the training pairs happen to lack them, so that any lowercase sentence encodes.
SOURCE_ALPHABET = "abcdefghijklmnopqrstuvwxyz '"
TARGET_ALPHABET = "abcdefghijklmnopqrstuvwxyzàâçéèêëîïôûùü '"


def pad_sequences(sequences: Sequence[Sequence[int]], pad_id: int = CharVocab.pad_id, device=None) -> torch.Tensor:
    """Id lists of different lengths -> one right-padded tensor of ids.

    Shape:
        ``B`` lists, the longest of length ``T`` -> ``(B, T)`` (dtype long)
    """
    longest = max((len(s) for s in sequences), default=0)
    batch = torch.full((len(sequences), longest), pad_id, dtype=torch.long)
    for i, s in enumerate(sequences):
        batch[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return batch.to(device) if device is not None else batch
