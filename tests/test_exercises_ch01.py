"""The exercise checks of chapter 01: right, wrong, crashing and untouched answers."""

import pytest
import torch

from attn_course.exercises.ch01 import check_bahdanau_attention, check_luong_attention, check_teacher_forcing_inputs


def scaffold(*args):
    ...  # the cell as handed out


def crashes(*args):
    raise RuntimeError("shapes do not match")


# --- Exercise 1 -----------------------------------------------------------------------------------

def bahdanau_right(s, H, W, U, v):
    hidden = torch.tanh((s @ W.T)[:, None, :] + H @ U.T)  # (B, S, A)
    weights = torch.softmax(hidden @ v, dim=-1)  # (B, S)
    return (weights[:, :, None] * H).sum(1), weights


def bahdanau_no_tanh(s, H, W, U, v):
    scores = ((s @ W.T)[:, None, :] + H @ U.T) @ v
    weights = torch.softmax(scores, dim=-1)
    return (weights[:, :, None] * H).sum(1), weights


def bahdanau_wrong_axis(s, H, W, U, v):
    weights = torch.softmax(torch.tanh((s @ W.T)[:, None, :] + H @ U.T) @ v, dim=0)
    return (weights[:, :, None] * H).sum(1), weights


def bahdanau_wrong_context(s, H, W, U, v):
    _, weights = bahdanau_right(s, H, W, U, v)
    return H.mean(1), weights


def bahdanau_one_output(s, H, W, U, v):
    return bahdanau_right(s, H, W, U, v)[1]


# --- Exercise 2 -----------------------------------------------------------------------------------

def luong_right(s, H, padding_mask):
    scores = (H @ s[:, :, None])[..., 0].masked_fill(padding_mask, float("-inf"))  # (B, S)
    weights = torch.nan_to_num(torch.softmax(scores, dim=-1))
    return (weights[:, :, None] * H).sum(1), weights


def luong_nan_row(s, H, padding_mask):
    scores = (H @ s[:, :, None])[..., 0].masked_fill(padding_mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return (weights[:, :, None] * H).sum(1), weights


def luong_inverted_mask(s, H, padding_mask):
    return luong_right(s, H, ~padding_mask)


def luong_no_mask(s, H, padding_mask):
    weights = torch.softmax((H @ s[:, :, None])[..., 0], dim=-1)
    return (weights[:, :, None] * H).sum(1), weights


def luong_mask_after_softmax(s, H, padding_mask):
    weights = torch.softmax((H @ s[:, :, None])[..., 0], dim=-1).masked_fill(padding_mask, 0.0)  # not renormalised
    return (weights[:, :, None] * H).sum(1), weights


# --- Exercise 3 -----------------------------------------------------------------------------------

def inputs_right(target, bos_id):
    return torch.cat([torch.full_like(target[:, :1], bos_id), target[:, :-1]], dim=1)


def inputs_identity(target, bos_id):
    return target


def inputs_too_long(target, bos_id):
    return torch.cat([torch.full_like(target[:, :1], bos_id), target], dim=1)


def inputs_bos_last(target, bos_id):
    return torch.cat([target[:, 1:], torch.full_like(target[:, :1], bos_id)], dim=1)


def inputs_hard_coded(target, bos_id):
    return torch.tensor([[11, 3, 1, 4], [11, 5, 9, 2]])


CASES = [
    # (check, answer, expected status, words the message must contain)
    (check_bahdanau_attention, bahdanau_right, "correct", "AdditiveAttention"),
    (check_bahdanau_attention, bahdanau_no_tanh, "incorrect", "without the tanh"),
    (check_bahdanau_attention, bahdanau_wrong_axis, "incorrect", "dim=0"),
    (check_bahdanau_attention, bahdanau_wrong_context, "incorrect", "context"),
    (check_bahdanau_attention, bahdanau_one_output, "incorrect", "pair"),
    (check_luong_attention, luong_right, "correct", "not NaN"),
    (check_luong_attention, luong_nan_row, "incorrect", "fully padded row"),
    (check_luong_attention, luong_inverted_mask, "incorrect", "True marks padding"),
    (check_luong_attention, luong_no_mask, "incorrect", "exactly 0"),
    (check_luong_attention, luong_mask_after_softmax, "incorrect", "values differ"),
    (check_teacher_forcing_inputs, inputs_right, "correct", "never the token"),
    (check_teacher_forcing_inputs, inputs_identity, "incorrect", "target itself"),
    (check_teacher_forcing_inputs, inputs_too_long, "incorrect", "drop the last"),
    (check_teacher_forcing_inputs, inputs_bos_last, "incorrect", "begin-of-sequence"),
    (check_teacher_forcing_inputs, inputs_hard_coded, "incorrect", "hard-coding"),
]


@pytest.mark.parametrize("check, answer, status, words", CASES, ids=[f"{c[0].__name__}-{c[1].__name__}" for c in CASES])
def test_feedback(check, answer, status, words):
    feedback = check(answer)
    assert feedback.status == status, str(feedback)
    assert words in str(feedback), str(feedback)
    assert bool(feedback) == (status == "correct")
    if status == "incorrect":
        assert "Hint:" in str(feedback)


@pytest.mark.parametrize("check", [check_bahdanau_attention, check_luong_attention, check_teacher_forcing_inputs])
def test_scaffold_is_not_attempted_and_crashes_are_reported_without_traceback(check):
    assert check(scaffold).status == "not attempted"
    assert check(None).status == "not attempted"
    feedback = check(crashes)
    assert feedback.status == "error"
    assert "RuntimeError: shapes do not match" in str(feedback) and "Traceback" not in str(feedback)
    assert check("not a function").status == "incorrect"
