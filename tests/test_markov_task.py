"""The toy language-modelling task of chapters 09 to 11 (attn_course.training): data, floor, training, comparison."""

import math

import pytest
import torch
from torch import nn

import attn_course as ac
from attn_course.training import MarkovTask, QualityResult, markov_sequences, markov_task, quality_vs_cache

pytestmark = pytest.mark.usefixtures("one_thread")


def _by_hand(count, length, seed, vocab=12, table_seed=0):
    """The generation the chapters wrote inline before the task moved to the package."""
    transition = (torch.randn(vocab, vocab, vocab, generator=torch.Generator().manual_seed(table_seed)) * 3).softmax(-1)
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.empty(count, length, dtype=torch.long)
    tokens[:, :2] = torch.randint(0, vocab, (count, 2), generator=generator)
    for t in range(2, length):
        tokens[:, t] = torch.multinomial(transition[tokens[:, t - 2], tokens[:, t - 1]], 1, generator=generator)[:, 0]
    return transition, tokens


def test_the_task_draws_the_chapters_sequences_and_leaves_the_global_generator_alone():
    state = torch.get_rng_state()
    task = markov_task(train_sequences=64, test_sequences=16, test_length=40)
    assert torch.equal(torch.get_rng_state(), state)
    transition, train = _by_hand(64, 33, seed=1)
    _, test = _by_hand(16, 41, seed=2)
    torch.testing.assert_close(task.transition, transition)
    assert torch.equal(task.train_tokens, train) and torch.equal(task.test_tokens, test)
    assert task.vocab_size == 12 and task.train_tokens.dtype == torch.long


def test_each_token_follows_the_table_of_the_two_before_it():
    transition = torch.zeros(3, 3, 3)
    transition[..., 0] = 1.0  # the next token is always 0
    transition[0, 0] = torch.tensor([0.0, 0.0, 1.0])  # except after (0, 0): 2
    tokens = markov_sequences(transition, 50, 6, seed=3)
    for row in tokens.tolist():
        for t in range(2, 6):
            assert row[t] == (2 if (row[t - 2], row[t - 1]) == (0, 0) else 0)


def test_the_floor_is_the_loss_of_the_table_itself():
    task = markov_task(train_sequences=8, test_sequences=300, test_length=20)
    floor = task.best_loss_per_position()
    assert floor.shape == (20,)
    assert floor[0] == pytest.approx(math.log(12))  # token 1 is uniform: nothing to predict it from
    tokens = task.test_tokens
    p = task.transition.double()[tokens[:, :-2], tokens[:, 1:-1], tokens[:, 2:]]
    torch.testing.assert_close(floor[1:], -p.log().mean(0))
    assert task.best_loss() == pytest.approx(float(floor.mean()))
    assert 0.9 < float(floor[1:].mean()) < 1.05  # peaked: far below ln 12

    class Oracle(nn.Module):
        """Predicts with the table itself: its loss is the floor."""
        def __init__(self):
            super().__init__()
            self.unused = nn.Parameter(torch.zeros(()))

        def forward(self, tokens):
            logits = torch.zeros(*tokens.shape, 12, dtype=torch.float64)
            logits[:, 1:] = task.transition.double()[tokens[:, :-1], tokens[:, 1:]].log()
            return logits

    torch.testing.assert_close(task.loss_per_position(Oracle()).double(), floor)
    assert task.test_loss(Oracle()) == pytest.approx(task.best_loss())


def test_training_learns_the_rule_and_quality_vs_cache_reports_every_seed():
    task = markov_task(train_sequences=512, test_sequences=64, test_length=16, train_length=16)
    build = {"G = 2": lambda: ac.DecoderOnlyLM(12, d_model=16, num_heads=4, num_layers=1, d_ff=32, max_len=32,
                                               position="rotary", num_kv_heads=2),
             "G = 1": lambda: ac.DecoderOnlyLM(12, d_model=16, num_heads=4, num_layers=1, d_ff=32, max_len=32,
                                               position="rotary", num_kv_heads=1)}
    results = quality_vs_cache(build, task, seeds=(0, 1), steps=120, lr=1e-2)
    assert list(results) == ["G = 2", "G = 1"]
    for result in results.values():
        assert isinstance(result, QualityResult) and len(result.test_losses) == 2 and len(result.models) == 2
        assert result.low <= result.mean <= result.high
        assert result.high < math.log(12) - 0.3  # learned something in 120 steps
        assert not result.models[0].training
    assert results["G = 2"].cache_bytes_per_token == 2 * 2 * 4 * 4  # keys and values, 2 heads of width 4, float32
    assert results["G = 1"].cache_bytes_per_token == 2 * 1 * 4 * 4
    # the same seed gives the same model; another seed another one
    again = quality_vs_cache({"G = 2": build["G = 2"]}, task, seeds=(0,), steps=120, lr=1e-2)["G = 2"]
    assert again.test_losses[0] == pytest.approx(results["G = 2"].test_losses[0], abs=1e-6)
    assert results["G = 2"].test_losses[0] != results["G = 2"].test_losses[1]


@pytest.mark.parametrize("call, error, match", [
    (lambda: markov_task(vocab_size=0), ValueError, "vocab_size"),
    (lambda: markov_task(sharpness=-1.0), ValueError, "sharpness"),
    (lambda: markov_task(test_length=2.5), TypeError, "test_length"),
    (lambda: markov_sequences(torch.ones(3, 3), 2, 4, 0), ValueError, "transition"),
    (lambda: markov_sequences(torch.ones(3, 3, 3) / 3, 2, 1, 0), ValueError, "length"),
    (lambda: markov_task(train_sequences=4, test_sequences=4).best_loss_per_position(torch.zeros(3)), ValueError, "tokens"),
    (lambda: quality_vs_cache({}, None), TypeError, "builders"),
    (lambda: quality_vs_cache({"a": 3}, None), TypeError, "builders\\['a'\\]"),
    (lambda: quality_vs_cache({"a": nn.Identity}, markov_task(train_sequences=4, test_sequences=4), seeds=3),
     TypeError, "seeds"),
])
def test_bad_arguments_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_the_task_is_exported():
    assert ac.markov_task is markov_task and ac.MarkovTask is MarkovTask and ac.quality_vs_cache is quality_vs_cache
