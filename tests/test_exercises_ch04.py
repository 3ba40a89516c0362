"""The exercise checks of chapter 04: right, wrong, crashing and untouched answers."""

import math

import pytest
import torch

from attn_course.exercises.ch04 import check_batch_mask, check_causal_mask, check_leak_test, check_masked_attention


def _scaffold(*args):
    ...


# --- right answers -------------------------------------------------------------------------------

def causal_by_hand(T):
    positions = torch.arange(T)
    return positions[None, :] <= positions[:, None]  # (1, T) <= (T, 1) -> (T, T)


def masked_attention(q, k, v, allowed, fill=float("-inf"), zero_empty=True, scale=True):
    scores = q @ k.T / (math.sqrt(q.size(-1)) if scale else 1.0)
    weights = torch.softmax(scores.masked_fill(~allowed, fill), dim=-1)
    if zero_empty:
        weights = weights.masked_fill(~allowed.any(dim=-1, keepdim=True), 0.0)
    return weights @ v, weights


def batch_mask(lengths, T):
    padding = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]  # (B, T)
    return causal_by_hand(T) & padding[:, None, :]


def leaks_future(attention, x):
    T = x.size(1)
    base = attention(x)
    for t in range(T - 1):
        changed = x.clone()
        changed[:, t + 1:] = torch.randn_like(changed[:, t + 1:])
        if not torch.equal(attention(changed)[:, : t + 1], base[:, : t + 1]):
            return True
    return False


def test_right_answers_pass():
    for check, answer in [(check_causal_mask, causal_by_hand), (check_masked_attention, masked_attention),
                          (check_batch_mask, batch_mask), (check_leak_test, leaks_future)]:
        feedback = check(answer)
        assert feedback.status == "correct", str(feedback)
        assert bool(feedback)


def test_equivalent_right_answers_pass():
    assert check_causal_mask(lambda T: torch.ones(T, T).tril().bool())
    assert check_leak_test(lambda attention, x: torch.tensor(leaks_future(attention, x)))


# --- wrong answers say what is wrong -------------------------------------------------------------

@pytest.mark.parametrize(
    "answer, text",
    [
        (lambda T: ~causal_by_hand(T), "*blocked*"),
        (lambda T: causal_by_hand(T).T, "see the future"),
        (lambda T: causal_by_hand(T) & ~torch.eye(T, dtype=torch.bool), "diagonal is missing"),
        (lambda T: causal_by_hand(T).float(), "must return a bool tensor"),
        (lambda T: causal_by_hand(T)[:, :-1], "expected shape"),
        (lambda T: torch.ones(T, T, dtype=torch.bool), "should be"),
        (lambda T: torch.zeros(T, T, dtype=torch.bool), "should be"),
        (lambda T: causal_by_hand(T) if T > 1 else torch.zeros(1, 1, dtype=torch.bool), "T = 1"),
    ],
)
def test_causal_mask_wrong_answers(answer, text):
    feedback = check_causal_mask(answer)
    assert feedback.status == "incorrect" and text in feedback.message, str(feedback)
    assert "Hint:" in str(feedback)


@pytest.mark.parametrize(
    "answer, text",
    [
        (lambda q, k, v, m: masked_attention(q, k, v, m, zero_empty=False), "NaN"),
        (lambda q, k, v, m: masked_attention(q, k, v, m, fill=-1e9, zero_empty=False), "finite fill"),
        (lambda q, k, v, m: masked_attention(q, k, v, ~m), "exactly 0"),
        (lambda q, k, v, m: masked_attention(q, k, v, m, scale=False), "not scaled"),
        (lambda q, k, v, m: masked_attention(q, k, v, m)[1], "pair"),
        (lambda q, k, v, m: (masked_attention(q, k, v, m)[1] @ (2 * v), masked_attention(q, k, v, m)[1]), "values differ"),
        (lambda q, k, v, m: (torch.full((4, 8), float("nan")), masked_attention(q, k, v, m)[1]), "output contains NaN"),
    ],
)
def test_masked_attention_wrong_answers(answer, text):
    feedback = check_masked_attention(answer)
    assert feedback.status == "incorrect" and text in feedback.message, str(feedback)


@pytest.mark.parametrize(
    "answer, text",
    [
        (lambda lengths, T: causal_by_hand(T) & (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None])[:, :, None], "*queries*"),
        (lambda lengths, T: causal_by_hand(T).expand(len(lengths), T, T), "padding is missing"),
        (lambda lengths, T: (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None])[:, None, :].expand(len(lengths), T, T), "causal part is missing"),
        (lambda lengths, T: ~batch_mask(lengths, T), "blocked convention"),
        (lambda lengths, T: batch_mask(lengths, T).int(), "bool mask"),
        (lambda lengths, T: causal_by_hand(T) & (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]), "must have shape (B, T, T)"),
        (lambda lengths, T: batch_mask([n - 1 for n in lengths], T), "sequence 0"),
    ],
)
def test_batch_mask_wrong_answers(answer, text):
    feedback = check_batch_mask(answer)
    assert feedback.status in ("incorrect", "error"), str(feedback)
    assert text in feedback.message, str(feedback)


def test_batch_mask_wrong_broadcast_is_caught_even_when_it_runs():
    # (T, T) & (B, T) runs without error when B == T, and then it is silently wrong.
    answer = lambda lengths, T: causal_by_hand(T) & (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None])
    feedback = check_batch_mask(answer)
    assert feedback.status in ("incorrect", "error")


@pytest.mark.parametrize(
    "answer, text",
    [
        (lambda attention, x: True, "causal self-attention you returned True"),
        (lambda attention, x: False, "without a mask you returned False"),
        (lambda attention, x: "no", "True or False"),
        # Changing only the last token misses a model that peeks at a token in the middle.
        (lambda attention, x: not torch.equal(attention(torch.cat([x[:, :-1], x[:, -1:] + 1], 1))[:, :-1], attention(x)[:, :-1]), "peeks at token 3"),
        # A loose tolerance misses the small leak.
        (lambda attention, x: not torch.allclose(attention(torch.cat([x[:, :1], torch.randn_like(x[:, 1:])], 1))[:, :1], attention(x)[:, :1], atol=1e-2), "peeks"),
    ],
)
def test_leak_test_wrong_answers(answer, text):
    feedback = check_leak_test(answer)
    assert feedback.status == "incorrect" and text in feedback.message, str(feedback)


# --- crashing answers: an "error" feedback, no traceback ------------------------------------------

@pytest.mark.parametrize(
    "check, answer",
    [
        (check_causal_mask, lambda T: torch.ones(T, T).tril(T, T)),
        (check_masked_attention, lambda q, k, v, m: q @ k),
        (check_batch_mask, lambda lengths, T: causal_by_hand(T) & torch.tensor(lengths)[:2]),
        (check_leak_test, lambda attention, x: attention(x[0, 0])),
    ],
)
def test_crashing_answers_give_an_error_feedback(check, answer):
    feedback = check(answer)
    assert feedback.status == "error", str(feedback)
    assert "Your code raised" in feedback.message and "Traceback" not in str(feedback)


# --- the untouched scaffold is "not attempted" ---------------------------------------------------

@pytest.mark.parametrize("check", [check_causal_mask, check_masked_attention, check_batch_mask, check_leak_test])
def test_untouched_scaffold_is_not_attempted(check):
    feedback = check(_scaffold)
    assert feedback.status == "not attempted" and "Not attempted yet" in str(feedback)
    assert not feedback
