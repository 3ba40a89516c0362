"""Chapter 07's analysis helpers (attn_course.translator.analysis), beam search, fine-tuning and the
chance of a sentence: each against a computation written out here, on small inputs."""

import itertools
import math

import matplotlib
import pytest
import torch

import attn_course.translator as tr
from attn_course.translator import CharVocab, toy_pairs

matplotlib.use("Agg")
pytestmark = pytest.mark.usefixtures("one_thread")


# --------------------------------------------------------------------------- words and word-level tables

def test_words_of_skips_special_symbols_and_points_into_the_symbols():
    symbols = ["l", "e", " ", "c", "h", "a", "t", "</s>"]
    assert tr.words_of(symbols) == [("le", 0, 2), ("chat", 3, 7)]
    assert tr.words_of(["<s>", "l", "'", "a", " ", "b"]) == [("l'a", 1, 4), ("b", 5, 6)]
    assert tr.words_of([]) == [] and tr.words_of(["<s>", " "]) == []
    with pytest.raises(TypeError, match="list of symbols"):
        tr.words_of("le chat")


@pytest.mark.parametrize("expected, got, index, place", [
    ("le chat voit un chien", "la chat voit un chien", 1, "an article's second letter"),
    ("la bonne orange", "l'orange", 1, "an article's second letter"),  # the elision
    ("l'orange verte", "la fille verte", 1, "an article's second letter"),  # the elision missed
    ("une fille rapide prend un oiseau", "une fille rapide aime un oiseau", 17, "a word's first letter"),
    ("le chat", "un chat", 0, "a word's first letter"),
    ("le chien bleu", "le chien", 8, "a word's end"),  # stopped where a space should follow
    ("le chien", "le chiens", 8, "a word's end"),  # ran on past the last word
    ("un arbre heureux", "un arbre heureuse", 15, "inside a word"),
    ("une femme bleue", "une femme ble", 13, "inside a word"),  # cut short inside the word
    ("une pomme mange", "une pomme mmege", 11, "inside a word"),  # a verb's second letter is not an article's
])
def test_first_wrong_character_names_where_a_mistake_begins(expected, got, index, place):
    assert tr.first_wrong_character(expected, got) == (index, place)
    assert place in tr.MISTAKE_PLACES


def test_first_wrong_character_rejects_a_right_answer_and_non_strings():
    with pytest.raises(ValueError, match="same sentence"):
        tr.first_wrong_character("le chat", "le chat")
    with pytest.raises(TypeError, match="got must be a string.*list"):
        tr.first_wrong_character("le chat", list("le chien"))


def test_word_attention_sums_each_source_word_at_each_first_letter():
    target = list("un ab") + ["</s>"]  # words "un" (rows 0..1) and "ab" (rows 3..4)
    source = list("a bc")  # words "a" (column 0) and "bc" (columns 2..3)
    weights = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    table, target_words, source_words = tr.word_attention(weights, target, source)
    assert target_words == ["un", "ab"] and source_words == ["a", "bc"]
    expected = torch.tensor([[weights[0, 0], weights[0, 2] + weights[0, 3]],
                             [weights[3, 0], weights[3, 2] + weights[3, 3]]])
    torch.testing.assert_close(table, expected)
    with pytest.raises(ValueError, match=r"\(T, S\) = \(6, 4\)"):
        tr.word_attention(weights[:5], target, source)


def test_word_dictionary_covers_both_adjective_forms():
    dictionary = tr.word_dictionary()
    assert dictionary["chien"] == "dog" and dictionary["voit"] == "sees"
    assert dictionary["blanc"] == dictionary["blanche"] == "white"
    with pytest.raises(TypeError, match="Lexicon"):
        tr.word_dictionary({"cat": "chat"})


