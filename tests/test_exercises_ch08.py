"""The exercise checks of chapter 08: right, wrong, crashing and untouched answers."""

import math

import pytest
import torch

from attn_course.exercises.ch08 import check_attention_row_online, check_kv_cache_bytes, check_online_softmax_update


def _scaffold(*args):
    ...


# --- right answers -------------------------------------------------------------------------------

def update(running_max, running_sum, block, rescale=True):
    new_max = torch.maximum(running_max, block.amax(dim=-1))
    old = running_sum * torch.exp(running_max - new_max) if rescale else running_sum
    return new_max, old + torch.exp(block - new_max[:, None]).sum(dim=-1)


def attention_row(query, keys, values, block_size, scale=True, normalise=True):
    row_max, row_sum = torch.tensor(float("-inf"), dtype=query.dtype), torch.tensor(0.0, dtype=query.dtype)
    acc = torch.zeros(values.size(-1), dtype=query.dtype)
    for start in range(0, keys.size(0), block_size):
        scores = keys[start:start + block_size] @ query / (math.sqrt(query.size(0)) if scale else 1.0)
        new_max = torch.maximum(row_max, scores.max())
        correction, probs = torch.exp(row_max - new_max), torch.exp(scores - new_max)
        row_sum = row_sum * correction + probs.sum()
        acc = acc * correction + probs @ values[start:start + block_size]
        row_max = new_max
    return acc / row_sum if normalise else acc


def kv_cache_bytes(num_layers, num_heads, head_dim, seq_len, batch_size, bytes_per_number):
    return 2 * num_layers * num_heads * head_dim * seq_len * batch_size * bytes_per_number


def test_right_answers_pass():
    for feedback in (check_online_softmax_update(update), check_attention_row_online(attention_row),
                     check_kv_cache_bytes(kv_cache_bytes)):
        assert feedback.status == "correct", str(feedback)
        assert bool(feedback)
    assert "16 GiB" in check_kv_cache_bytes(kv_cache_bytes).message


def test_float32_answers_pass():
    assert check_online_softmax_update(lambda m, s, b: tuple(t.double() for t in update(m.float(), s.float(), b.float())))
    assert check_attention_row_online(lambda q, k, v, n: attention_row(q.float(), k.float(), v.float(), n))


# --- wrong answers say what is wrong -------------------------------------------------------------

@pytest.mark.parametrize(
    "check, answer, text",
    [
        (check_online_softmax_update, lambda m, s, b: update(m, s, b, rescale=False), "multiply it by exp(running_max - new_max)"),
        (check_online_softmax_update, lambda m, s, b: (b.amax(dim=-1), s), "new_max"),
        (check_online_softmax_update, lambda m, s, b: update(m, s, b)[0], "return a pair"),
        (check_online_softmax_update, lambda m, s, b: (update(m, s, b)[0], torch.exp(b).sum(-1)), "new_sum"),
        (check_attention_row_online, lambda q, k, v, n: attention_row(q, k, v, n, scale=False), "1/sqrt(D)"),
        (check_attention_row_online, lambda q, k, v, n: attention_row(q, k, v, n, normalise=False), "not divided by the running sum"),
        (check_attention_row_online, lambda q, k, v, n: attention_row(q, k[:n], v[:n], n), "block_size=4"),
        (check_attention_row_online, lambda q, k, v, n: v.mean(0)[:2], "expected shape (3,)"),
        (check_kv_cache_bytes, lambda *a: kv_cache_bytes(*a) // 2, "keys *and* values"),
        (check_kv_cache_bytes, lambda *a: kv_cache_bytes(*a) * 8, "expected 37,748,736 bytes"),
        (check_kv_cache_bytes, lambda *a: str(kv_cache_bytes(*a)), "return a number"),
    ],
)
def test_wrong_answers_are_explained(check, answer, text):
    feedback = check(answer)
    assert feedback.status == "incorrect", str(feedback)
    assert text in str(feedback)
    assert "Hint:" in str(feedback)


@pytest.mark.parametrize("check", [check_online_softmax_update, check_attention_row_online, check_kv_cache_bytes])
def test_crashing_and_untouched_answers(check):
    crashed = check(lambda *args: 1 / 0)
    assert crashed.status == "error" and "ZeroDivisionError" in str(crashed) and "Traceback" not in str(crashed)
    for untouched in (_scaffold, ...):
        assert check(untouched).status == "not attempted"
        assert "Not attempted yet" in str(check(untouched))
