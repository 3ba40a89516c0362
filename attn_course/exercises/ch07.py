"""Checks for the exercises of chapter 07, the character-level translator."""

from __future__ import annotations

import torch

from ..transformer import DecoderLayer
from ..translator import DEFAULT_LEXICON, french_noun_phrase
from . import call, exercise, expect, expect_tensor

__all__ = ["check_french_noun_phrase", "check_sample_next", "check_decoder_mask"]

# New nouns that the student's rules must handle too: one vowel-initial of each gender.
NEW_NOUNS = {"island": ("île", "f"), "computer": ("ordinateur", "m"), "mouse": ("souris", "f")}


def _cases():
    """(description, arguments) in the order of the phenomena, so that the first failure names the rule."""
    adjectives = DEFAULT_LEXICON.adjectives
    chat, voiture, arbre, ecole = ("chat", "m"), ("voiture", "f"), ("arbre", "m"), ("école", "f")
    yield "the article agrees with the noun's gender", ("the", None, *chat)
    yield "the article agrees with the noun's gender", ("the", None, *voiture)
    yield "the indefinite article agrees with the noun's gender", ("a", None, *voiture)
    yield "most adjectives go after the noun", ("the", adjectives["red"], *chat)
    yield "a pre-nominal adjective goes before the noun", ("the", adjectives["small"], *chat)
    yield "the adjective agrees with a feminine noun", ("a", adjectives["green"], *voiture)
    yield "the adjective agrees with a feminine noun (irregular form)", ("the", adjectives["white"], *voiture)
    yield "a feminine pre-nominal adjective", ("a", adjectives["good"], *voiture)
    yield "elision before a vowel: l'", ("the", None, *arbre)
    yield "elision before a vowel, feminine too", ("the", adjectives["blue"], *ecole)
    yield "no elision when a pre-nominal adjective comes first", ("the", adjectives["big"], *arbre)
    yield "no elision with un/une", ("a", None, *ecole)
    for english, (noun, gender) in NEW_NOUNS.items():
        for article in ("the", "a"):
            for adjective in (None, "small", "black"):
                entry = adjectives[adjective] if adjective else None
                yield f"the new noun {english!r} -> {noun!r} ({'feminine' if gender == 'f' else 'masculine'})", (article, entry, noun, gender)
    for article in ("the", "a"):
        for adjective in [None, *adjectives.values()]:
            for noun, gender in DEFAULT_LEXICON.nouns.values():
                yield "every noun phrase of the lexicon", (article, adjective, noun, gender)


@exercise(
    "Exercise 1, add a new noun: the rules of a French noun phrase",
    hint="choose the adjective form by gender, put it before or after the noun by its position, then the "
    "article: un/une for 'a'; for 'the', l' (no space) if the next word starts with a vowel or h, else le/la",
)
def check_french_noun_phrase(noun_phrase) -> str:
    checked = 0
    for rule, args in _cases():
        got = call(noun_phrase, *args)
        expected = french_noun_phrase(*args)
        expect(isinstance(got, str), f"return a str such as 'le chat rouge'; got {type(got).__name__} {got!r}")
        expect(
            got == expected,
            f"{rule}: for article={args[0]!r}, adjective={args[1]!r}, noun={args[2]!r}, gender={args[3]!r} "
            f"expected {expected!r}, got {got!r}",
        )
        checked += 1
    return (f"all {checked} noun phrases are right, including the new nouns {', '.join(repr(n) for n, _ in NEW_NOUNS.values())}: "
            "adding a noun to the language takes only its French and its gender.")


