"""Checks for the exercises of chapter 07, the character-level translator."""

from __future__ import annotations

import torch

from ..transformer import DecoderLayer
from ..translator import DEFAULT_LEXICON, french_noun_phrase
from . import Mismatch, call, exercise, expect, expect_tensor

__all__ = ["check_french_noun_phrase", "check_sample_next", "check_decoder_mask", "check_post_norm_decoder_layer"]

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
            expect(False, f"decoder_mask({T}) also blocks the diagonal: each position must see itself (row 0 would see "
                   "nothing at all); only the keys above the diagonal are the future")
        expect(torch.equal(mask.cpu(), blocked), f"decoder_mask({T}) should be\n{blocked.int()}\ngot\n{mask.int()}")
    torch.manual_seed(0)
    layer = DecoderLayer(16, 4, 32).eval()
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 3, 16)
    with torch.no_grad():
        yours, _, _ = layer(x, memory, tgt_attn_mask=call(decoder_mask, 5), is_causal=False)
        reference, _, _ = layer(x, memory, is_causal=True)
    expect(torch.allclose(yours, reference, atol=1e-6), "with your mask the decoder layer's output differs from is_causal=True")
    return "with your mask, DecoderLayer(..., is_causal=False) gives exactly what is_causal=True gives."


def _wirings(layer: DecoderLayer, x, memory, memory_padding) -> dict:
    """The right post-norm output and the outputs of the plausible wrong wirings, by name."""
    self_attn, cross_attn, ffn = layer.self_attn, layer.cross_attn, layer.feed_forward
    n1, n2, n3 = layer.norm1, layer.norm2, layer.norm3

    def attend_self(h, causal=True):
        return self_attn(h, h, h, is_causal=causal, need_weights=False)[0]

    def attend_source(h, padding=memory_padding, keys=None):
        keys = memory if keys is None else keys
        return cross_attn(h, keys, keys, key_padding_mask=padding, need_weights=False)[0]

    def post(attend_self_fn=attend_self, attend_source_fn=attend_source, residual=True, norms=(n1, n2, n3)):
        a, b, c = norms
        h = a((x if residual else 0) + attend_self_fn(x))
        h = b((h if residual else 0) + attend_source_fn(h))
        return c((h if residual else 0) + ffn(h))

    def pre_norm():
        h = x + attend_self(n1(x))
        h = h + attend_source(n2(h))
        return h + ffn(n3(h))

    return {
        "right": post(),
        "pre-norm": pre_norm(),
        "no causal mask": post(attend_self_fn=lambda h: attend_self(h, causal=False)),
        "padding attended": post(attend_source_fn=lambda h: attend_source(h, padding=None)),
        "cross-attention to itself": post(attend_source_fn=lambda h: attend_source(h, padding=None, keys=h)),
        "no residual": post(residual=False),
        "norms in another order": post(norms=(n3, n2, n1)),
    }


_WIRING_MESSAGES = {
    "pre-norm": "that is the pre-norm wiring, x + sublayer(norm(x)) (what this layer's own forward does); "
                "post-norm normalises after the residual sum: x = norm(x + sublayer(x))",
    "no causal mask": "the self-attention sees the future: pass is_causal=True to layer.self_attn",
    "padding attended": "the cross-attention reads the source's padding: pass key_padding_mask=memory_padding "
                        "(True at padding) to layer.cross_attn",
    "cross-attention to itself": "the cross-attention takes its keys and values from the decoder; they come from "
                                 "memory (the encoder's output): layer.cross_attn(h, memory, memory, ...)",
    "no residual": "the residual connections are missing: each sub-layer's output is added to its input "
                   "before the norm, norm(x + sublayer(x))",
    "norms in another order": "the right wiring with the norms swapped: norm1 follows the self-attention, norm2 "
                              "the cross-attention, norm3 the feed-forward network",
}


@exercise(
    "Exercise 4, the original (post-norm) decoder layer",
    hint="x = layer.norm1(x + layer.self_attn(x, x, x, is_causal=True)[0]); then the same with norm2 around "
    "layer.cross_attn(x, memory, memory, key_padding_mask=memory_padding)[0]; then norm3 around layer.feed_forward(x)",
)
def check_post_norm_decoder_layer(post_norm_decoder_layer) -> str:
    torch.manual_seed(0)
    layer = DecoderLayer(16, 4, 32, norm_first=True).eval()  # a pre-norm layer: its own forward is not the answer
    with torch.no_grad():  # norms that are not the identity, so that a misplaced norm shows
        for norm in (layer.norm1, layer.norm2, layer.norm3):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
    post_norm = DecoderLayer(16, 4, 32, norm_first=False).eval()
    post_norm.load_state_dict(layer.state_dict())
    x, memory = torch.randn(2, 6, 16), torch.randn(2, 5, 16)  # (B, T, E), (B, S, E)
    memory_padding = torch.tensor([[False] * 5, [False, False, False, True, True]])  # (B, S), True at padding
    with torch.no_grad():
        got = call(post_norm_decoder_layer, layer, x.clone(), memory.clone(), memory_padding.clone())
        reference, _, _ = post_norm(x, memory, memory_key_padding_mask=memory_padding)
        wirings = _wirings(layer, x, memory, memory_padding)
    if isinstance(got, tuple):
        expect(False, "return only the layer's output tensor (B, T, E), not a tuple")
    got = expect_tensor(got, what="post_norm_decoder_layer(layer, x of shape (2, 6, 16), memory of shape (2, 5, 16), ...)",
                        shape=(2, 6, 16))
    got = got.detach().float().cpu()
    if torch.allclose(got, reference, atol=1e-5, rtol=1e-4):
        return ("your post-norm wiring gives exactly what DecoderLayer(norm_first=False) gives, with the same weights: "
                "the original Transformer's layer.")
    for name, message in _WIRING_MESSAGES.items():
        if torch.allclose(got, wirings[name], atol=1e-5, rtol=1e-4):
            raise Mismatch(message)
    if torch.allclose(got, x):
        raise Mismatch("the output equals the input: apply the three sub-layers")
    worst = float((got - reference).abs().max())
    raise Mismatch(f"your output differs from the post-norm layer's by up to {worst:.3g}: norm1 after the causal "
                   "self-attention, norm2 after the cross-attention to memory, norm3 after the feed-forward network, "
                   "each around a residual sum")
