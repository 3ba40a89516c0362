"""Every chapter 07 check with a right answer, wrong answers (the message says what is wrong), a
crashing answer (an "error" feedback, no traceback) and the untouched scaffold ("not attempted")."""

import pytest
import torch

from attn_course.exercises.ch07 import (
    check_decoder_mask,
    check_french_noun_phrase,
    check_post_norm_decoder_layer,
    check_sample_next,
)
from attn_course.translator import french_noun_phrase


pytestmark = pytest.mark.usefixtures("one_thread")


def scaffold(*args):
    ...


def crashing(*args):
    raise RuntimeError("boom")


# --------------------------------------------------------------------------- exercise 1

def noun_phrase_right(article, adjective, noun, gender):
    words = [noun]
    if adjective is not None:
        form = adjective[0] if gender == "m" else adjective[1]
        words = [form, noun] if adjective[2] == "before" else [noun, form]
    if article == "a":
        return " ".join(["un" if gender == "m" else "une"] + words)
    if words[0][0] in "aeiouéèêîôh":
        return "l'" + " ".join(words)
    return " ".join(["le" if gender == "m" else "la"] + words)


def noun_phrase_no_elision(article, adjective, noun, gender):
    return french_noun_phrase(article, adjective, "x" + noun, gender).replace("x", "", 1) if article == "the" and adjective is None and noun[0] in "aeiouéîh" else french_noun_phrase(article, adjective, noun, gender)


def noun_phrase_always_after(article, adjective, noun, gender):
    if adjective is not None:
        adjective = (adjective[0], adjective[1], "after")
    return french_noun_phrase(article, adjective, noun, gender)


def noun_phrase_no_agreement(article, adjective, noun, gender):
    if adjective is not None:
        adjective = (adjective[0], adjective[0], adjective[2])
    return french_noun_phrase(article, adjective, noun, gender)


def noun_phrase_elides_through_adjective(article, adjective, noun, gender):
    text = french_noun_phrase(article, adjective, noun, gender)
    if article == "the" and noun[0] in "aeiouéîh" and adjective is not None and adjective[2] == "before":
        return "l'" + text.split(" ", 1)[1]
    return text


def noun_phrase_space_after_l(article, adjective, noun, gender):
    return french_noun_phrase(article, adjective, noun, gender).replace("l'", "l' ")


def noun_phrase_only_known_vowels(article, adjective, noun, gender):
    """Elides before plain vowels only: fails on the new noun 'île'."""
    text = french_noun_phrase(article, adjective, noun, gender)
    if text.startswith("l'î"):
        return "la " + text[2:]
    return text


def noun_phrase_no_elision_before_h(article, adjective, noun, gender):
    """Elides before vowels only: fails on 'homme' (a mute h)."""
    text = french_noun_phrase(article, adjective, noun, gender)
    if text.startswith("l'h"):
        return ("le " if gender == "m" else "la ") + text[2:]
    return text


def noun_phrase_always_une(article, adjective, noun, gender):
    return french_noun_phrase(article, adjective, noun, gender).replace("un ", "une ", 1) if article == "a" else french_noun_phrase(article, adjective, noun, gender)


def noun_phrase_right_with_a_set(article, adjective, noun, gender):
    """A correct alternative: a set of accented vowels, the adjective placed by insertion."""
    words = [noun]
    if adjective:
        masculine, feminine, position = adjective
        words.insert(0 if position == "before" else 1, feminine if gender == "f" else masculine)
    if article == "a":
        return ("une " if gender == "f" else "un ") + " ".join(words)
    first = words[0][0]
    if first in set("aeiouyh") | set("àâéèêëîïôûùü"):
        return "l'" + " ".join(words)
    return ("la " if gender == "f" else "le ") + " ".join(words)


def test_noun_phrase_right():
    feedback = check_french_noun_phrase(noun_phrase_right)
    assert feedback and feedback.status == "correct", str(feedback)
    assert "new nouns" in feedback.message
    assert check_french_noun_phrase(noun_phrase_right_with_a_set).status == "correct"


@pytest.mark.parametrize(
    "answer,words",
    [
        (noun_phrase_always_after, "pre-nominal"),
        (noun_phrase_no_agreement, "feminine"),
        (noun_phrase_no_elision, "elision"),
        (noun_phrase_elides_through_adjective, "no elision"),
        (noun_phrase_space_after_l, "elision"),
        (noun_phrase_only_known_vowels, "île"),
        (noun_phrase_no_elision_before_h, "homme"),
        (noun_phrase_always_une, "gender"),
    ],
)
def test_noun_phrase_wrong(answer, words):
    feedback = check_french_noun_phrase(answer)
    assert not feedback and feedback.status == "incorrect"
    assert words in feedback.message and "expected" in feedback.message and "Hint" in str(feedback)


def test_noun_phrase_wrong_type():
    feedback = check_french_noun_phrase(lambda *args: ["le", "chat"])
    assert feedback.status == "incorrect" and "return a str" in feedback.message


