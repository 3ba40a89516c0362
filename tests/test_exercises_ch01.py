"""The exercise checks of chapter 01: for each exercise, the right answer written more than one way and a
table of the wrong answers students plausibly write, each rejected with a message that names the mistake."""

import pytest
import torch

from attn_course.exercises.ch01 import check_general_attention, check_luong_attention, check_teacher_forcing_inputs


def scaffold(*args):
    ...  # the cell as handed out


def crashes(*args):
    raise RuntimeError("shapes do not match")


# --- Exercise 1: Luong's general score ------------------------------------------------------------

def general_right(s, H, W_a):
    scores = ((s @ W_a)[:, None, :] * H).sum(-1)  # (B, S)
    weights = torch.softmax(scores, dim=-1)
    return (weights[:, :, None] * H).sum(1), weights


def general_einsum(s, H, W_a):  # another correct formulation
    weights = torch.softmax(torch.einsum("bq,qk,bsk->bs", s, W_a, H), dim=-1)
    return torch.einsum("bs,bsk->bk", weights, H), weights


def general_bmm(s, H, W_a):  # and another: project the keys instead of the query
    keys = H @ W_a.T  # (B, S, Dq)
    weights = torch.softmax((keys @ s[:, :, None])[..., 0], dim=-1)
    return (weights[:, None, :] @ H)[:, 0], weights


def general_transposed(s, H, W_a):
    weights = torch.softmax(((s @ W_a.T)[:, None, :] * H).sum(-1), dim=-1)
    return (weights[:, :, None] * H).sum(1), weights


def general_no_W(s, H, W_a):
    weights = torch.softmax((s[:, None, :] * H).sum(-1), dim=-1)
    return (weights[:, :, None] * H).sum(1), weights


def general_scaled(s, H, W_a):
    weights = torch.softmax(((s @ W_a)[:, None, :] * H).sum(-1) / H.size(-1) ** 0.5, dim=-1)
    return (weights[:, :, None] * H).sum(1), weights


def general_wrong_axis(s, H, W_a):
    weights = torch.softmax(((s @ W_a)[:, None, :] * H).sum(-1), dim=0)
    return (weights[:, :, None] * H).sum(1), weights


def general_scores(s, H, W_a):
    scores = ((s @ W_a)[:, None, :] * H).sum(-1)
    weights = torch.softmax(scores, dim=-1)
    return (weights[:, :, None] * H).sum(1), scores


def general_broadcast(s, H, W_a):
    weights = torch.softmax((s @ W_a) @ H.transpose(1, 2), dim=-1)  # (B, Dk) @ (B, Dk, S) -> (B, B, S)
    return (weights @ H).sum(1), weights


def general_swapped(s, H, W_a):
    context, weights = general_right(s, H, W_a)
    return weights, context


def general_mean_context(s, H, W_a):
    _, weights = general_right(s, H, W_a)
    return H.mean(1), weights


def general_context_broadcast(s, H, W_a):
    _, weights = general_right(s, H, W_a)
    return weights @ H, weights  # (B, S) @ (B, S, Dk) -> (B, B, Dk)


def general_weights_only(s, H, W_a):
    return general_right(s, H, W_a)[1]


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


def luong_renormalised(s, H, padding_mask):  # another correct formulation
    weights = torch.softmax((H @ s[:, :, None])[..., 0], dim=-1) * (~padding_mask)
    total = weights.sum(-1, keepdim=True)
    weights = torch.where(total > 0, weights / total.clamp_min(1e-30), torch.zeros_like(weights))
    return (weights[:, :, None] * H).sum(1), weights


def luong_zero_fill(s, H, padding_mask):
    weights = torch.softmax((H @ s[:, :, None])[..., 0].masked_fill(padding_mask, 0.0), dim=-1)
    return (weights[:, :, None] * H).sum(1), weights


def luong_large_negative(s, H, padding_mask):
    weights = torch.softmax((H @ s[:, :, None])[..., 0].masked_fill(padding_mask, -1e9), dim=-1)
    return (weights[:, :, None] * H).sum(1), weights


def luong_wrong_axis(s, H, padding_mask):
    scores = (H @ s[:, :, None])[..., 0].masked_fill(padding_mask, float("-inf"))
    weights = torch.nan_to_num(torch.softmax(scores, dim=0))
    return (weights[:, :, None] * H).sum(1), weights


def luong_context_ignores_weights(s, H, padding_mask):
    _, weights = luong_right(s, H, padding_mask)
    return (H * (~padding_mask)[:, :, None]).mean(1), weights


