"""The exercise checks of chapter 02: for each exercise, the right answer written two ways and a table
of the wrong answers students plausibly write, each rejected with a message that names the mistake."""

import pytest
import torch
import torch.nn.functional as F

from attn_course.exercises.ch02 import (
    check_attention_without_self,
    check_batched_self_attention,
    check_cosine_self_attention,
    check_stable_softmax,
)

CHECKS = [check_stable_softmax, check_batched_self_attention, check_attention_without_self, check_cosine_self_attention]


def scaffold(*args):
    ...  # the cell as handed out


def crashes(*args):
    raise RuntimeError("shapes do not match")


# --- Exercise 1: a softmax that does not overflow -------------------------------------------------

def softmax_right(s):
    e = torch.exp(s - s.max(dim=-1, keepdim=True).values)
    return e / e.sum(dim=-1, keepdim=True)


def softmax_logsumexp(s):  # another correct formulation
    return torch.exp(s - torch.logsumexp(s, dim=-1, keepdim=True))


def softmax_amax(s):  # and another
    shifted = s - s.amax(dim=-1, keepdim=True)
    return shifted.exp() / shifted.exp().sum(-1, keepdim=True)


def softmax_naive(s):
    return torch.exp(s) / torch.exp(s).sum(dim=-1, keepdim=True)


def softmax_global_max(s):
    e = torch.exp(s - s.max())
    return e / e.sum(dim=-1, keepdim=True)


def softmax_columns(s):
    e = torch.exp(s - s.max(dim=0, keepdim=True).values)
    return e / e.sum(dim=0, keepdim=True)


def softmax_dim1(s):
    e = torch.exp(s - s.max(dim=1, keepdim=True).values)
    return e / e.sum(dim=1, keepdim=True)


def softmax_no_keepdim_max(s):
    e = torch.exp(s - s.max(dim=-1).values)
    return e / e.sum(dim=-1, keepdim=True)


def softmax_no_keepdim_sum(s):
    e = torch.exp(s - s.max(dim=-1, keepdim=True).values)
    return e / e.sum(dim=-1)


def softmax_subtract_min(s):
    e = torch.exp(s - s.min(dim=-1, keepdim=True).values)
    return e / e.sum(dim=-1, keepdim=True)


def softmax_clamped(s):
    e = torch.exp(s.clamp(-80, 80))
    return e / e.sum(dim=-1, keepdim=True)


def softmax_library(s):
    return torch.softmax(s, dim=-1)


def softmax_library_method(s):
    return s.softmax(-1)


def softmax_functional(s):
    return F.softmax(s, dim=-1)


def softmax_global_sum(s):
    e = torch.exp(s - s.max(dim=-1, keepdim=True).values)
    return e / e.sum()


# --- Exercise 2: simple self-attention for a batch ------------------------------------------------

def batched_right(x):
    w = torch.softmax(x @ x.transpose(-2, -1), dim=-1)  # (B, T, T)
    return w @ x, w


def batched_einsum(x):  # another correct formulation
    w = torch.softmax(torch.einsum("bte,bse->bts", x, x), dim=-1)
    return torch.einsum("bts,bse->bte", w, x), w


def batched_bmm_permute(x):  # and another
    w = torch.softmax(torch.bmm(x, x.permute(0, 2, 1)), dim=2)
    return torch.bmm(w, x), w


def batched_dot_T(x):
    w = torch.softmax(x @ x.permute(2, 1, 0), dim=-1)  # what x.T does to a 3-D tensor (deprecated there)
    return w @ x, w


def batched_wrong_axis(x):
    w = torch.softmax(x @ x.transpose(-2, -1), dim=1)
    return w @ x, w


def batched_over_batch(x):
    w = torch.softmax(x @ x.transpose(-2, -1), dim=0)
    return w @ x, w


def batched_weights_only(x):
    return torch.softmax(x @ x.transpose(-2, -1), dim=-1)


def batched_swapped(x):
    context, weights = batched_right(x)
    return weights, context


def batched_no_softmax(x):
    s = x @ x.transpose(-2, -1)
    return s @ x, s


def batched_first_only(x):
    w = torch.softmax(x[0] @ x[0].T, dim=-1)
    return (w @ x[0]).expand_as(x), w.expand(x.size(0), -1, -1)


def batched_context_wrong_order(x):
    w = torch.softmax(x @ x.transpose(-2, -1), dim=-1)
    return w.transpose(-2, -1) @ x, w


# --- Exercise 3: attention that skips itself -------------------------------------------------------

def without_self_right(x):
    T = x.size(-2)
    scores = (x @ x.transpose(-2, -1)).masked_fill(torch.eye(T, dtype=torch.bool), float("-inf"))
    w = torch.softmax(scores, dim=-1)
    return w @ x, w


def without_self_renormalised(x):  # another correct formulation: zero the diagonal, then renormalise
    T = x.size(-2)
    w = torch.softmax(x @ x.transpose(-2, -1), dim=-1) * (1 - torch.eye(T))
    w = w / w.sum(dim=-1, keepdim=True)
    return w @ x, w