def test_noun_phrase_crash_and_scaffold():
    assert check_french_noun_phrase(crashing).status == "error"
    assert "boom" in check_french_noun_phrase(crashing).message
    assert check_french_noun_phrase(scaffold).status == "not attempted"
    assert check_french_noun_phrase(...).status == "not attempted"


# --------------------------------------------------------------------------- exercise 2

def sample_right(logits, temperature, generator):
    if temperature == 0:
        return logits.argmax(dim=-1)
    probabilities = torch.softmax(logits / temperature, dim=-1)
    return torch.multinomial(probabilities, 1, generator=generator).squeeze(1)


def sample_no_temperature(logits, temperature, generator):
    if temperature == 0:
        return logits.argmax(dim=-1)
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator).squeeze(1)


def sample_ignores_generator(logits, temperature, generator):
    if temperature == 0:
        return logits.argmax(dim=-1)
    return torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1).squeeze(1)


def sample_always_greedy(logits, temperature, generator):
    return logits.argmax(dim=-1)


def sample_wrong_shape(logits, temperature, generator):
    return torch.multinomial(torch.softmax(logits / max(temperature, 1e-6), dim=-1), 1, generator=generator)


def sample_floats(logits, temperature, generator):
    return logits.argmax(dim=-1).float()


def sample_multiplies_by_temperature(logits, temperature, generator):
    if temperature == 0:
        return logits.argmax(dim=-1)
    return torch.multinomial(torch.softmax(logits * temperature, dim=-1), 1, generator=generator).squeeze(1)


def sample_softmax_over_the_batch(logits, temperature, generator):
    if temperature == 0:
        return logits.argmax(dim=-1)
    return torch.multinomial(torch.softmax(logits / temperature, dim=0), 1, generator=generator).squeeze(1)


def sample_argmax_over_the_batch(logits, temperature, generator):
    if temperature == 0:
        return logits.argmax(dim=0)
    return sample_right(logits, temperature, generator)


def sample_right_via_log_softmax(logits, temperature, generator):
    """A correct alternative: log-probabilities, exponentiated."""
    if temperature == 0:
        return torch.max(logits, dim=1).indices
    probabilities = torch.log_softmax(logits.double() / temperature, dim=1).exp()
    return torch.multinomial(probabilities, num_samples=1, generator=generator)[:, 0]


def test_sample_right():
    feedback = check_sample_next(sample_right)
    assert feedback.status == "correct", str(feedback)
    assert check_sample_next(sample_right_via_log_softmax).status == "correct"


def test_sample_crash_and_scaffold():
    assert check_sample_next(crashing).status == "error"
    assert check_sample_next(scaffold).status == "not attempted"


# --------------------------------------------------------------------------- exercise 3

def mask_right(T):
    return torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)


@pytest.mark.parametrize(
    "check, answer, words",
    [
        (check_sample_next, sample_no_temperature, "divide the logits by the temperature"),
        (check_sample_next, sample_ignores_generator, "generator"),
        (check_sample_next, sample_always_greedy, "frequencies"),
        (check_sample_next, sample_wrong_shape, "shape"),
        (check_sample_next, sample_floats, "integer"),
        (check_sample_next, sample_multiplies_by_temperature, "frequencies"),
        (check_sample_next, sample_softmax_over_the_batch, "frequencies"),
        (check_sample_next, sample_argmax_over_the_batch, "shape"),
        (check_decoder_mask, lambda T: torch.ones(T, T, dtype=torch.bool).tril(), "IS allowed"),
        (check_decoder_mask, lambda T: torch.ones(T, T, dtype=torch.bool).tril(-1), "blocks the past"),
        (check_decoder_mask, lambda T: torch.ones(T, T).triu(1), "bool"),
        (check_decoder_mask, lambda T: torch.ones(T, T, dtype=torch.bool).triu(1)[:, :-1], "shape"),
        (check_decoder_mask, lambda T: torch.zeros(T, T, dtype=torch.bool), "should be"),
        (check_decoder_mask, lambda T: torch.ones(T, T, dtype=torch.bool).triu(0), "diagonal"),  # blocks itself too
        (check_decoder_mask, lambda T: torch.full((T, T), float("-inf")).triu(1), "bool"),  # an additive float mask
    ],
)
def test_wrong_samplers_and_masks_are_told_what_is_wrong(check, answer, words):
    feedback = check(answer)
    assert feedback.status == "incorrect", str(feedback)
    assert words in feedback.message


def test_mask_right_crash_and_scaffold():
    assert check_decoder_mask(mask_right).status == "correct"
    assert check_decoder_mask(crashing).status == "error"
    assert check_decoder_mask(scaffold).status == "not attempted"


def test_mask_alternative_formulation():
    def mask_by_comparison(T):
        positions = torch.arange(T)
        return positions[None, :] > positions[:, None]  # key after query: blocked

    assert check_decoder_mask(mask_by_comparison).status == "correct"