@exercise(
    "Exercise 2, greedy decoding or sampling",
    hint="temperature 0: logits.argmax(dim=-1); otherwise probabilities = torch.softmax(logits / temperature, dim=-1) "
    "and torch.multinomial(probabilities, 1, generator=generator).squeeze(1)",
)
def check_sample_next(sample_next) -> str:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 3.0, 0.5, 0.5]])  # (B=2, V=4)
    greedy = call(sample_next, logits, 0.0, torch.Generator().manual_seed(0))
    greedy = expect_tensor(greedy, what="sample_next(logits of shape (2, 4), temperature=0)", shape=(2,))
    expect(not greedy.is_floating_point(), f"return integer ids (torch.long), got dtype {greedy.dtype}")
    expect(greedy.tolist() == [0, 1], f"temperature 0 must pick the largest logit of each row: expected [0, 1], got {greedy.tolist()}")

    many = logits[:1].expand(20000, 4)  # the same distribution 20,000 times
    for temperature in (1.0, 0.5, 2.0):
        first = call(sample_next, many, temperature, torch.Generator().manual_seed(1))
        first = expect_tensor(first, what=f"sample_next(logits of shape (20000, 4), temperature={temperature})", shape=(20000,))
        again = call(sample_next, many, temperature, torch.Generator().manual_seed(1))
        expect(torch.equal(first, again), "two calls with generators seeded alike gave different samples: "
               "pass generator=generator to torch.multinomial")
        frequencies = torch.bincount(first.long().cpu(), minlength=4)[:4].double() / len(first)
        expected = torch.softmax(logits[0].double() / temperature, dim=-1)
        if not torch.allclose(frequencies, expected, atol=0.02):
            at_one = torch.softmax(logits[0].double(), dim=-1)
            detail = (" They match temperature 1: divide the logits by the temperature." if temperature != 1.0
                      and torch.allclose(frequencies, at_one, atol=0.02) else "")
            expect(False, f"at temperature {temperature} the characters should come up with frequencies "
                   f"{[round(p, 3) for p in expected.tolist()]}, yours came up {[round(p, 3) for p in frequencies.tolist()]}.{detail}")
    return "greedy at temperature 0, and samples that follow softmax(logits / temperature), reproducibly."


@exercise(
    "Exercise 3, the decoder's causal mask by hand",
    hint="DecoderLayer (like nn.MultiheadAttention) wants True where attending is NOT allowed: "
    "torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)",
)
def check_decoder_mask(decoder_mask) -> str:
    for T in (4, 7, 1):
        mask = expect_tensor(call(decoder_mask, T), what=f"decoder_mask({T})", shape=(T, T))
        expect(mask.dtype == torch.bool, f"decoder_mask({T}) must be a bool tensor, got dtype {mask.dtype}")
        blocked = torch.ones(T, T, dtype=torch.bool).triu(1)
        if T > 1 and torch.equal(mask.cpu(), ~blocked):
            expect(False, f"decoder_mask({T}) is True where attending IS allowed (the convention of "
                   "F.scaled_dot_product_attention and ac.causal_mask); DecoderLayer wants True where it is blocked")
        if T > 1 and torch.equal(mask.cpu(), blocked.T):
            expect(False, f"decoder_mask({T}) blocks the past instead of the future: row t (a query) may see columns 0..t")
        if T > 1 and torch.equal(mask.cpu(), ~blocked.T):
            expect(False, f"decoder_mask({T}) lets every position see the future: keep the upper triangle (above the diagonal) True")
        expect(torch.equal(mask.cpu(), blocked), f"decoder_mask({T}) should be\n{blocked.int()}\ngot\n{mask.int()}")
    torch.manual_seed(0)
    layer = DecoderLayer(16, 4, 32).eval()
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 3, 16)
    with torch.no_grad():
        yours, _, _ = layer(x, memory, tgt_attn_mask=call(decoder_mask, 5), is_causal=False)
        reference, _, _ = layer(x, memory, is_causal=True)
    expect(torch.allclose(yours, reference, atol=1e-6), "with your mask the decoder layer's output differs from is_causal=True")
    return "with your mask, DecoderLayer(..., is_causal=False) gives exactly what is_causal=True gives."