def without_self_plain(x):
    w = torch.softmax(x @ x.transpose(-2, -1), dim=-1)
    return w @ x, w


def without_self_zero_score(x):
    T = x.size(-2)
    w = torch.softmax((x @ x.transpose(-2, -1)).masked_fill(torch.eye(T, dtype=torch.bool), 0.0), dim=-1)
    return w @ x, w


def without_self_after_softmax(x):
    T = x.size(-2)
    w = torch.softmax(x @ x.transpose(-2, -1), dim=-1).masked_fill(torch.eye(T, dtype=torch.bool), 0.0)
    return w @ x, w


def without_self_anti_diagonal(x):
    T = x.size(-2)
    anti = torch.eye(T, dtype=torch.bool).flip(-1)
    w = torch.softmax((x @ x.transpose(-2, -1)).masked_fill(anti, float("-inf")), dim=-1)
    return w @ x, w


def without_self_causal(x):
    T = x.size(-2)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)  # the other mask of the course's chapters
    w = torch.softmax((x @ x.transpose(-2, -1)).masked_fill(future, float("-inf")), dim=-1)
    return w @ x, w


def without_self_inverted(x):
    T = x.size(-2)
    w = torch.softmax((x @ x.transpose(-2, -1)).masked_fill(~torch.eye(T, dtype=torch.bool), float("-inf")), dim=-1)
    return w @ x, w


def without_self_old_context(x):
    _, w = without_self_right(x)
    return torch.softmax(x @ x.transpose(-2, -1), dim=-1) @ x, w


def without_self_batch_axis(x):
    n = x.size(0)  # right for one sentence (T, E), wrong for a batch (B, T, E)
    scores = (x @ x.transpose(-2, -1)).masked_fill(torch.eye(n, dtype=torch.bool), float("-inf"))
    w = torch.softmax(scores, dim=-1)
    return w @ x, w


# --- Exercise 4: cosine-similarity attention ------------------------------------------------------

def cosine_right(x, temperature):
    unit = x / x.norm(dim=-1, keepdim=True)
    w = torch.softmax(unit @ unit.transpose(-2, -1) / temperature, dim=-1)
    return w @ x, w


def cosine_normalize(x, temperature):  # another correct formulation
    unit = F.normalize(x, dim=-1)
    w = F.softmax(torch.einsum("...te,...se->...ts", unit, unit) / temperature, dim=-1)
    return w @ x, w


def cosine_similarity_fn(x, temperature):  # and another
    scores = F.cosine_similarity(x.unsqueeze(-2), x.unsqueeze(-3), dim=-1)  # (..., T, T)
    w = torch.softmax(scores / temperature, dim=-1)
    return w @ x, w


def cosine_not_normalised(x, temperature):
    w = torch.softmax(x @ x.transpose(-2, -1) / temperature, dim=-1)
    return w @ x, w


def cosine_per_feature(x, temperature):
    unit = x / x.norm(dim=-2, keepdim=True)
    w = torch.softmax(unit @ unit.transpose(-2, -1) / temperature, dim=-1)
    return w @ x, w


def cosine_times_temperature(x, temperature):
    unit = x / x.norm(dim=-1, keepdim=True)
    w = torch.softmax(unit @ unit.transpose(-2, -1) * temperature, dim=-1)
    return w @ x, w


def cosine_no_temperature(x, temperature):
    unit = x / x.norm(dim=-1, keepdim=True)
    w = torch.softmax(unit @ unit.transpose(-2, -1), dim=-1)
    return w @ x, w


def cosine_wrong_axis(x, temperature):
    unit = x / x.norm(dim=-1, keepdim=True)
    w = torch.softmax(unit @ unit.transpose(-2, -1) / temperature, dim=-2)
    return w @ x, w


def cosine_unit_context(x, temperature):
    unit = x / x.norm(dim=-1, keepdim=True)
    w = torch.softmax(unit @ unit.transpose(-2, -1) / temperature, dim=-1)
    return w @ unit, w


def cosine_fixed_temperature(x, temperature):
    return cosine_right(x, 0.5)


def cosine_squared_norm(x, temperature):
    unit = x / (x * x).sum(dim=-1, keepdim=True)
    w = torch.softmax(unit @ unit.transpose(-2, -1) / temperature, dim=-1)
    return w @ x, w


