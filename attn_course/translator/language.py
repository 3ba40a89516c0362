"""The toy language of chapter 07, section 1: a small English grammar and its French translation by rules.

- 16 nouns of both genders, 11 adjectives, 8 verbs, the articles *the* and *a/an*: 37 English words;
  sentences are ``subject verb object``, each noun phrase ``article [adjective] noun``;
- most French adjectives follow the noun (*the red cat* -> *le chat rouge*: attention must reorder),
  a few precede it (*the small cat* -> *le petit chat*);
- articles and adjectives agree with the noun's gender (*the* -> *le*, *la* or *l'*; *green* ->
  *vert* or *verte*; *white* -> *blanc* or *blanche*), so one English word has several French spellings;
- elision: *le* and *la* become *l'* when the word right after the article starts with a vowel
  (accented or not: *école*, *île*, *âne*, *œuf*) or a mute h (*l'homme*); that word may be an
  adjective, so *the big tree* is *le grand arbre* (*grand* starts with a consonant) while an
  adjective that starts with a vowel elides itself (*l'ancienne école*, not in the lexicon).
  French does not elide before an aspirated h (*le héros*) or a consonant y (*le yaourt*); which h
  is aspirated is a property of each word, not of its spelling, and the lexicon's only h-noun,
  *homme*, has a mute one, so the rule here elides before every h and never before y.

:func:`count_sentences` = 1,179,648 distinct sentences; :func:`toy_pairs` draws training pairs and
:func:`held_out_pairs` test pairs that are not among them.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Sequence

from .._checks import check_positive_int, describe

__all__ = [
    "Lexicon", "DEFAULT_LEXICON", "ARTICLES", "english_noun_phrase", "french_noun_phrase",
    "reference_translation", "count_sentences", "sentence_probability", "toy_pairs", "held_out_pairs",
]

GENDERS = ("m", "f")
POSITIONS = ("before", "after")
# Vowels, accented or not (and the ligature œ), and h: every h of the lexicon is mute (homme). A y is a
# consonant here (le yaourt).
ELIDING_INITIALS = frozenset("aeiouàâäéèêëîïôöûùüœæh")


@dataclass(frozen=True)
class Lexicon:
    """The words of the toy language.

    Args:
        nouns: English noun -> ``(French noun, gender)``, gender ``"m"`` or ``"f"``.
        adjectives: English adjective -> ``(masculine, feminine, position)``, position ``"before"``
            or ``"after"`` the noun in French.
        verbs: English verb (third person) -> French verb.
    """

    nouns: dict
    adjectives: dict
    verbs: dict

    def __post_init__(self) -> None:
        for english, entry in self.nouns.items():
            if not (isinstance(entry, tuple) and len(entry) == 2 and entry[1] in GENDERS):
                raise ValueError(f"nouns[{english!r}] must be (french, 'm' or 'f'), got {entry!r}")
        for english, entry in self.adjectives.items():
            if not (isinstance(entry, tuple) and len(entry) == 3 and entry[2] in POSITIONS):
                raise ValueError(f"adjectives[{english!r}] must be (masculine, feminine, 'before' or 'after'), got {entry!r}")
        for table in ("nouns", "adjectives", "verbs"):
            for word in getattr(self, table):
                if not word or not word.isalpha() or not word.islower():
                    raise ValueError(f"{table} must have lowercase one-word English keys, got {word!r}")

    def with_noun(self, english: str, french: str, gender: str) -> "Lexicon":
        """A copy of the lexicon with one more noun (for example ``with_noun("island", "île", "f")``)."""
        return dataclasses.replace(self, nouns={**self.nouns, english: (french, gender)})

    @property
    def english_words(self) -> list[str]:
        """Every English word the grammar can produce."""
        return ["the", "a", "an", *self.nouns, *self.adjectives, *self.verbs]


DEFAULT_LEXICON = Lexicon(
    nouns={
        "cat": ("chat", "m"), "dog": ("chien", "m"), "boy": ("garçon", "m"), "book": ("livre", "m"),
        "bird": ("oiseau", "m"), "tree": ("arbre", "m"), "man": ("homme", "m"), "elephant": ("éléphant", "m"),
        "girl": ("fille", "f"), "house": ("maison", "f"), "car": ("voiture", "f"), "apple": ("pomme", "f"),
        "woman": ("femme", "f"), "school": ("école", "f"), "orange": ("orange", "f"), "star": ("étoile", "f"),
    },
    adjectives={
        "small": ("petit", "petite", "before"), "big": ("grand", "grande", "before"),
        "young": ("jeune", "jeune", "before"), "good": ("bon", "bonne", "before"),
        "red": ("rouge", "rouge", "after"), "black": ("noir", "noire", "after"),
        "green": ("vert", "verte", "after"), "white": ("blanc", "blanche", "after"),
        "blue": ("bleu", "bleue", "after"), "happy": ("heureux", "heureuse", "after"),
        "fast": ("rapide", "rapide", "after"),
    },
    verbs={
        "sees": "voit", "likes": "aime", "eats": "mange", "follows": "suit",
        "finds": "trouve", "watches": "regarde", "draws": "dessine", "takes": "prend",
    },
)

ARTICLES = ("the", "a")


def _check_article(article) -> None:
    if article not in ARTICLES:
        raise ValueError(f"article must be 'the' or 'a', got {article!r}")


def english_noun_phrase(article: str, adjective: str | None, noun: str) -> str:
    """``"the"``/``"a"``, an optional adjective and a noun, in English (``a`` becomes ``an`` before a vowel)."""
    _check_article(article)
    words = ([adjective] if adjective else []) + [noun]
    if article == "a" and words[0][0] in "aeiou":
        article = "an"
    return " ".join([article, *words])


def french_noun_phrase(article: str, adjective: tuple | None, noun: str, gender: str) -> str:
    """The French noun phrase: gender agreement, adjective position and elision.

    Args:
        article: ``"the"`` or ``"a"`` (the English article).
        adjective: None, or the lexicon entry ``(masculine, feminine, position)``.
        noun: the French noun.
        gender: ``"m"`` or ``"f"``.

    Returns:
        For example ``"la voiture verte"``, ``"le petit chat"``, ``"l'arbre"``, ``"une bonne pomme"``.
    """
    _check_article(article)
    if gender not in GENDERS:
        raise ValueError(f"gender must be 'm' or 'f', got {gender!r}")
    words = [noun]
    if adjective is not None:
        masculine, feminine, position = adjective
        form = masculine if gender == "m" else feminine
        words = [form, noun] if position == "before" else [noun, form]
    if article == "a":
        return " ".join(["un" if gender == "m" else "une", *words])
    if words[0][0] in ELIDING_INITIALS:
        return "l'" + " ".join(words)  # elision: l'arbre, l'école (no space after the apostrophe)
    return " ".join(["le" if gender == "m" else "la", *words])


def _noun_phrases(lexicon: Lexicon) -> list[tuple[str, str]]:
    """Every (English, French) noun phrase of the lexicon, in a fixed order."""
    phrases = []
    for article in ARTICLES:
        for adjective in [None, *lexicon.adjectives]:
            for noun, (french_noun, gender) in lexicon.nouns.items():
                entry = lexicon.adjectives[adjective] if adjective else None
                phrases.append((english_noun_phrase(article, adjective, noun), french_noun_phrase(article, entry, french_noun, gender)))
    return phrases


def count_sentences(lexicon: Lexicon = DEFAULT_LEXICON) -> int:
    """How many distinct sentences the grammar has: ``(noun phrases)^2 * verbs``."""
    phrases = 2 * (len(lexicon.adjectives) + 1) * len(lexicon.nouns)
    return phrases * phrases * len(lexicon.verbs)


def sentence_probability(english: str, lexicon: Lexicon = DEFAULT_LEXICON, adjective_rate: float = 0.5) -> float:
    """The chance that one draw of :func:`toy_pairs`' generator is ``english``.

    A sentence is a noun phrase, a verb and a noun phrase, drawn independently:
    ``P = P(subject) * 1 / verbs * P(object)``; a noun phrase is an article (1 in 2), then an
    adjective (``adjective_rate / adjectives`` for a given one) or none (``1 - adjective_rate``), then
    a noun (``1 / nouns``). (:func:`toy_pairs` redraws a sentence it already has, so its pairs are
    distinct; this is the chance of one draw before that.)
    """
    reference_translation(english, lexicon)  # raises unless the sentence belongs to the language
    words = ["a" if word == "an" else word for word in english.split()]

    def noun_phrase(i: int) -> tuple[float, int]:  # the probability of the phrase starting at word i, where it ends
        has_adjective = words[i + 1] in lexicon.adjectives
        adjective = adjective_rate / len(lexicon.adjectives) if has_adjective else 1 - adjective_rate
        return (1 / len(ARTICLES)) * adjective / len(lexicon.nouns), i + 2 + has_adjective

    p_subject, verb_at = noun_phrase(0)
    p_object, _ = noun_phrase(verb_at + 1)
    return p_subject / len(lexicon.verbs) * p_object


def reference_translation(english: str, lexicon: Lexicon = DEFAULT_LEXICON) -> str:
    """Translate a sentence of the toy language by its rules (the answer the model should learn).

    Raises:
        ValueError: the sentence is not ``article [adjective] noun verb article [adjective] noun``.
    """
    if not isinstance(english, str):
        raise TypeError(f"english must be a str, got {describe(english)}")
    words = english.split()

    def noun_phrase(i: int) -> tuple[str, int]:
        if i >= len(words) or words[i] not in ("the", "a", "an"):
            raise ValueError(f"expected 'the', 'a' or 'an' at word {i} of {english!r}")
        article = "the" if words[i] == "the" else "a"
        adjective = words[i + 1] if i + 1 < len(words) and words[i + 1] in lexicon.adjectives else None
        j = i + 1 + (adjective is not None)
        if j >= len(words) or words[j] not in lexicon.nouns:
            raise ValueError(f"expected a noun at word {j} of {english!r}; nouns are {sorted(lexicon.nouns)}")
        if english_noun_phrase(article, adjective, words[j]).split() != words[i : j + 1]:
            raise ValueError(f"wrong article in {' '.join(words[i : j + 1])!r}")
        french_noun, gender = lexicon.nouns[words[j]]
        entry = lexicon.adjectives[adjective] if adjective else None
        return french_noun_phrase(article, entry, french_noun, gender), j + 1

    subject, i = noun_phrase(0)
    if i >= len(words) or words[i] not in lexicon.verbs:
        raise ValueError(f"expected a verb at word {i} of {english!r}; verbs are {sorted(lexicon.verbs)}")
    verb = lexicon.verbs[words[i]]
    obj, end = noun_phrase(i + 1)
    if end != len(words):
        raise ValueError(f"unexpected words after the object in {english!r}: {words[end:]}")
    return f"{subject} {verb} {obj}"


def toy_pairs(n: int, seed: int = 0, *, lexicon: Lexicon = DEFAULT_LEXICON, adjective_rate: float = 0.5) -> list[tuple[str, str]]:
    """Draw ``n`` distinct ``(english, french)`` sentence pairs from the toy grammar.

    Each noun phrase gets an adjective with probability ``adjective_rate`` (otherwise it is bare);
    articles, adjectives, nouns and verbs are drawn uniformly. The same ``n``, ``seed`` and lexicon
    always give the same list, and the first ``k`` pairs of ``toy_pairs(n, seed)`` are
    ``toy_pairs(k, seed)``.

    Args:
        n: how many pairs (at most :func:`count_sentences`).
        seed: the random seed.
        lexicon: the words (default :data:`DEFAULT_LEXICON`).
        adjective_rate: probability that a noun phrase has an adjective.

    Returns:
        A list of ``n`` distinct pairs of strings.
    """
    check_positive_int("n", n, allow_zero=True)
    check_positive_int("seed", seed, allow_zero=True)
    if not isinstance(lexicon, Lexicon):
        raise TypeError(f"lexicon must be a Lexicon, got {describe(lexicon)}")
    if isinstance(adjective_rate, bool) or not isinstance(adjective_rate, (int, float)) or not 0 < adjective_rate < 1:
        raise ValueError(f"adjective_rate must be a float strictly between 0 and 1, got {adjective_rate!r}")
    total = count_sentences(lexicon)
    if n > total // 2:
        raise ValueError(f"n must be at most half the {total:,} sentences of the grammar (to draw them at random), got {n:,}")
    rng = random.Random(seed)
    nouns, adjectives, verbs = list(lexicon.nouns), list(lexicon.adjectives), list(lexicon.verbs)

    def noun_phrase() -> tuple[str, str]:
        article = rng.choice(ARTICLES)
        adjective = rng.choice(adjectives) if rng.random() < adjective_rate else None
        noun = rng.choice(nouns)
        french_noun, gender = lexicon.nouns[noun]
        entry = lexicon.adjectives[adjective] if adjective else None
        return english_noun_phrase(article, adjective, noun), french_noun_phrase(article, entry, french_noun, gender)

    pairs, seen = [], set()
    while len(pairs) < n:
        (subject_en, subject_fr), verb, (object_en, object_fr) = noun_phrase(), rng.choice(verbs), noun_phrase()
        english = f"{subject_en} {verb} {object_en}"
        if english not in seen:
            seen.add(english)
            pairs.append((english, f"{subject_fr} {lexicon.verbs[verb]} {object_fr}"))
    return pairs


def held_out_pairs(n: int, training_pairs: Sequence[tuple[str, str]], seed: int = 12345) -> list[tuple[str, str]]:
    """``n`` pairs of the toy language that are not in ``training_pairs`` (drawn with ``seed``)."""
    check_positive_int("n", n)
    seen = {english for english, _ in training_pairs}
    candidates = toy_pairs(n + len(seen), seed=seed)
    unseen = [pair for pair in candidates if pair[0] not in seen]
    return unseen[:n]
