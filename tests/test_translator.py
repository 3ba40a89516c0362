"""Tests of attn_course.translator: the toy language, the vocabularies, decoding, checkpoints and the
command line. Training here is a smoke test of a few seconds; the accuracy target (>= 95% exact match
on unseen sentences with the defaults) is a benchmark, run by hand (see chapter 07)."""

import re
import subprocess
import sys

import pytest
import torch

from attn_course import translator as tr
from attn_course.caches import KVCache
from attn_course.translator import CharVocab, toy_pairs
from attn_course.translator.decoding import _decode_step_cached
from attn_course.translator.language import _noun_phrases


pytestmark = pytest.mark.usefixtures("one_thread")


# --------------------------------------------------------------------------- the toy language

def test_grammar_is_big_enough():
    lexicon = tr.DEFAULT_LEXICON
    assert len(set(lexicon.english_words)) >= 30
    assert {g for _, g in lexicon.nouns.values()} == {"m", "f"}
    # Count by enumerating every sentence (not only by the formula).
    phrases = _noun_phrases(lexicon)
    assert len(set(phrases)) == len(phrases)
    sentences = {f"{s} {v} {o}" for s, _ in phrases for v in lexicon.verbs for o, _ in phrases}
    assert len(sentences) == tr.count_sentences() > 1_000_000


def test_toy_pairs_deterministic_distinct_and_prefix_stable():
    a = toy_pairs(2000, seed=3)
    assert a == toy_pairs(2000, seed=3)
    assert len(a) == 2000 and len({e for e, _ in a}) == 2000
    assert toy_pairs(500, seed=3) == a[:500]
    assert a != toy_pairs(2000, seed=4)
    assert all(isinstance(e, str) and isinstance(f, str) for e, f in a)


def test_toy_pairs_follow_the_rules():
    pairs = toy_pairs(3000, seed=0)
    assert all(tr.reference_translation(e) == f for e, f in pairs)
    french = [f for _, f in pairs]
    english = [e for e, _ in pairs]
    # Some adjectives precede the noun in French, some follow it.
    assert any(re.search(r"\ble petit chat\b", f) for f in french)
    assert any(re.search(r"\ble chat (rouge|noir|vert|blanc|bleu|heureux|rapide)\b", f) for f in french)
    # Elision, and none when an adjective separates article and noun.
    assert any("l'arbre" in f for f in french) and any("l'école" in f for f in french)
    assert any("le grand arbre" in f for f in french)
    assert not any(re.search(r"\b(le|la) [aeiouéh]", f) for f in french)
    # Gender agreement of articles and adjectives.
    assert any("la voiture verte" in f for f in french) and any("le chat vert" in f for f in french)
    assert any("une pomme blanche" in f for f in french) and any("un chien blanc" in f for f in french)
    assert not any(re.search(r"\bla \w+ (vert|blanc|noir|heureux)\b", f) for f in french)
    # English: "an" before a vowel.
    assert any(" an apple" in e or e.startswith("an ") for e in english)
    assert not any(re.search(r"\ba [aeiou]", e) for e in english)


@pytest.mark.parametrize(
    "english,french",
    [
        ("the small cat sees a red car", "le petit chat voit une voiture rouge"),
        ("the tree likes the big tree", "l'arbre aime le grand arbre"),
        ("an elephant eats the white apple", "un éléphant mange la pomme blanche"),
        ("the happy woman follows an orange", "la femme heureuse suit une orange"),
        ("the man finds the good school", "l'homme trouve la bonne école"),
    ],
)
def test_reference_translation_examples(english, french):
    assert tr.reference_translation(english) == french


@pytest.mark.parametrize("bad", ["the cat", "the cat sees", "a apple sees the cat", "the cat sees the dog now", "cat sees the dog"])
def test_reference_translation_rejects_non_sentences(bad):
    with pytest.raises(ValueError):
        tr.reference_translation(bad)


def test_lexicon_with_noun():
    lexicon = tr.DEFAULT_LEXICON.with_noun("island", "île", "f")
    assert tr.reference_translation("the island sees a small island", lexicon) == "l'île voit une petite île"
    assert "island" not in tr.DEFAULT_LEXICON.nouns
    with pytest.raises(ValueError, match="nouns"):
        tr.DEFAULT_LEXICON.with_noun("island", "île", "x")