# --------------------------------------------------------------------------- exercise 4

def post_norm_right(layer, x, memory, memory_padding):
    x = layer.norm1(x + layer.self_attn(x, x, x, is_causal=True)[0])
    x = layer.norm2(x + layer.cross_attn(x, memory, memory, key_padding_mask=memory_padding)[0])
    return layer.norm3(x + layer.feed_forward(x))


def post_norm_right_with_a_mask(layer, x, memory, memory_padding):
    """A correct alternative: an explicit causal mask (True = blocked) and need_weights=False."""
    T = x.size(1)
    future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
    attended, _ = layer.self_attn(x, x, x, attn_mask=future, need_weights=False)
    x = layer.norm1(x + attended)
    attended, _ = layer.cross_attn(x, memory, memory, key_padding_mask=memory_padding, need_weights=False)
    x = layer.norm2(x + attended)
    return layer.norm3(x + layer.feed_forward(x))


def post_norm_is_pre_norm(layer, x, memory, memory_padding):
    return layer(x, memory, memory_key_padding_mask=memory_padding)[0]


def post_norm_no_causal(layer, x, memory, memory_padding):
    x = layer.norm1(x + layer.self_attn(x, x, x)[0])
    x = layer.norm2(x + layer.cross_attn(x, memory, memory, key_padding_mask=memory_padding)[0])
    return layer.norm3(x + layer.feed_forward(x))


def post_norm_ignores_padding(layer, x, memory, memory_padding):
    x = layer.norm1(x + layer.self_attn(x, x, x, is_causal=True)[0])
    x = layer.norm2(x + layer.cross_attn(x, memory, memory)[0])
    return layer.norm3(x + layer.feed_forward(x))


def post_norm_padding_other_convention(layer, x, memory, memory_padding):
    x = layer.norm1(x + layer.self_attn(x, x, x, is_causal=True)[0])
    x = layer.norm2(x + layer.cross_attn(x, memory, memory, key_padding_mask=~memory_padding)[0])
    return layer.norm3(x + layer.feed_forward(x))


def post_norm_cross_to_itself(layer, x, memory, memory_padding):
    x = layer.norm1(x + layer.self_attn(x, x, x, is_causal=True)[0])
    x = layer.norm2(x + layer.cross_attn(x, x, x, is_causal=True)[0])
    return layer.norm3(x + layer.feed_forward(x))


def post_norm_no_residual(layer, x, memory, memory_padding):
    x = layer.norm1(layer.self_attn(x, x, x, is_causal=True)[0])
    x = layer.norm2(layer.cross_attn(x, memory, memory, key_padding_mask=memory_padding)[0])
    return layer.norm3(layer.feed_forward(x))


def post_norm_norms_swapped(layer, x, memory, memory_padding):
    x = layer.norm3(x + layer.self_attn(x, x, x, is_causal=True)[0])
    x = layer.norm2(x + layer.cross_attn(x, memory, memory, key_padding_mask=memory_padding)[0])
    return layer.norm1(x + layer.feed_forward(x))


def post_norm_forgets_the_ffn(layer, x, memory, memory_padding):
    x = layer.norm1(x + layer.self_attn(x, x, x, is_causal=True)[0])
    return layer.norm2(x + layer.cross_attn(x, memory, memory, key_padding_mask=memory_padding)[0])


def post_norm_returns_the_tuple(layer, x, memory, memory_padding):
    x = layer.norm1(x + layer.self_attn(x, x, x, is_causal=True)[0])
    x = layer.norm2(x + layer.cross_attn(x, memory, memory, key_padding_mask=memory_padding)[0])
    return layer.norm3(x + layer.feed_forward(x)), None


def post_norm_identity(layer, x, memory, memory_padding):
    return x


def test_post_norm_right_answers():
    for answer in (post_norm_right, post_norm_right_with_a_mask):
        feedback = check_post_norm_decoder_layer(answer)
        assert feedback.status == "correct", str(feedback)


@pytest.mark.parametrize(
    "answer, words",
    [
        (post_norm_is_pre_norm, "pre-norm"),
        (post_norm_no_causal, "future"),
        (post_norm_ignores_padding, "padding"),
        (post_norm_padding_other_convention, "post-norm layer's"),
        (post_norm_cross_to_itself, "memory"),
        (post_norm_no_residual, "residual"),
        (post_norm_norms_swapped, "swapped"),
        (post_norm_forgets_the_ffn, "post-norm layer's"),
        (post_norm_returns_the_tuple, "tuple"),
        (post_norm_identity, "input"),
    ],
)
def test_post_norm_wrong_answers_are_told_what_is_wrong(answer, words):
    feedback = check_post_norm_decoder_layer(answer)
    assert feedback.status == "incorrect", str(feedback)
    assert words in feedback.message, feedback.message


def test_post_norm_crash_and_scaffold():
    assert check_post_norm_decoder_layer(crashing).status == "error"
    assert check_post_norm_decoder_layer(scaffold).status == "not attempted"
