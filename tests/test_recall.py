"""The recall model of chapter 12: causal, the token shift, deterministic training, accuracy measured at the
query positions only, and clear errors for bad arguments."""

import pytest
import torch
from torch import nn

import attn_course as ac
from attn_course.recall import RECALL_ATTENTIONS, RecallModel, recall_accuracy, train_recall

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 16  # 8 keys and 8 values


@pytest.mark.parametrize("attention", RECALL_ATTENTIONS)
def test_forward_shape_and_causality(attention):
    torch.manual_seed(0)
    model = RecallModel(VOCAB, attention, d_model=16, qk_head_dim=4, chunk_size=4).eval()
    tokens = torch.randint(0, VOCAB, (2, 9))
    logits = model(tokens)
    assert logits.shape == (2, 9, VOCAB)
    changed = tokens.clone()
    changed[:, 5:] = (changed[:, 5:] + 3) % VOCAB  # change the future of position 4
    with torch.no_grad():
        torch.testing.assert_close(model(changed)[:, :5], logits[:, :5].detach())
        assert not torch.allclose(model(changed)[:, 5:], logits[:, 5:])


@pytest.mark.parametrize("attention", RECALL_ATTENTIONS)
def test_logits_of_the_last_positions_are_those_of_the_whole_sequence(attention):
    torch.manual_seed(0)
    model = RecallModel(VOCAB, attention, d_model=16, qk_head_dim=4, chunk_size=4).eval()
    tokens = torch.randint(0, VOCAB, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens, last=3), model(tokens)[:, -3:])
    # training computes only the queries' logits: in associative recall they are the last N positions
    _, targets = ac.associative_recall(5, 4, num_keys=8, num_values=8, generator=torch.Generator().manual_seed(0))
    assert (targets[:, :-4] == -100).all() and (targets[:, -4:] >= 0).all()


def test_token_shift_shows_each_position_the_previous_token():
    torch.manual_seed(0)
    shifted = RecallModel(VOCAB, "linear", d_model=16, qk_head_dim=4).eval()
    torch.manual_seed(0)
    plain = RecallModel(VOCAB, "linear", d_model=16, qk_head_dim=4, token_shift=False).eval()
    assert shifted.previous_embedding.num_embeddings == VOCAB + 1  # a start token before position 0
    assert plain.previous_embedding is None
    a = torch.tensor([[1, 2, 3]])
    b = torch.tensor([[4, 2, 3]])  # differs only at position 0
    with torch.no_grad():
        # position 1 sees token 0 directly through the shift, even before attention mixes anything
        x_a = shifted.embedding(a) + shifted.previous_embedding(torch.tensor([[VOCAB, 1, 2]]))
        x_b = shifted.embedding(b) + shifted.previous_embedding(torch.tensor([[VOCAB, 4, 2]]))
        assert not torch.allclose(x_a[0, 1], x_b[0, 1])
        assert torch.allclose(x_a[0, 2], x_b[0, 2])
        assert plain(a).shape == (1, 3, VOCAB)


def test_training_is_deterministic_and_leaves_the_global_generator_alone():
    state = torch.get_rng_state()
    first = train_recall("linear", 2, steps=3, batch_size=4, num_keys=4, num_values=4, d_model=8, qk_head_dim=2)
    assert torch.equal(torch.get_rng_state(), state)
    second = train_recall("linear", 2, steps=3, batch_size=4, num_keys=4, num_values=4, d_model=8, qk_head_dim=2)
    assert not first.training
    for p, q in zip(first.parameters(), second.parameters()):
        assert torch.equal(p, q)
    other = train_recall("linear", 2, steps=3, batch_size=4, num_keys=4, num_values=4, d_model=8, qk_head_dim=2, seed=1)
    assert not all(torch.equal(p, q) for p, q in zip(first.parameters(), other.parameters()))