@pytest.mark.parametrize("kwargs,error", [(dict(n=-1), ValueError), (dict(n=2.5), TypeError),
                                          (dict(n=10, seed=-1), ValueError), (dict(n=10, adjective_rate=1.0), ValueError),
                                          (dict(n=10**7), ValueError)])
def test_toy_pairs_bad_arguments(kwargs, error):
    with pytest.raises(error):
        toy_pairs(**kwargs)


def test_held_out_pairs_are_unseen():
    training = toy_pairs(3000, seed=1)
    unseen = tr.held_out_pairs(500, training, seed=2)
    assert len(unseen) == 500
    assert not {e for e, _ in unseen} & {e for e, _ in training}


# --------------------------------------------------------------------------- vocabularies

@pytest.mark.parametrize("text", ["", "a", "the small cat sees a red car", "l'éléphant mange la pomme"])
def test_vocab_round_trip(text):
    vocab = CharVocab.from_texts([text], extra="abc")
    ids = vocab.encode(text, add_start=True, add_end=True)
    assert ids[0] == vocab.start_id and ids[-1] == vocab.end_id
    assert vocab.decode(ids) == text
    assert vocab.decode(ids + [vocab.pad_id] * 3) == text
    assert vocab.decode(torch.tensor(ids + [vocab.end_id, 5])) == text  # stops at the first end


def test_vocab_specials_and_equality():
    vocab = CharVocab("cba")
    assert (vocab.pad_id, vocab.start_id, vocab.end_id) == (0, 1, 2)
    assert vocab.symbols == ["<pad>", "<s>", "</s>", "a", "b", "c"] and len(vocab) == 6
    assert vocab == CharVocab("abc") and vocab != CharVocab("abd")
    assert vocab.symbols_of([1, 3, 2]) == ["<s>", "a", "</s>"]


def test_vocab_unknown_character_is_named():
    vocab = CharVocab("abc ")
    with pytest.raises(ValueError, match=r"\['!'\]"):
        vocab.encode("ab!")
    with pytest.raises(TypeError):
        vocab.encode(3)
    with pytest.raises(ValueError):
        CharVocab(["ab"])


def test_pad_sequences():
    batch = tr.pad_sequences([[5, 6, 7], [8], []])
    assert batch.dtype == torch.long
    assert batch.tolist() == [[5, 6, 7], [8, 0, 0], [0, 0, 0]]


# --------------------------------------------------------------------------- model, decoding, training

@pytest.fixture(scope="module")
def tiny():
    """A tiny model trained for a few seconds: not accurate, but it has learnt the end symbol."""
    pairs = toy_pairs(400, seed=5)
    model, history = tr.train(pairs, epochs=3, batch_size=16, d_model=32, num_heads=2, d_ff=64,
                              num_encoder_layers=1, num_decoder_layers=1, learning_rate=1e-2, progress=False)
    return model, history, pairs