def _map(target: str, source: str, right: dict[int, int], layers=2, heads=3):
    """An attention dict whose head (0, 0) puts each first-letter row on the source word ``right[i]``
    (by its first character) and whose other heads are uniform."""
    T, S = len(target) + 1, len(source)
    cross = torch.full((layers, heads, T, S), 1.0 / S)
    words_t, words_s = tr.words_of(list(target)), tr.words_of(list(source))
    for i, (_, t0, _) in enumerate(words_t):
        if i in right:
            cross[0, 0, t0] = 0.0
            cross[0, 0, t0, words_s[right[i]][1]] = 1.0
    return {"target": list(target) + ["</s>"], "source": list(source), "cross": cross}


def test_alignment_scores_counts_right_words_and_the_uniform_baseline():
    # "le chien noir voit un oiseau" <- "the black dog sees a bird": scored words chien, noir, voit, oiseau.
    source, target = "the black dog sees a bird", "le chien noir voit un oiseau"
    english = source.split()
    right = {1: english.index("dog"), 2: english.index("black"), 3: english.index("sees"), 5: english.index("bird")}
    scores = tr.alignment_scores([_map(target, source, right)])
    assert scores["total"] == 4
    assert scores["heads"].shape == (2, 4)
    assert scores["heads"][0, 0] == 1.0
    # Uniform attention picks the longest English word ("black", first of the 5-letter words) for every row:
    # right only for noir.
    assert scores["uniform"] == pytest.approx(1 / 4)
    assert scores["heads"][1, 0] == pytest.approx(1 / 4) and scores["heads"][0, 1] == pytest.approx(1 / 4)
    wrong = {1: english.index("the"), 2: english.index("the"), 3: english.index("the"), 5: english.index("the")}
    assert tr.alignment_scores([_map(target, source, wrong)])["heads"][0, 0] == 0.0
    assert scores["repeated"] == 0


def test_alignment_scores_count_words_whose_english_word_occurs_twice():
    # "l'orange verte trouve l'orange bleue" <- "the green orange finds the blue orange": both oranges have their
    # English word twice in the sentence; verte, trouve and bleue do not.
    source, target = "the green orange finds the blue orange", "l'orange verte trouve l'orange bleue"
    english = source.split()
    first_orange = english.index("orange")
    at_first = {0: first_orange, 1: english.index("green"), 2: english.index("finds"), 3: first_orange,
                4: english.index("blue")}
    scores = tr.alignment_scores([_map(target, source, at_first)])
    assert scores["total"] == 5 and scores["repeated"] == 2
    assert scores["heads"][0, 0] == 1.0  # the second orange read at the first counts as right: what "repeated" warns of


def test_alignment_scores_rejects_maps_without_words():
    with pytest.raises(ValueError, match="non-empty list"):
        tr.alignment_scores([])
    with pytest.raises(ValueError, match="no French noun"):
        tr.alignment_scores([_map("le un", "the a", {})])


def test_reordering_scores_count_heads_that_tell_the_noun_from_its_adjective():
    # "le chien noir voit un oiseau" <- "the black dog sees a bird": one reordered phrase, chien noir.
    source, target = "the black dog sees a bird", "le chien noir voit un oiseau"
    english = source.split()
    separates = {1: english.index("dog"), 2: english.index("black")}
    scores = tr.reordering_scores([_map(target, source, separates)])
    assert scores["total"] == 1 and scores["both"].shape == (2, 4)
    assert scores["both"][0, 0] == scores["noun"][0, 0] == scores["adjective"][0, 0] == 1.0
    # Uniform heads choose "black" (the longest word) at both steps: the adjective right, the noun wrong.
    assert scores["uniform"] == 0.0 and scores["both"][1, 0] == 0.0
    assert scores["noun"][1, 0] == 0.0 and scores["adjective"][1, 0] == 1.0
    assert scores["same"][0, 0] == 0.0 and scores["same"][1, 0] == 1.0  # uniform rows pick one word twice
    both_on_black = {1: english.index("black"), 2: english.index("black")}  # the phrase read as one unit
    scores = tr.reordering_scores([_map(target, source, both_on_black)])
    assert scores["both"][0, 0] == 0.0 and scores["adjective"][0, 0] == 1.0 and scores["same"][0, 0] == 1.0
    # A pre-nominal adjective (le petit chat) and an elided noun with its adjective (l'arbre noir).
    assert tr.reordering_scores([_map("l'arbre noir voit le petit chat", "the black tree sees the small cat",
                                      {})])["total"] == 1
    with pytest.raises(ValueError, match="no French noun followed"):
        tr.reordering_scores([_map("le petit chat voit un oiseau", "the small cat sees a bird", {})])
    with pytest.raises(ValueError, match="non-empty list"):
        tr.reordering_scores([])