def luong_context_broadcast(s, H, padding_mask):
    _, weights = luong_right(s, H, padding_mask)
    return weights @ H, weights  # (B, S) @ (B, S, D) -> (B, B, D)


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


def inputs_roll(target, bos_id):  # another correct formulation
    shifted = torch.roll(target, 1, dims=1).clone()
    shifted[:, 0] = bos_id
    return shifted


def inputs_roll_no_bos(target, bos_id):
    return torch.roll(target, 1, dims=1)


def inputs_batch_axis(target, bos_id):
    return torch.cat([torch.full_like(target[:1], bos_id), target[:-1]], dim=0)


def inputs_bos_replaces_first(target, bos_id):
    inputs = target.clone()
    inputs[:, 0] = bos_id
    return inputs


def inputs_hard_coded(target, bos_id):
    return torch.tensor([[11, 3, 1, 4], [11, 5, 9, 2]])


CASES = [
    # (check, answer, expected status, words the message must contain)
    (check_general_attention, general_right, "correct", "widths differ"),
    (check_general_attention, general_einsum, "correct", "widths differ"),
    (check_general_attention, general_bmm, "correct", "widths differ"),
    (check_general_attention, general_transposed, "incorrect", "W_a transposed"),
    (check_general_attention, general_no_W, "incorrect", "ignore W_a"),
    (check_general_attention, general_scaled, "incorrect", "sqrt(Dk)"),
    (check_general_attention, general_wrong_axis, "incorrect", "dim=0"),
    (check_general_attention, general_scores, "incorrect", "before the softmax"),
    (check_general_attention, general_broadcast, "incorrect", "broadcasts"),
    (check_general_attention, general_swapped, "incorrect", "in that order"),
    (check_general_attention, general_mean_context, "incorrect", "context"),
    (check_general_attention, general_context_broadcast, "incorrect", "own row"),
    (check_general_attention, general_weights_only, "incorrect", "pair"),
    (check_luong_attention, luong_right, "correct", "not NaN"),
    (check_luong_attention, luong_renormalised, "correct", "not NaN"),
    (check_luong_attention, luong_nan_row, "incorrect", "fully padded row"),
    (check_luong_attention, luong_inverted_mask, "incorrect", "True marks padding"),
    (check_luong_attention, luong_no_mask, "incorrect", "exactly 0"),
    (check_luong_attention, luong_zero_fill, "incorrect", "a fill of 0"),
    (check_luong_attention, luong_large_negative, "incorrect", "-1e9"),
    (check_luong_attention, luong_wrong_axis, "incorrect", "dim=0"),
    (check_luong_attention, luong_mask_after_softmax, "incorrect", "after the softmax"),
    (check_luong_attention, luong_context_ignores_weights, "incorrect", "context"),
    (check_luong_attention, luong_context_broadcast, "incorrect", "own row"),
    (check_teacher_forcing_inputs, inputs_right, "correct", "never the token"),
    (check_teacher_forcing_inputs, inputs_roll, "correct", "never the token"),
    (check_teacher_forcing_inputs, inputs_identity, "incorrect", "target itself"),
    (check_teacher_forcing_inputs, inputs_too_long, "incorrect", "drop the last"),
    (check_teacher_forcing_inputs, inputs_bos_last, "incorrect", "begin-of-sequence"),
    (check_teacher_forcing_inputs, inputs_roll_no_bos, "incorrect", "torch.roll"),
    (check_teacher_forcing_inputs, inputs_batch_axis, "incorrect", "batch axis"),
    (check_teacher_forcing_inputs, inputs_bos_replaces_first, "incorrect", "Shift the whole target"),
    (check_teacher_forcing_inputs, inputs_hard_coded, "incorrect", "hard-coding"),
]


@pytest.mark.parametrize("check, answer, status, words", CASES, ids=[f"{c[0].__name__}-{c[1].__name__}" for c in CASES])
def test_feedback(check, answer, status, words):
    feedback = check(answer)
    assert feedback.status == status, str(feedback)
    assert words in str(feedback), str(feedback)
    assert bool(feedback) == (status == "correct")
    if status in ("incorrect", "error"):
        assert "Hint:" in str(feedback)


@pytest.mark.parametrize("check", [check_general_attention, check_luong_attention, check_teacher_forcing_inputs])
def test_scaffold_is_not_attempted_and_crashes_are_reported_without_traceback(check):
    assert check(scaffold).status == "not attempted"
    assert check(None).status == "not attempted"
    feedback = check(crashes)
    assert feedback.status == "error"
    assert "RuntimeError: shapes do not match" in str(feedback) and "Traceback" not in str(feedback)
    assert check("not a function").status == "incorrect"