def test_train_smoke(tiny):
    model, history, pairs = tiny
    assert isinstance(model, tr.Translator) and not model.training
    steps = 3 * (400 // 16)
    assert len(history["loss"]) == len(history["learning_rate"]) == len(history["grad_norm"]) == steps
    assert all(norm > 0 for norm in history["grad_norm"])  # the norm before clipping, one per step
    first, last = sum(history["loss"][:5]) / 5, sum(history["loss"][-5:]) / 5
    assert last < 0.6 * first
    assert history["seconds"] > 0 and history["sentences_per_second"] > 0
    assert max(history["learning_rate"]) <= 1e-2 + 1e-12 and history["learning_rate"][-1] < 1e-4  # warm-up, cosine


def test_train_is_seeded():
    pairs = toy_pairs(64, seed=6)
    settings = dict(epochs=1, batch_size=32, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1,
                    num_decoder_layers=1, progress=False)
    _, a = tr.train(pairs, seed=3, **settings)
    _, b = tr.train(pairs, seed=3, **settings)
    assert a["loss"] == b["loss"]


@pytest.mark.parametrize("setting", [dict(epochs=0), dict(batch_size=-2), dict(learning_rate=0.0),
                                     dict(warmup_fraction=1.5), dict(d_model=30)])
def test_train_rejects_bad_settings(setting):
    with pytest.raises(ValueError, match=next(iter(setting)).split("_")[0]):
        tr.train(toy_pairs(10), progress=False, **setting)


def test_train_rejects_unknown_settings():
    with pytest.raises(TypeError, match="epoch"):
        tr.train(toy_pairs(10), epoch=3, progress=False)
    with pytest.raises(ValueError, match="pairs"):
        tr.train([], progress=False)


def test_translate_shapes_and_types(tiny):
    model, _, pairs = tiny
    one = tr.translate(model, pairs[0][0])
    many = tr.translate(model, [e for e, _ in pairs[:5]])
    assert isinstance(one, str) and isinstance(many, list) and len(many) == 5
    assert many[0] == one
    assert all(CharVocab.END not in t and CharVocab.PAD not in t for t in many)


def test_translate_batch_size_does_not_matter(tiny):
    model, _, pairs = tiny
    sentences = [e for e, _ in pairs[:9]]
    assert tr.translate(model, sentences, batch_size=2) == tr.translate(model, sentences, batch_size=64)


def test_cached_decoding_equals_full_decoding(tiny):
    model, _, pairs = tiny
    sentences = [e for e, _ in pairs[:16]]
    assert tr.translate(model, sentences, use_cache=True) == tr.translate(model, sentences, use_cache=False)


@pytest.mark.parametrize("norm_first", [True, False])
def test_cached_decoding_step_equals_the_decoder(norm_first):
    """The cached step reuses each layer's own wiring: its logits are the decoder's, pre- and post-norm."""
    torch.manual_seed(0)
    pairs = toy_pairs(20, seed=1)
    model = tr.build_translator(pairs, d_model=16, num_heads=2, d_ff=32, norm_first=norm_first).eval()
    transformer = model.transformer
    src = model.encode_sources([e for e, _ in pairs[:3]])  # (B, S)
    tgt = tr.pad_sequences([model.target_vocab.encode(f, add_start=True) for _, f in pairs[:3]])[:, :6]  # (B, 6)
    memory, _ = transformer.encode(src)
    padding = transformer.padding_of(src)
    expected, _ = transformer.decode(tgt, memory, padding)  # (B, 6, V)
    attn = transformer.decoder_layers[0].self_attn
    cache = KVCache(len(transformer.decoder_layers), 3, attn.num_heads, attn.head_dim, 6)
    with torch.no_grad():
        first = _decode_step_cached(transformer, tgt[:, :4], memory, padding, cache)  # four tokens at once
        rest = [_decode_step_cached(transformer, tgt[:, t : t + 1], memory, padding, cache) for t in (4, 5)]
    torch.testing.assert_close(torch.cat([first, *rest], dim=1), expected, atol=1e-5, rtol=1e-4)


def test_translate_unknown_characters(tiny):
    model, _, _ = tiny
    with pytest.raises(ValueError, match=r"sentences\[1\].*\['!'\]"):
        tr.translate(model, ["the cat sees a dog", "the cat sees a dog!"])
    with pytest.raises(ValueError, match="'T'"):
        tr.translate(model, "The cat sees a dog")
    with pytest.raises(TypeError):
        tr.translate(model, 42)
    with pytest.raises(ValueError, match="temperature"):
        tr.translate(model, "the cat", temperature=-1.0)


def test_translate_with_attention(tiny):
    model, _, pairs = tiny
    english = pairs[0][0]
    text, attention = tr.translate(model, english, return_attention=True)
    assert text == tr.translate(model, english)
    S, T = len(english), len(attention["target"])
    assert attention["source"] == list(english)
    assert attention["target"][0] != CharVocab.START and "".join(attention["target"]).startswith(text)
    # The decoder read the start symbol, then each character it had written: its input, shifted by one.
    assert attention["decoder_input"] == [CharVocab.START, *attention["target"][:-1]]
    assert attention["encoder"].shape == (1, 2, S, S)
    assert attention["self"].shape == (1, 2, T, T) and attention["cross"].shape == (1, 2, T, S)
    torch.testing.assert_close(attention["cross"].sum(-1), torch.ones(1, 2, T))


def test_sampling(tiny):
    model, _, pairs = tiny
    sentences = [e for e, _ in pairs[:8]]
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    a = tr.translate(model, sentences, temperature=1.0, generator=g1)
    b = tr.translate(model, sentences, temperature=1.0, generator=g2)
    assert a == b
    cold = tr.translate(model, sentences, temperature=1e-4, generator=torch.Generator().manual_seed(1))
    assert cold == tr.translate(model, sentences)


def test_evaluate(tiny):
    model, _, pairs = tiny
    result = tr.evaluate(model, pairs[:20])
    assert set(result) >= {"exact_match", "char_accuracy", "num_sentences", "mistakes"}
    assert 0 <= result["exact_match"] <= result["char_accuracy"] <= 1 or result["exact_match"] == 1
    assert result["num_sentences"] == 20
    assert len(result["mistakes"]) == round(20 * (1 - result["exact_match"]))
    # Comparing the references with themselves gives 100%.
    perfect = [(e, tr.translate(model, e)) for e, _ in pairs[:5]]
    assert tr.evaluate(model, perfect)["exact_match"] == 1.0 == tr.evaluate(model, perfect)["char_accuracy"]


def test_checkpoint_round_trip(tiny, tmp_path):
    model, _, pairs = tiny
    path = tmp_path / "model.pt"
    tr.save_checkpoint(model, path)
    loaded = tr.load_checkpoint(path)
    assert loaded.config == model.config
    assert loaded.source_vocab == model.source_vocab and loaded.target_vocab == model.target_vocab
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    sentences = [e for e, _ in pairs[:6]]
    assert tr.translate(loaded, sentences) == tr.translate(model, sentences)
    # Loaded with weights_only=True: a pickle with arbitrary objects is refused.
    bad = tmp_path / "bad.pt"
    torch.save({"format": "attn_course.translator/1", "config": object()}, bad)
    with pytest.raises(Exception):
        tr.load_checkpoint(bad)
    with pytest.raises(ValueError, match="not a checkpoint"):
        torch.save({"weights": torch.ones(1)}, bad)
        tr.load_checkpoint(bad)


# --------------------------------------------------------------------------- command line

def test_every_module_is_reexported():
    """The chapter's sections are modules; every public name of each is importable from attn_course.translator."""
    import importlib

    for name in ("language", "vocab", "model", "training", "decoding", "analysis", "checkpoints", "cli"):
        module = importlib.import_module(f"attn_course.translator.{name}")
        for public in module.__all__:
            assert getattr(tr, public) is getattr(module, public), f"{name}.{public} is not re-exported"
    for public in tr.__all__:
        assert hasattr(tr, public), public


def test_cli_help():
    result = subprocess.run([sys.executable, "-m", "attn_course.translator", "--help"], capture_output=True, text=True)
    assert result.returncode == 0
    for command in ("train", "translate", "evaluate"):
        assert command in result.stdout


def test_cli_train_translate_evaluate(tmp_path, capsys):
    path = str(tmp_path / "cli.pt")
    assert tr.main(["train", "--out", path, "--num-pairs", "64", "--no-progress", "--set", "epochs=1",
                    "d_model=16", "num_heads=2", "d_ff=32", "num_encoder_layers=1", "num_decoder_layers=1"]) == 0
    assert "saved" in capsys.readouterr().out
    assert tr.main(["translate", "--checkpoint", path, "the cat sees a dog"]) == 0
    assert capsys.readouterr().out.startswith("the cat sees a dog\t")
    assert tr.main(["translate", "--checkpoint", path, "the cat sees a dog?"]) == 2
    assert "'?'" in capsys.readouterr().err
    assert tr.main(["evaluate", "--checkpoint", path, "--num-sentences", "8", "--num-pairs", "64"]) == 0
    assert "exact match" in capsys.readouterr().out


def test_train_step_ignores_padding_in_the_labels():
    """One step's loss averages over the labels that are characters: padding a sentence changes nothing."""
    torch.manual_seed(0)
    pairs = toy_pairs(8, seed=1)
    model = tr.build_translator(pairs, d_model=16, num_heads=2, d_ff=32)
    english, french = pairs[0]
    src = tr.pad_sequences([model.source_vocab.encode(english)])  # (1, S)
    tgt = tr.pad_sequences([model.target_vocab.encode(french, add_start=True, add_end=True)])  # (1, T + 1)
    padded = torch.cat([tgt, torch.zeros(1, 5, dtype=torch.long)], dim=1)  # (1, T + 6): five padding labels more
    losses = []
    for target in (tgt, padded):
        copy = tr.build_translator(pairs, d_model=16, num_heads=2, d_ff=32)
        copy.load_state_dict(model.state_dict())
        optimizer = torch.optim.SGD(copy.parameters(), lr=0.0)
        losses.append(tr.train_step(copy, optimizer, src, target))
    torch.testing.assert_close(losses[0], losses[1])
    logits, _ = model(src, tgt[:, :-1])
    expected = torch.nn.functional.cross_entropy(logits[0], tgt[0, 1:])
    torch.testing.assert_close(losses[0], expected.detach())


def test_train_step_without_the_shift_scores_each_position_on_what_it_reads():
    """shift_target=False (section 9's bug): the labels are the decoder's own input, start symbol included."""
    torch.manual_seed(0)
    pairs = toy_pairs(8, seed=1)
    model = tr.build_translator(pairs, d_model=16, num_heads=2, d_ff=32)
    src = tr.pad_sequences([model.source_vocab.encode(pairs[0][0])])
    tgt = tr.pad_sequences([model.target_vocab.encode(pairs[0][1], add_start=True, add_end=True)])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    loss = tr.train_step(model, optimizer, src, tgt, shift_target=False)
    logits, _ = model(src, tgt[:, :-1])
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(logits[0], tgt[0, :-1]).detach())
    assert not torch.allclose(loss, tr.train_step(model, optimizer, src, tgt))  # the shifted labels differ
    with pytest.raises(TypeError, match="shift_target"):
        tr.train_step(model, optimizer, src, tgt, shift_target="no")
    with pytest.raises(TypeError, match="shift_target"):
        tr.TrainingSettings(shift_target=0)