def test_word_start_entropy_splits_the_steps_that_start_a_word_from_the_others():
    target, source = "le chien", "the dog"
    T, S = len(target) + 1, len(source)
    cross = torch.full((1, 2, T, S), 1.0 / S)  # even everywhere ...
    for t0 in (0, 3):  # ... but one-hot at the first letters of "le" and "chien"
        cross[0, 0, t0] = 0.0
        cross[0, 0, t0, 0] = 1.0
    shares = tr.word_start_entropy([{"target": list(target) + ["</s>"], "source": list(source), "cross": cross}])
    torch.testing.assert_close(shares["first"], torch.tensor([[0.0, 1.0]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(shares["other"], torch.ones(1, 2))
    with pytest.raises(ValueError, match="non-empty list"):
        tr.word_start_entropy({})


def test_entropy_share_is_one_for_even_rows_and_zero_for_one_hot_rows():
    even = torch.full((2, 3, 4, 5), 0.2)
    torch.testing.assert_close(tr.entropy_share(even), torch.ones(2, 3))
    one_hot = torch.zeros(4, 5)
    one_hot[:, 0] = 1
    assert float(tr.entropy_share(one_hot)) == pytest.approx(0.0, abs=1e-6)
    causal = torch.tril(torch.ones(4, 4))
    causal = causal / causal.sum(-1, keepdim=True)  # row t spreads over t + 1 keys: even for what it may see
    assert float(tr.entropy_share(causal, causal=True)) == pytest.approx(1.0)
    assert float(tr.entropy_share(causal)) < 1.0  # counted against all 4 keys, the early rows look sharp
    with pytest.raises(ValueError, match="more than one key"):
        tr.entropy_share(torch.ones(3, 1))


def test_word_ticks_keep_every_label():
    ticks, labels = tr.word_ticks(["<s>", *"le chien", "</s>"])
    assert labels == ["<s> le", "chien", "</s>"] and ticks == [1.5, 6.0, 9.0]
    ticks, labels = tr.word_ticks(["<s>", *"arbres", " ", *"un", "</s>"])
    assert labels == ["<s>", "arbres", "un </s>"] and ticks[:2] == [0.0, 3.5]
    assert tr.visible_spaces(["a", " ", "b"]) == ["a", "␣", "b"]


def test_attention_grid_scales_to_a_quantile_and_leaves_the_trivial_row_out():
    maps = torch.rand(2, 3, 6, 6, generator=torch.Generator().manual_seed(0)) * 0.3
    maps[..., 0, :] = 0
    maps[..., 0, 0] = 1.0  # the first row of a causal map sees only <s>
    symbols = ["<s>", *"ab cd"]
    fig = tr.attention_grid(maps, symbols, symbols, "test", causal=True, quantile=1.0)
    assert len(fig.axes) == 2 * 3 + 1
    top = fig.axes[0].images[0].get_clim()[1]
    assert top == pytest.approx(float(maps[:, :, 1:].max()))
    assert "row 1 left out" in fig.axes[-1].get_ylabel()
    fig = tr.attention_grid(maps, symbols, symbols, "test")
    assert fig.axes[0].images[0].get_clim()[1] == pytest.approx(float(torch.quantile(maps.flatten(), 0.99)))
    with pytest.raises(ValueError, match="query symbols"):
        tr.attention_grid(maps, symbols[:-1], symbols, "test")
    import matplotlib.pyplot as plt
    plt.close("all")


# --------------------------------------------------------------------------- the chance of a sentence

def test_sentence_probability_adds_up_to_one_over_a_small_grammar():
    lexicon = tr.Lexicon(nouns={"cat": ("chat", "m"), "tree": ("arbre", "m")},
                         adjectives={"red": ("rouge", "rouge", "after")}, verbs={"sees": "voit", "eats": "mange"})
    phrases = [tr.english_noun_phrase(a, adj, n) for a in ("the", "a") for adj in (None, "red") for n in ("cat", "tree")]
    sentences = [f"{s} {v} {o}" for s, v, o in itertools.product(phrases, lexicon.verbs, phrases)]
    assert len(sentences) == tr.count_sentences(lexicon)
    total = sum(tr.sentence_probability(s, lexicon, adjective_rate=0.3) for s in sentences)
    assert total == pytest.approx(1.0)
    p = tr.sentence_probability("the red cat sees a tree", lexicon, adjective_rate=0.3)
    assert p == pytest.approx((0.5 * 0.3 / 1 / 2) * (1 / 2) * (0.5 * 0.7 / 2))
    with pytest.raises(ValueError):
        tr.sentence_probability("the cat", lexicon)


def test_elision_follows_the_first_letter():
    red = ("rouge", "rouge", "after")
    small = ("petit", "petite", "before")
    for noun, gender, expected in (("âne", "m", "l'âne"), ("œuf", "m", "l'œuf"), ("ère", "f", "l'ère"),
                                   ("hôtel", "m", "l'hôtel"), ("yaourt", "m", "le yaourt"), ("île", "f", "l'île")):
        assert tr.french_noun_phrase("the", None, noun, gender) == expected
    assert tr.french_noun_phrase("the", small, "âne", "m") == "le petit âne"
    assert tr.french_noun_phrase("the", red, "yaourt", "m") == "le yaourt rouge"


# --------------------------------------------------------------------------- beam search

def _table_model(V: int, seed: int, start_id: int = 1, end_id: int = 2):
    """next_log_probs from a seeded table: every prefix its own distribution (ends get likelier with length)."""
    def probabilities(prefix: tuple) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed * 7919 + hash(prefix) % 100003)
        p = torch.rand(V, generator=g, dtype=torch.float64) + 0.05
        p[start_id] = 0
        p[end_id] += 0.3 * len(prefix)
        return p / p.sum()

    def next_log_probs(prefixes: torch.Tensor) -> torch.Tensor:
        assert prefixes.dim() == 2 and bool((prefixes[:, 0] == start_id).all())
        assert not bool((prefixes[:, 1:] == end_id).any()), "a finished sequence was extended"
        return torch.stack([probabilities(tuple(row[1:])).log() for row in prefixes.tolist()])

    return next_log_probs, probabilities


def _best_by_enumeration(probabilities, V: int, max_len: int, start_id: int, end_id: int, width: int):
    """Beam search written out by brute force over the prefixes of each step (no pruning per prefix)."""
    beams = [((), 0.0)]
    for _ in range(max_len):
        if all(ids and ids[-1] == end_id for ids, _ in beams):
            break
        candidates = []
        for ids, score in beams:
            if ids and ids[-1] == end_id:
                candidates.append((ids, score))
                continue
            p = probabilities(ids)
            candidates += [(ids + (t,), score + math.log(p[t])) for t in range(V) if t != start_id]
        beams = sorted(candidates, key=lambda c: -c[1])[:width]
    return list(beams[0][0])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("width", [1, 2, 3])
def test_beam_search_equals_the_search_written_out(seed, width):
    V, max_len = 5 + seed % 3, 6
    start_id, end_id = (1, 2) if seed % 2 else (0, V - 1)
    next_log_probs, probabilities = _table_model(V, seed, start_id, end_id)
    got = tr.beam_search(next_log_probs, width, max_len, start_id=start_id, end_id=end_id)
    assert got == _best_by_enumeration(probabilities, V, max_len, start_id, end_id, width)


def test_beam_search_width_one_is_greedy_and_a_wider_beam_scores_at_least_as_well_here():
    next_log_probs, probabilities = _table_model(6, 11)
    greedy, prefix = [], ()
    for _ in range(8):
        token = int(probabilities(prefix).argmax())
        greedy.append(token)
        prefix += (token,)
        if token == 2:
            break
    assert tr.beam_search(next_log_probs, 1, 8) == greedy

    def score(ids):
        return sum(math.log(probabilities(tuple(ids[:i]))[t]) for i, t in enumerate(ids))
    assert score(tr.beam_search(next_log_probs, 4, 8)) >= score(greedy) - 1e-12


def test_beam_search_bad_arguments():
    next_log_probs, _ = _table_model(5, 0)
    with pytest.raises(ValueError, match="beam_width"):
        tr.beam_search(next_log_probs, 0, 5)
    with pytest.raises(ValueError, match="max_len"):
        tr.beam_search(next_log_probs, 2, 0)


# --------------------------------------------------------------------------- on a tiny trained model

@pytest.fixture(scope="module")
def tiny():
    pairs = toy_pairs(400, seed=5)
    model, _ = tr.train(pairs, epochs=3, batch_size=16, d_model=32, num_heads=2, d_ff=64, num_encoder_layers=1,
                        num_decoder_layers=1, learning_rate=1e-2, progress=False)
    return model, pairs


def test_next_char_log_probs_is_the_decoder_on_the_prefix(tiny):
    model, pairs = tiny
    english = pairs[0][0]
    next_log_probs = tr.next_char_log_probs(model, english)
    prefix = torch.tensor([[CharVocab.start_id] + model.target_vocab.encode(pairs[0][1][:5])] * 2)
    got = next_log_probs(prefix)
    src = model.encode_sources([english])
    with torch.no_grad():
        logits, _ = model(src.expand(2, -1), prefix)
    torch.testing.assert_close(got, torch.log_softmax(logits[:, -1], dim=-1))
    assert torch.allclose(got.exp().sum(-1), torch.ones(2))


def test_beam_translate_width_one_is_translate(tiny):
    model, pairs = tiny
    for english, _ in pairs[:3]:
        assert tr.beam_translate(model, english, beam_width=1, max_new_tokens=40) == \
            tr.translate(model, english, max_new_tokens=40)


def test_fine_tune_lowers_the_loss_on_its_pairs_and_keeps_the_vocabularies(tiny):
    import copy

    model, pairs = tiny
    tuned = copy.deepcopy(model)
    tuned, history = tr.fine_tune(tuned, pairs[:64], steps=30, batch_size=16, learning_rate=3e-3)
    assert len(history["loss"]) == 30 and history["seconds"] > 0 and not tuned.training
    assert sum(history["loss"][-5:]) < sum(history["loss"][:5])
    assert tuned.target_vocab == model.target_vocab
    assert any(not torch.equal(a, b) for a, b in zip(tuned.parameters(), model.parameters()))
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        tr.fine_tune(copy.deepcopy(model), [("the cat sees a dog", "le chat voit un chien!")], steps=1)
    with pytest.raises(ValueError, match="steps"):
        tr.fine_tune(copy.deepcopy(model), pairs[:4], steps=0)
    with pytest.raises(TypeError, match="Translator"):
        tr.fine_tune(model.transformer, pairs[:4], steps=1)


def test_sequence_log_probs_sum_the_next_character_log_probabilities(tiny):
    model, pairs = tiny
    english, french = pairs[1]
    other = french[:-1] + ("a" if french[-1] != "a" else "e")
    got = tr.sequence_log_probs(model, [(english, french), (english, other), pairs[2]])
    assert got.shape == (3,) and got.dtype == torch.float64 and bool((got < 0).all())
    next_log_probs = tr.next_char_log_probs(model, english)
    ids = [CharVocab.start_id] + model.target_vocab.encode(french) + [CharVocab.end_id]
    by_steps = sum(float(next_log_probs(torch.tensor([ids[:t]]))[0, ids[t]]) for t in range(1, len(ids)))
    assert float(got[0]) == pytest.approx(by_steps, abs=1e-4)  # padding of the shorter pair counts for nothing
    assert tr.sequence_log_probs(model, [pairs[2]])[0] == pytest.approx(float(got[2]), abs=1e-4)
    with pytest.raises(TypeError, match="Translator"):
        tr.sequence_log_probs("model", pairs[:1])