class _Oracle(nn.Module):
    """Answers every query from the pairs it has seen: logits with a 1 at the right value."""

    def __init__(self, num_keys, num_values, wrong=False):
        super().__init__()
        self.num_keys, self.num_values, self.wrong = num_keys, num_values, wrong
        self.dummy = nn.Parameter(torch.zeros(1))

    def forward(self, tokens):
        B, T = tokens.shape
        N = T // 3
        logits = torch.zeros(B, T, self.num_keys + self.num_values)
        for b in range(B):
            stored = {int(tokens[b, 2 * i]): int(tokens[b, 2 * i + 1]) for i in range(N)}
            for t in range(2 * N, T):
                answer = stored[int(tokens[b, t])]
                if self.wrong:  # another value than the right one
                    answer = self.num_keys + (answer - self.num_keys + 1) % self.num_values
                logits[b, t, answer] = 1.0
        return logits


def test_accuracy_counts_the_query_positions_only():
    assert recall_accuracy(_Oracle(8, 8), 4, num_keys=8, num_values=8, num_sequences=20) == 1.0
    assert recall_accuracy(_Oracle(8, 8, wrong=True), 4, num_keys=8, num_values=8, num_sequences=20) == 0.0


def test_softmax_attention_learns_a_few_pairs():
    model = train_recall("softmax", 2, steps=150, batch_size=32, num_keys=8, num_values=8, d_model=32)
    assert recall_accuracy(model, 2, num_keys=8, num_values=8, num_sequences=200) > 0.9


def test_linear_feature_map_and_normaliser_are_passed_on():
    signed = RecallModel(VOCAB, "linear", d_model=16, qk_head_dim=4, feature_map="identity")
    assert signed.attention.feature_map == "identity" and signed.attention.normalize is False
    default = RecallModel(VOCAB, "linear", d_model=16, qk_head_dim=4)
    assert default.attention.feature_map == "elu+1" and default.attention.normalize is True
    torch.manual_seed(0)
    tokens = torch.randint(0, VOCAB, (2, 6))
    assert signed(tokens).shape == (2, 6, VOCAB)


def test_exported():
    assert ac.RecallModel is RecallModel and ac.train_recall is train_recall and ac.recall_accuracy is recall_accuracy


@pytest.mark.parametrize("call, error, pattern", [
    (lambda: RecallModel(VOCAB, "mamba"), ValueError, "attention must be one of"),
    (lambda: RecallModel(VOCAB, "linear", d_model=10, num_heads=3), ValueError, "num_heads must divide d_model"),
    (lambda: RecallModel(VOCAB, "linear", qk_head_dim=0), ValueError, "qk_head_dim"),
    (lambda: RecallModel(VOCAB, "linear", token_shift=1), TypeError, "token_shift"),
    (lambda: RecallModel(VOCAB, "delta", feature_map="identity"), ValueError, "attention='linear' only"),
    (lambda: RecallModel(VOCAB, "softmax", normalize=False), ValueError, "attention='linear' only"),
    (lambda: RecallModel(VOCAB, "linear", feature_map="identity", normalize=True), ValueError, "normalize"),
    (lambda: RecallModel(VOCAB, "linear")(torch.zeros(1, 3)), TypeError, "integer ids"),
    (lambda: RecallModel(VOCAB, "linear")(torch.tensor([[0, VOCAB]])), ValueError, r"ids in \[0, 16\)"),
    (lambda: RecallModel(VOCAB, "linear")(torch.tensor([[0, 1]]), last=0), ValueError, "last"),
    (lambda: train_recall("delta", 0), ValueError, "num_pairs"),
    (lambda: train_recall("delta", 2, lr=0), ValueError, "lr must be a positive number"),
    (lambda: train_recall("delta", 65), ValueError, "num_pairs must be at most num_keys"),
    (lambda: recall_accuracy("model", 2), TypeError, "model must be an nn.Module"),
])
def test_bad_arguments(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()