def test_train_is_train_step_in_a_loop():
    """train() is train_step with length-bucketed batches and the schedule: the same seed, the same first loss."""
    pairs = toy_pairs(48, seed=1)
    settings = dict(d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=1, batch_size=48)
    model, history = tr.train(pairs, device="cpu", seed=0, progress=False, **settings)
    torch.manual_seed(0)
    fresh = tr.build_translator(pairs, **{k: v for k, v in settings.items() if k != "batch_size"})
    src = fresh.encode_sources([e for e, _ in pairs])
    tgt = tr.pad_sequences([fresh.target_vocab.encode(f, add_start=True, add_end=True) for _, f in pairs])
    optimizer = torch.optim.AdamW(fresh.parameters(), lr=1.0, betas=(0.9, 0.98), weight_decay=0.01)
    before = [p.detach().clone() for p in fresh.parameters()]
    # one batch of all 48; the norm before clipping does not depend on where the clipping is
    loss, grad_norm = tr.train_step(fresh, optimizer, src, tgt, grad_clip=0.5, return_grad_norm=True)
    torch.testing.assert_close(loss, torch.tensor(history["loss"][0]), atol=1e-5, rtol=1e-5)  # train()'s first step
    torch.testing.assert_close(grad_norm, torch.tensor(history["grad_norm"][0]), atol=1e-5, rtol=1e-5)
    # grad_norm is the norm before clipping: the gradients left in the parameters were scaled down to 0.5
    left = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in fresh.parameters()]))
    assert grad_norm > 0.5 and left == pytest.approx(0.5, rel=1e-4)
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, fresh.parameters()))
    with pytest.raises(TypeError, match="return_grad_norm"):
        tr.train_step(fresh, optimizer, src, tgt, return_grad_norm=1)


def test_bad_input_gets_a_clear_error(tiny):
    model, _, _ = tiny
    with pytest.raises(ValueError, match=r"sentences\[1\] has 160 characters.*max_len - 2"):
        tr.translate(model, ["the cat", "the cat " * 20])
    with pytest.raises(TypeError, match=r"pairs\[1\] must be a tuple \(english, french\)"):
        tr.evaluate(model, [("the cat sees a dog", "le chat voit un chien"), ("the cat sees a dog",)])
    with pytest.raises(ValueError, match="device must name a torch device.*'nope'"):
        tr.train(toy_pairs(10), device="nope", progress=False)
    with pytest.raises(TypeError, match="device must be a torch.device.*float 3.5"):
        tr.train(toy_pairs(10), device=3.5, progress=False)
    vocab = model.target_vocab
    with pytest.raises(ValueError, match=rf"ids must be ints from 0 to {len(vocab) - 1}.*got 999"):
        vocab.decode([5, 999])
    with pytest.raises(ValueError, match="got -1"):
        vocab.symbols_of([-1])