CASES = [
    # (check, answer, expected status, words the message must contain)
    (check_stable_softmax, softmax_right, "correct", "any shape"),
    (check_stable_softmax, softmax_logsumexp, "correct", "any shape"),
    (check_stable_softmax, softmax_amax, "correct", "any shape"),
    (check_stable_softmax, softmax_naive, "incorrect", "overflows"),
    (check_stable_softmax, softmax_global_max, "incorrect", "one maximum for the whole tensor"),
    (check_stable_softmax, softmax_columns, "incorrect", "columns sum to one"),
    (check_stable_softmax, softmax_dim1, "incorrect", "axis 1"),
    (check_stable_softmax, softmax_no_keepdim_max, "incorrect", "keepdim"),
    (check_stable_softmax, softmax_no_keepdim_sum, "incorrect", "keepdim"),
    (check_stable_softmax, softmax_subtract_min, "incorrect", "minimum"),
    (check_stable_softmax, softmax_clamped, "incorrect", "clamp"),
    (check_stable_softmax, softmax_library, "incorrect", "write it yourself"),
    (check_stable_softmax, softmax_library_method, "incorrect", "write it yourself"),
    (check_stable_softmax, softmax_functional, "incorrect", "write it yourself"),
    (check_stable_softmax, softmax_global_sum, "incorrect", "values differ"),
    (check_batched_self_attention, batched_right, "correct", "every sequence"),
    (check_batched_self_attention, batched_einsum, "correct", "every sequence"),
    (check_batched_self_attention, batched_bmm_permute, "correct", "every sequence"),
    (check_batched_self_attention, batched_dot_T, "error", "transpose(-2, -1)"),
    (check_batched_self_attention, batched_wrong_axis, "incorrect", "columns sum to one"),
    (check_batched_self_attention, batched_over_batch, "incorrect", "across the batch"),
    (check_batched_self_attention, batched_weights_only, "incorrect", "pair"),
    (check_batched_self_attention, batched_swapped, "incorrect", "in that order"),
    (check_batched_self_attention, batched_no_softmax, "incorrect", "values differ"),
    (check_batched_self_attention, batched_first_only, "incorrect", "values differ"),
    (check_batched_self_attention, batched_context_wrong_order, "incorrect", "context"),
    (check_attention_without_self, without_self_right, "correct", "no token attends to itself"),
    (check_attention_without_self, without_self_renormalised, "correct", "no token attends to itself"),
    (check_attention_without_self, without_self_plain, "incorrect", "plain self-attention"),
    (check_attention_without_self, without_self_zero_score, "incorrect", "A score of 0 is not enough"),
    (check_attention_without_self, without_self_after_softmax, "incorrect", "after the softmax"),
    (check_attention_without_self, without_self_anti_diagonal, "incorrect", "same token"),
    (check_attention_without_self, without_self_causal, "incorrect", "same token"),
    (check_attention_without_self, without_self_inverted, "incorrect", "inverted"),
    (check_attention_without_self, without_self_old_context, "incorrect", "plain self-attention's context"),
    (check_attention_without_self, without_self_batch_axis, "error", "masked_fill"),
    (check_cosine_self_attention, cosine_right, "correct", "directions"),
    (check_cosine_self_attention, cosine_normalize, "correct", "directions"),
    (check_cosine_self_attention, cosine_similarity_fn, "correct", "directions"),
    (check_cosine_self_attention, cosine_not_normalised, "incorrect", "did not normalise"),
    (check_cosine_self_attention, cosine_per_feature, "incorrect", "each feature"),
    (check_cosine_self_attention, cosine_times_temperature, "incorrect", "multiplied by the temperature"),
    (check_cosine_self_attention, cosine_no_temperature, "incorrect", "left out the temperature"),
    (check_cosine_self_attention, cosine_wrong_axis, "incorrect", "over the queries"),
    (check_cosine_self_attention, cosine_unit_context, "incorrect", "original vectors"),
    (check_cosine_self_attention, cosine_fixed_temperature, "incorrect", "temperature 0.1"),
    (check_cosine_self_attention, cosine_squared_norm, "incorrect", "values differ"),
]


@pytest.mark.parametrize("check, answer, status, words", CASES, ids=[f"{c[0].__name__}-{c[1].__name__}" for c in CASES])
def test_feedback(check, answer, status, words):
    feedback = check(answer)
    assert feedback.status == status, str(feedback)
    assert words in str(feedback), str(feedback)
    assert bool(feedback) == (status == "correct")
    if status in ("incorrect", "error"):
        assert "Hint:" in str(feedback)


@pytest.mark.parametrize("check", CHECKS)
def test_scaffold_is_not_attempted_and_crashes_are_reported_without_traceback(check):
    assert check(scaffold).status == "not attempted"
    assert check(None).status == "not attempted"
    feedback = check(crashes)
    assert feedback.status == "error"
    assert "RuntimeError: shapes do not match" in str(feedback) and "Traceback" not in str(feedback)
    assert check("not a function").status == "incorrect"


def test_the_softmax_check_puts_torch_back_as_it_was():
    softmax, method, functional = torch.softmax, torch.Tensor.softmax, F.softmax
    check_stable_softmax(softmax_library)
    check_stable_softmax(crashes)
    assert torch.softmax is softmax and F.softmax is functional and "softmax" not in vars(torch.Tensor)
    assert torch.Tensor.softmax is method
    torch.testing.assert_close(torch.tensor([0.0, 0.0]).softmax(-1), torch.tensor([0.5, 0.5]))
