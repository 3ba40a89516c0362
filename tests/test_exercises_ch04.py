"""The exercise checks of chapter 04: right, wrong, crashing and untouched answers."""

import math

import pytest
import torch

from attn_course.exercises.ch04 import (
    check_batch_mask,
    check_causal_mask,
    check_leak_test,
    check_masked_attention,
    check_sliding_window_mask,
)


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


def renormalise_after(q, k, v, allowed):
    kept = torch.softmax(q @ k.T / math.sqrt(q.size(-1)), dim=-1) * allowed
    weights = (kept / kept.sum(dim=-1, keepdim=True)).nan_to_num(0.0)
    return weights @ v, weights


def masked_attention_where(q, k, v, allowed):
    # A correct alternative: torch.where, and the scale written as a product.
    scores = (q * q.size(-1) ** -0.5) @ k.transpose(0, 1)
    weights = torch.softmax(torch.where(allowed, scores, torch.full_like(scores, float("-inf"))), dim=-1)
    weights = torch.where(allowed.any(-1, keepdim=True), weights, torch.zeros_like(weights))
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
    assert check_causal_mask(lambda T: torch.arange(T).unsqueeze(1) >= torch.arange(T).unsqueeze(0))
    assert check_masked_attention(masked_attention_where)
    assert check_masked_attention(lambda q, k, v, m: masked_attention(q, k, v, m, fill=torch.finfo(q.dtype).min))
    assert check_leak_test(lambda attention, x: torch.tensor(leaks_future(attention, x)))


# --- wrong answers say what is wrong -------------------------------------------------------------

@pytest.mark.parametrize(
    "answer, text",
    [
        (lambda T: ~causal_by_hand(T), "*blocked*"),
        (lambda T: causal_by_hand(T).T, "see the future"),
        (lambda T: causal_by_hand(T) & ~torch.eye(T, dtype=torch.bool), "diagonal is missing"),
        (lambda T: causal_by_hand(T).float(), "must return a bool tensor"),
        # (fourth review) An int mask: the message says only a bool mask means allowed or blocked, not "a float mask".
        (lambda T: causal_by_hand(T).int(), "Only a bool mask means allowed or blocked"),
        (lambda T: causal_by_hand(T)[:, :-1], "expected shape"),
        (lambda T: torch.ones(T, T, dtype=torch.bool), "nothing is masked"),
        (lambda T: torch.zeros(T, T, dtype=torch.bool), "should be"),
        (lambda T: causal_by_hand(T) if T > 1 else torch.zeros(1, 1, dtype=torch.bool), "T = 1"),
        (lambda T: torch.arange(T)[None, :] <= torch.arange(T)[:, None] + 1, "off by one"),
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
        (lambda q, k, v, m: masked_attention(q, k, v, m)[1], "return (output, weights)"),
        (lambda q, k, v, m: (masked_attention(q, k, v, m)[1] @ (2 * v), masked_attention(q, k, v, m)[1]), "values differ"),
        (lambda q, k, v, m: (torch.full((4, 8), float("nan")), masked_attention(q, k, v, m)[1]), "output contains NaN"),
        # Zero the blocked weights after the softmax, without renormalising: rows no longer sum to one.
        (lambda q, k, v, m: (lambda w: (w @ v, w))(torch.softmax(q @ k.T / math.sqrt(q.size(-1)), dim=-1) * m), "values differ"),
        # Softmax first, then zero and renormalise (section 3): fine on tame scores, 0/0 on a huge blocked score.
        (renormalise_after, "renormalise"),
        # -1e9 with the empty rows zeroed: right in float32, an overflow in float16.
        (lambda q, k, v, m: masked_attention(q, k, v, m, fill=-1e9), "does not exist in float16"),
        (lambda q, k, v, m: masked_attention(q, k, v, m, fill=torch.finfo(torch.float32).min), "does not exist in float16"),
        # Scaled by the number of keys instead of the width.
        (lambda q, k, v, m: (lambda s: (lambda w: (w @ v, w))(torch.softmax(s.masked_fill(~m, float("-inf")), -1).nan_to_num(0.0)))(q @ k.T / math.sqrt(k.size(0))), "number of keys"),
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
        # Padding blocked as keys and as queries: the same mask as queries only, behind the causal mask.
        (lambda lengths, T: batch_mask(lengths, T) & (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None])[:, :, None], "padding *queries*"),
        # (fourth review) The message must not say the keys are left open: blocking both gives this same mask.
        (lambda lengths, T: batch_mask(lengths, T) & (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None])[:, :, None], "alone or together with the padding keys"),
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


def _leak_test(*, start=None, compare=lambda out, t: out[:, : t + 1], tolerance=None, rtol=1e-5, perturb_earlier=False):
    """A leak test built from one of the ways students write it; the defaults give the right one.
    ``tolerance="default"`` is torch.allclose with its default tolerances."""
    def same(a, b):
        if tolerance is None:
            return torch.equal(a, b)
        if tolerance == "default":
            return torch.allclose(a, b)
        return torch.allclose(a, b, atol=tolerance, rtol=rtol)

    def leaks_future(model, x):
        T = x.size(1)
        base = model(x)
        for t in range(T - 1) if start is None else [start]:
            changed = x.clone()
            if perturb_earlier:
                changed[:, : t + 1] = torch.randn_like(changed[:, : t + 1])
            else:
                changed[:, t + 1:] = torch.randn_like(changed[:, t + 1:])
            if not same(compare(model(changed), t), compare(base, t)):
                return True
        return False
    return leaks_future


def leaks_one_token_at_a_time(model, x):
    # A correct alternative: change one later token j at a time (for a new random vector: adding 1.0 to every
    # feature would leave a centred copy of the token unchanged), compare every output before it.
    base = model(x)
    for j in range(1, x.size(1)):
        changed = x.clone()
        changed[:, j] = torch.randn_like(changed[:, j])
        if not torch.equal(model(changed)[:, :j], base[:, :j]):
            return True
    return False


def test_leak_test_alternatives_pass():
    for answer in (
        leaks_one_token_at_a_time,
        _leak_test(compare=lambda out, t: out[:, t]),                 # only output t itself, for every t
        lambda model, x: torch.tensor(_leak_test()(model, x)),         # a 0-d bool tensor
    ):
        feedback = check_leak_test(answer)
        assert feedback.status == "correct", str(feedback)


def _leak_skipping_t0(model, x):
    # Wrong: off by one, the loop starts at t = 1 (the second review).
    base = model(x)
    for t in range(1, x.size(1) - 1):
        changed = x.clone()
        changed[:, t + 1:] = torch.randn_like(changed[:, t + 1:])
        if not torch.equal(model(changed)[:, : t + 1], base[:, : t + 1]):
            return True
    return False


def _leak_flag_overwritten(model, x):
    # Wrong: the flag is set for each sequence in turn, so only the last sequence's comparison counts.
    base = model(x)
    for t in range(x.size(1) - 1):
        changed = x.clone()
        changed[:, t + 1:] = torch.randn_like(changed[:, t + 1:])
        out = model(changed)
        for b in range(x.size(0)):
            leak = not torch.equal(out[b, : t + 1], base[b, : t + 1])
        if leak:
            return True
    return False


def _leak_test_changing_by(change):
    """A leak test with the right loop and an exact comparison, whose later tokens are changed by ``change``."""
    def leaks_future(model, x):
        base = model(x)
        for t in range(x.size(1) - 1):
            changed = x.clone()
            changed[:, t + 1:] = change(changed[:, t + 1:])
            if not torch.equal(model(changed)[:, : t + 1], base[:, : t + 1]):
                return True
        return False
    return leaks_future


# The wrong leak tests students write, each with (part of) the message that must name the mistake.
LEAK_TEST_WRONG_ANSWERS = [
    (lambda model, x: True, "causal self-attention you returned True"),
    (lambda model, x: False, "without a mask you returned False"),
    (lambda model, x: "no", "True or False"),
    # The example: perturb every later token, compare output 0 only. Every model of the
    # old check leaked into position 0; the middle peek does not.
    (_leak_test(start=0), "output 4 peeks at token 5"),
    (_leak_test(start=0), "not only position 0"),
    # Change only the last token: misses the peeks from the middle.
    (lambda model, x: not torch.equal(model(torch.cat([x[:, :-1], x[:, -1:] + 1], 1))[:, :-1], model(x)[:, :-1]), "change of token 3"),
    # A loose tolerance misses the 0.001 leaks.
    (_leak_test(tolerance=1e-2), "compare exactly"),
    # Off by one: compare outputs 0..t-1 only, which misses a leak from t + 1 into t.
    (_leak_test(compare=lambda out, t: out[:, :t]), "also sees the next token"),
    # Off by one the other way: compare outputs 0..t+1, which include a changed token's own output.
    (_leak_test(compare=lambda out, t: out[:, : t + 2]), "causal self-attention you returned True"),
    # Compare the whole output: every model "leaks".
    (_leak_test(compare=lambda out, t: out), "compare only the positions before it"),
    # Perturb the past and compare the earlier outputs: the wrong direction.
    (_leak_test(perturb_earlier=True), "causal self-attention you returned True"),
    # Only the first sequence of the batch is compared.
    (_leak_test(compare=lambda out, t: out[0, : t + 1]), "second sequence"),
    # (second review) The loop starts at t = 1: a leak from token 1 into output 0 only is never looked at.
    (_leak_skipping_t0, "does your loop skip t = 0"),
    # (second review) A flag overwritten for each sequence: only the last sequence counts.
    (_leak_flag_overwritten, "first sequence of the batch only"),
    # (second review) The last sequence of the batch only.
    (_leak_test(compare=lambda out, t: out[-1, : t + 1]), "not only the last one's"),
    # (fifth review) Later tokens scaled by 2: a leak through a token's direction does not move.
    (_leak_test_changing_by(lambda later: later * 2), "multiply the later tokens by a positive number"),
    # (fifth review) Later tokens negated, or their features rolled: a leak through a token's length does not move.
    (_leak_test_changing_by(lambda later: -later), "keep each later token's length"),
    (_leak_test_changing_by(lambda later: later.roll(1, dims=-1)), "keep each later token's length"),
]


@pytest.mark.parametrize("answer, text", LEAK_TEST_WRONG_ANSWERS)
def test_leak_test_wrong_answers(answer, text):
    feedback = check_leak_test(answer)
    assert feedback.status == "incorrect" and text in feedback.message, str(feedback)


def test_leak_check_has_a_leaky_model_that_spares_position_0():
    from attn_course.exercises.ch04 import _attention_models

    E, models = _attention_models()
    x = torch.randn(2, 7, E, generator=torch.Generator().manual_seed(0))
    later = x.clone()
    later[:, 1:] = torch.randn_like(later[:, 1:])
    spares_0 = [name for name, model, leaks, _ in models if leaks and torch.equal(model(later)[:, 0], model(x)[:, 0])]
    assert len(spares_0) >= 3, spares_0


# --- exercise 5, a sliding-window mask -----------------------------------------------------------

def band(T, window, low=0, high=None, symmetric=False):
    distance = torch.arange(T)[:, None] - torch.arange(T)[None, :]  # (T, T), query i - key j
    if symmetric:
        distance = distance.abs()
    high = window if high is None else high
    return (distance >= low) & (distance < high)


def window_via_tril(T, window):
    # A correct alternative: the causal triangle minus the triangle that is too old.
    ones = torch.ones(T, T, dtype=torch.bool)
    return ones.tril() & ~ones.tril(-window)


def test_sliding_window_right_answers_pass():
    for answer in (band, lambda T, w: band(T, w).int().bool()):
        feedback = check_sliding_window_mask(answer)
        assert feedback.status == "correct", str(feedback)


SLIDING_WINDOW_WRONG_ANSWERS = [
    (lambda T, w: ~band(T, w), "*blocked*"),
    (lambda T, w: band(T, w, symmetric=True), "symmetric"),
    (lambda T, w: band(T, w).T, "looks forward"),
    (lambda T, w: band(T, w, high=w + 1), "window + 1"),
    (lambda T, w: band(T, w, high=w - 1), "window - 1"),
    (lambda T, w: band(T, w, low=1, high=w + 1), "diagonal is missing"),
    (lambda T, w: torch.arange(T)[None, :] <= torch.arange(T)[:, None], "plain causal mask"),
    (lambda T, w: band(T, w, low=-T), "causal part is missing"),
    (lambda T, w: band(T, w).float(), "bool tensor"),
    (lambda T, w: band(T, min(w, 3)), "should be"),
    (lambda T, w: band(T, w)[:, :-1], "expected shape"),
    # (fifth review) Cut from a fixed-size buffer of 8 positions: right up to T = 8, too small for T = 20.
    (lambda T, w: band(8, w)[:T, :T], "a mask of a fixed size"),
]


@pytest.mark.parametrize("answer, text", SLIDING_WINDOW_WRONG_ANSWERS)
def test_sliding_window_wrong_answers(answer, text):
    feedback = check_sliding_window_mask(answer)
    assert feedback.status == "incorrect" and text in feedback.message, str(feedback)
    assert "Hint:" in str(feedback)


# --- crashing answers: an "error" feedback, no traceback ------------------------------------------

@pytest.mark.parametrize(
    "check, answer",
    [
        (check_causal_mask, lambda T: torch.ones(T, T).tril(T, T)),
        (check_masked_attention, lambda q, k, v, m: q @ k),
        (check_batch_mask, lambda lengths, T: causal_by_hand(T) & torch.tensor(lengths)[:2]),
        (check_leak_test, lambda attention, x: attention(x[0, 0])),
        (check_sliding_window_mask, lambda T, w: torch.ones(T, T).tril(w, T)),
    ],
)
def test_crashing_answers_give_an_error_feedback(check, answer):
    feedback = check(answer)
    assert feedback.status == "error", str(feedback)
    assert "Your code raised" in feedback.message and "Traceback" not in str(feedback)


# --- the untouched scaffold is "not attempted" ---------------------------------------------------

@pytest.mark.parametrize("check", [check_causal_mask, check_masked_attention, check_batch_mask, check_leak_test, check_sliding_window_mask])
def test_untouched_scaffold_is_not_attempted(check):
    feedback = check(_scaffold)
    assert feedback.status == "not attempted" and "Not attempted yet" in str(feedback)
    assert not feedback


# --- the shared mechanism's classes, and the answers the review found accepted --------------------
# (reviews/chapters-03-04.md: tril/triu where the exercise forbids them, leak tests with a tolerance
# as large as the leak; finite fills with the empty rows zeroed are right, and pass.)

def _causal_numpy_tril(T):
    import numpy as np
    return torch.from_numpy(np.tril(np.ones((T, T), dtype=bool)))


def _causal_transformer(T):
    return torch.nn.Transformer.generate_square_subsequent_mask(T) == 0


def _causal_package(T):
    import attn_course as ac
    return ac.causal_mask(T)


def _causal_tril_indices(T):
    mask = torch.zeros(T, T, dtype=torch.bool)
    rows, cols = torch.tril_indices(T, T)
    mask[rows, cols] = True
    return mask


@pytest.mark.parametrize(
    "answer, text",
    [
        (lambda T: torch.ones(T, T).tril().bool(), "you called Tensor.tril"),
        (lambda T: torch.tril(torch.ones(T, T, dtype=torch.bool)), "you called torch.tril"),
        (lambda T: ~torch.ones(T, T, dtype=torch.bool).triu(1), "triu"),
        (lambda T: torch.ones(T, T, dtype=torch.bool).tril_() if T else None, "tril_"),
        (_causal_tril_indices, "tril_indices"),
        (_causal_numpy_tril, "numpy.tril"),
        (_causal_transformer, "generate_square_subsequent_mask"),
        (_causal_package, "attn_course.causal_mask"),
        # Right for the notebook's T = 5 only.
        (lambda T: causal_by_hand(5), "expected shape"),
        # (fifth review) Cut from a fixed-size buffer (section 11's idea): right up to T = 8, too small for T = 20.
        (lambda T: causal_by_hand(8)[:T, :T], "a mask of a fixed size"),
        (lambda T: causal_by_hand(16)[:T, :T], "a buffer of max_len = 16"),
    ],
)
def test_causal_mask_forbidden_routes_and_fixed_sizes(answer, text):
    feedback = check_causal_mask(answer)
    assert feedback.status == "incorrect" and text in feedback.message, str(feedback)


def _masked_sdpa(q, k, v, allowed):  # torch's fused attention for the output: forbidden in exercise 2
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    return out, masked_attention(q, k, v, allowed)[1]


def _masked_package(q, k, v, allowed):
    import attn_course as ac
    return ac.scaled_dot_product_attention(q, k, v, attn_mask=allowed)


def _masked_changes_the_mask(q, k, v, allowed):  # right values, but the caller's mask is inverted in place
    blocked = allowed.logical_not_()
    scores = q @ k.T / q.size(-1) ** 0.5
    weights = torch.softmax(scores.masked_fill(blocked, float("-inf")), dim=-1)
    weights = weights.masked_fill(blocked.all(-1, keepdim=True), 0.0)
    return weights @ v, weights


def _masked_changes_the_scores(q, k, v, allowed):  # in place on q: the caller's queries are scaled
    q /= q.size(-1) ** 0.5
    scores = q @ k.T
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1).nan_to_num(0.0)
    return weights @ v, weights


def _masked_without_max_shift(q, k, v, allowed):  # exp by hand, no maximum subtracted: overflows near 100
    e = torch.exp(q @ k.T / q.size(-1) ** 0.5) * allowed
    total = e.sum(-1, keepdim=True)
    weights = torch.where(total > 0, e / total, torch.zeros_like(e))
    return weights @ v, weights


def _masked_for_right_padding_only(q, k, v, allowed):  # zeroes the last row only: a right-padding habit
    scores = q @ k.T / q.size(-1) ** 0.5
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    weights = torch.where(torch.isnan(weights[2:3]).any(), weights.nan_to_num(0.0), weights) if weights.size(0) > 2 else weights
    return weights @ v, weights


@pytest.mark.parametrize(
    "answer, text",
    [
        (_masked_sdpa, "you called torch.nn.functional.scaled_dot_product_attention"),
        (_masked_package, "you called attn_course.scaled_dot_product_attention"),
        (_masked_changes_the_mask, "changed its input `allowed` in place"),
        (_masked_changes_the_scores, "changed its input `q` in place"),
        (_masked_without_max_shift, "NaN"),
        (_masked_for_right_padding_only, "NaN"),
    ],
)
def test_masked_attention_mechanism_classes(answer, text):
    feedback = check_masked_attention(answer)
    assert feedback.status == "incorrect" and text in feedback.message, str(feedback)


def test_masked_attention_finite_fills_that_fit_the_dtype_pass():
    # The review found these accepted; the chapter now says they are right: a fill of the scores' own
    # dtype's minimum (masked_fill replaces, nothing overflows), or the same as an additive mask, with the
    # rows that may attend to nothing zeroed.
    def additive(q, k, v, allowed):
        scores = q @ k.T / q.size(-1) ** 0.5
        bias = torch.zeros_like(scores).masked_fill(~allowed, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores + bias, dim=-1).masked_fill(~allowed.any(-1, keepdim=True), 0.0)
        return weights @ v, weights

    for answer in (lambda q, k, v, m: masked_attention(q, k, v, m, fill=torch.finfo(q.dtype).min), additive):
        assert check_masked_attention(answer).status == "correct"


def test_masked_attention_finite_fill_that_does_not_fit_float16_is_named():
    feedback = check_masked_attention(lambda q, k, v, m: masked_attention(q, k, v, m, fill=-1e9))
    assert feedback.status == "incorrect" and "does not exist in float16" in feedback.message, str(feedback)


@pytest.mark.parametrize(
    "answer, text",
    [
        (lambda lengths, T: __import__("attn_course").combine_masks(
            causal_by_hand(T), padding=__import__("attn_course").padding_mask(lengths, T)), "you called attn_course"),
        # Built for the notebook's B and T only.
        (lambda lengths, T: batch_mask([4, 1, 3, 2], 4), "expected shape"),
        # Left padding where the exercise pads on the right.
        (lambda lengths, T: causal_by_hand(T) & (torch.arange(T)[None, :] >= T - torch.tensor(lengths)[:, None])[:, None, :],
         "left padding"),
    ],
)
def test_batch_mask_mechanism_classes(answer, text):
    feedback = check_batch_mask(answer)
    assert feedback.status == "incorrect" and text in feedback.message, str(feedback)


# Tolerance-based leak tests as large as the leak (the review: atol = 1e-3 and 2e-3 were accepted).
@pytest.mark.parametrize("tolerance", [1e-3, 2e-3, 1e-4, 1e-5, "default"])
def test_leak_test_with_a_tolerance_is_rejected(tolerance):
    feedback = check_leak_test(_leak_test(tolerance=tolerance))
    assert feedback.status == "incorrect" and "compare exactly" in feedback.message, str(feedback)


def _leak_test_in_place(model, x):  # right logic, but it overwrites the caller's x
    base = model(x)
    for t in range(x.size(1) - 1):
        saved = x[:, t + 1:].clone()
        x[:, t + 1:] = torch.randn_like(saved)
        moved = not torch.equal(model(x)[:, : t + 1], base[:, : t + 1])
        x[:, t + 1:] = saved + 1.0  # and puts back something else
        if moved:
            return True
    return False


def test_leak_test_mechanism_classes():
    import numpy as np

    feedback = check_leak_test(_leak_test_in_place)
    assert feedback.status == "incorrect" and "changed its input `x` in place" in feedback.message, str(feedback)
    # A numpy bool is an answer written differently: it passes.
    assert check_leak_test(lambda model, x: np.bool_(_leak_test()(model, x))).status == "correct"
    assert "True or False" in check_leak_test(lambda model, x: 1).message


@pytest.mark.parametrize(
    "answer, text",
    [
        (window_via_tril, "you called Tensor.tril"),
        (lambda T, w: torch.ones(T, T, dtype=torch.bool).triu(-w + 1) & ~torch.ones(T, T, dtype=torch.bool).triu(1), "triu"),
        (lambda T, w: __import__("attn_course").sliding_window_mask(T, w), "attn_course.sliding_window_mask"),
        # Right for the notebook's window of 3 only, and for a T fixed at 7.
        (lambda T, w: band(T, 3), "should be"),
        (lambda T, w: band(7, w), "expected shape"),
    ],
)
def test_sliding_window_forbidden_routes_and_fixed_sizes(answer, text):
    feedback = check_sliding_window_mask(answer)
    assert feedback.status == "incorrect" and text in feedback.message, str(feedback)


# --- the answers the second review found accepted or wrongly rejected (reviews/chapter-04.md) -------

def _masked_float32_inside(q, k, v, allowed, cast_weights=True, cast_output=True):
    scores = q.float() @ k.float().T / q.size(-1) ** 0.5
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    weights = weights.masked_fill(~allowed.any(-1, keepdim=True), 0.0)
    output = weights @ v.float()
    return (output.to(q.dtype) if cast_output else output), (weights.to(q.dtype) if cast_weights else weights)


def _masked_exp_shifted_by_allowed_max(q, k, v, allowed):  # exp(s - max over the allowed keys) * allowed
    scores = q @ k.T / q.size(-1) ** 0.5
    top = scores.masked_fill(~allowed, float("-inf")).amax(-1, keepdim=True).nan_to_num(0.0, neginf=0.0)
    e = torch.exp(scores - top) * allowed
    total = e.sum(-1, keepdim=True)
    weights = torch.where(total > 0, e / total, torch.zeros_like(e))
    return weights @ v, weights


def _masked_by(softmax):  # -inf fill, then the given softmax of the scores
    def masked(q, k, v, allowed):
        weights = softmax((q @ k.T / q.size(-1) ** 0.5).masked_fill(~allowed, float("-inf")))
        return weights @ v, weights
    return masked


def _masked_half_only_wrong_scale(q, k, v, allowed):  # right in float32, divides by sqrt(E + 1) in half precision
    if q.dtype in (torch.float16, torch.bfloat16):
        scores = q @ k.T / (q.size(-1) + 1) ** 0.5
        weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
        return weights @ v, weights
    return masked_attention(q, k, v, allowed)


def test_masked_attention_wholly_in_half_precision_passes():
    # Computed in float16/bfloat16 throughout (no float32 inside): within the tolerance of each.
    assert check_masked_attention(_masked_by(lambda s: torch.softmax(s, -1).nan_to_num(0.0))).status == "correct"


@pytest.mark.parametrize(
    "answer, text",
    [
        # Float32 results for float16/bfloat16 inputs (the review: accepted).
        (lambda q, k, v, m: _masked_float32_inside(q, k, v, m, cast_weights=False, cast_output=False),
         "your result is torch.float32 but the inputs were torch.float16"),
        (lambda q, k, v, m: _masked_float32_inside(q, k, v, m, cast_weights=False), "weights for float16 inputs"),
        (lambda q, k, v, m: _masked_float32_inside(q, k, v, m, cast_output=False), "output for float16 inputs"),
        # exp of the blocked score overflows: named as such, not as "softmax first" (the review: misattributed).
        (_masked_exp_shifted_by_allowed_max, "went into an exponential"),
        # (second review) torch's private softmax that zeros all-masked rows: the step the exercise teaches.
        (_masked_by(lambda s: torch._safe_softmax(s, -1)), "you called torch._safe_softmax: it is a private softmax"),
        (_masked_by(lambda s: torch._masked_softmax(s, torch.isinf(s), -1, 1).nan_to_num(0.0)),
         "you called torch._masked_softmax"),
        # (second review) A 6% error of scale in half precision only passed the old tolerance (3e-2) but for
        # one value: float16 is now compared to 1e-2 with float64 attention of the same inputs.
        (_masked_half_only_wrong_scale, "weights for float16 inputs"),
    ],
)
def test_masked_attention_review_wrong_answers(answer, text):
    feedback = check_masked_attention(answer)
    assert feedback.status == "incorrect" and text in feedback.message, str(feedback)


def test_masked_attention_renormalise_after_is_still_named():
    feedback = check_masked_attention(renormalise_after)
    assert feedback.status == "incorrect" and "softmax first and then zero and renormalise" in feedback.message, str(feedback)


def test_masked_attention_computed_in_float32_and_cast_back_passes():
    assert check_masked_attention(_masked_float32_inside).status == "correct"


def _masked_zeros_without_device(q, k, v, allowed):  # (third review: accepted on a CPU-only machine)
    s = q @ k.T / q.size(-1) ** 0.5
    w = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1)
    w = torch.where(allowed.any(-1, keepdim=True), w, torch.zeros(w.shape, dtype=w.dtype))
    return w @ v, w


def _masked_result_on_cpu(q, k, v, allowed):  # right values, always returned on the CPU
    return tuple(t.cpu() for t in masked_attention(q.cpu(), k.cpu(), v.cpu(), allowed.cpu()))


@pytest.mark.parametrize(
    "answer, text",
    [
        # (third review) BERT's finite fill, with the empty rows zeroed: accepted while no allowed score was below it.
        (lambda q, k, v, m: masked_attention(q, k, v, m, fill=-1e4), "A finite fill value (-1e4, -1e9 ...) is not below"),
        (lambda q, k, v, m: masked_attention(q, k, v, m, fill=-6e4), "A finite fill value (-1e4, -1e9 ...) is not below"),
        # (third review) zeros made without device=: named on the GPU, or on the meta device where there is none.
        (_masked_zeros_without_device, "a tensor made without device="),
    ],
)
def test_masked_attention_third_review_wrong_answers(answer, text):
    feedback = check_masked_attention(answer)
    assert feedback.status == "incorrect" and text in feedback.message, str(feedback)


def test_masked_attention_other_device_case():
    # The other device is the GPU where there is one, else the meta device: a result moved to the CPU is named.
    feedback = check_masked_attention(_masked_result_on_cpu)
    assert feedback.status == "incorrect" and "device" in feedback.message, str(feedback)


def test_masked_attention_other_device_case_on_the_cpu(monkeypatch):
    # With the other device made the CPU (as on a GPU machine, values compared), a right answer passes, and a
    # result on another device is named.
    import attn_course.exercises.ch04 as ch04
    monkeypatch.setattr(ch04, "other_device", lambda: torch.device("cpu"))
    assert check_masked_attention(masked_attention).status == "correct"
    assert check_masked_attention(masked_attention_where).status == "correct"
    on_meta = lambda q, k, v, m: tuple(t.to("meta") for t in masked_attention(q, k, v, m))
    feedback = check_masked_attention(on_meta)
    assert feedback.status == "incorrect" and "your result is on meta" in feedback.message, str(feedback)


def test_batch_mask_left_padding_is_named():
    left = lambda lengths, T: causal_by_hand(T) & (torch.arange(T)[None, :] >= T - torch.tensor(lengths)[:, None])[:, None, :]
    feedback = check_batch_mask(left)
    assert feedback.status == "incorrect" and "padded at the end" in feedback.message, str(feedback)


def _leak_test_by(same):
    """The right loop, with the comparison ``same(a, b)`` a student chose."""
    def leaks_future(model, x):
        base = model(x)
        for t in range(x.size(1) - 1):
            changed = x.clone()
            changed[:, t + 1:] = torch.randn_like(changed[:, t + 1:])
            if not same(model(changed)[:, : t + 1], base[:, : t + 1]):
                return True
        return False
    return leaks_future


# Every tolerance the review found accepted, and smaller ones: each misses the leak of one rounding step.
TOLERANCES = {
    "atol=1e-6": lambda a, b: torch.allclose(a, b, rtol=0, atol=1e-6),
    "atol=1e-7": lambda a, b: torch.allclose(a, b, rtol=0, atol=1e-7),
    "atol=1e-12": lambda a, b: torch.allclose(a, b, rtol=0, atol=1e-12),
    "rtol=1e-6": lambda a, b: torch.allclose(a, b, rtol=1e-6, atol=0),
    "rtol=1e-7": lambda a, b: torch.allclose(a, b, rtol=1e-7, atol=0),
    "rtol=1e-7, atol=1e-8": lambda a, b: torch.allclose(a, b, rtol=1e-7, atol=1e-8),
    "max < 1e-6": lambda a, b: bool((a - b).abs().max() < 1e-6),
    "max < 5e-7": lambda a, b: bool((a - b).abs().max() < 5e-7),
    "max < 1e-7": lambda a, b: bool((a - b).abs().max() < 1e-7),
    "max < 1e-9": lambda a, b: bool((a - b).abs().max() < 1e-9),
    "max < 1e-11": lambda a, b: bool((a - b).abs().max() < 1e-11),
    "assert_close": lambda a, b: torch.testing.assert_close(a, b) is None,
}


@pytest.mark.parametrize("name", list(TOLERANCES))
def test_leak_test_with_any_tolerance_is_rejected(name):
    same = TOLERANCES[name]

    def tolerant(a, b):
        try:
            return same(a, b)
        except AssertionError:
            return False

    feedback = check_leak_test(_leak_test_by(tolerant))
    assert feedback.status == "incorrect" and "compare exactly" in feedback.message, str(feedback)


def _jacobian_leak_test(model, x):
    # Right: d output_i / d x_j must be exactly zero for every j > i.
    x = x.detach().clone().requires_grad_()
    out = model(x)
    for i in range(x.size(1) - 1):
        for e in range(out.size(-1)):
            grad, = torch.autograd.grad(out[:, i, e].sum(), x, retain_graph=True)
            if bool((grad[:, i + 1:] != 0).any()):
                return True
    return False


def _prefix_leak_test(model, x):
    # Wrong: a shorter input is not computed bit for bit like the full one.
    full = model(x)
    return any(not torch.equal(model(x[:, : t + 1]), full[:, : t + 1]) for t in range(x.size(1) - 1))


def _gradient_of_sum_leak_test(model, x):
    # Wrong: the gradient of the summed earlier outputs; a leak whose gradient sums to zero over the features
    # (a centred copy of a later token) gives exactly 0 (the fourth review).
    for t in range(x.size(1) - 1):
        xx = x.detach().clone().requires_grad_()
        model(xx)[:, : t + 1].sum().backward()
        if bool((xx.grad[:, t + 1:] != 0).any()):
            return True
    return False


def _full_jacobian_leak_test(model, x):
    # Wrong: torch.autograd.functional.jacobian, then any nonzero block d output_i / d x_j, j > i (the fourth review).
    J = torch.autograd.functional.jacobian(model, x)  # (B, T, E, B, T, E)
    return any(bool(J[:, i, :, :, i + 1:, :].abs().sum() > 0) for i in range(x.size(1)))


def _jacrev_leak_test(model, x):
    J = torch.func.jacrev(model)(x)  # (B, T, E, B, T, E)
    return any(bool(J[:, i, :, :, i + 1:, :].abs().sum() > 0) for i in range(x.size(1)))


# Gradient routes (the fourth review): a gradient sees only differentiable dependence, and a gradient of a sum can
# cancel out. The check's models include a centred leak and a leak through a path without gradient.
@pytest.mark.parametrize(
    "answer, text",
    [
        (_gradient_of_sum_leak_test, "gradient sums to zero over the features"),
        (_jacobian_leak_test, "path without gradient"),
        (_full_jacobian_leak_test, "path without gradient"),
        (_jacrev_leak_test, "path without gradient"),
    ],
)
def test_leak_test_gradient_routes_are_named(answer, text):
    feedback = check_leak_test(answer)
    assert feedback.status == "incorrect" and text in feedback.message, str(feedback)
    assert "A gradient shows only differentiable dependence" in feedback.message, str(feedback)


def test_leak_test_gradients_next_to_a_perturbation_pass():
    # Reading gradients is not wrong in itself: a test that also changes the tokens and compares exactly passes.
    feedback = check_leak_test(lambda model, x: _jacobian_leak_test(model, x) or leaks_one_token_at_a_time(model, x))
    assert feedback.status == "correct", str(feedback)


def _prefix_leak_test_long(model, x):
    # Wrong for the same reason, with prefixes of 3 tokens or more only: on a CPU these happen to give the same
    # outputs bit for bit (the second review), so the rejection must not rest on a difference of rounding.
    full = model(x)
    return any(not torch.equal(model(x[:, : t + 1]), full[:, : t + 1]) for t in range(2, x.size(1) - 1))


@pytest.mark.parametrize("answer", [_prefix_leak_test, _prefix_leak_test_long])
def test_leak_test_on_a_shorter_input_is_named(answer):
    feedback = check_leak_test(answer)
    assert feedback.status == "incorrect" and "shorter input" in feedback.message, str(feedback)


def test_leak_test_other_right_answers_pass():
    def changed_by(transform):
        def leaks_future(model, x):
            base = model(x)
            for t in range(x.size(1) - 1):
                changed = x.clone()
                changed[:, t + 1:] = transform(changed[:, t + 1:])
                if not torch.equal(model(changed)[:, : t + 1], base[:, : t + 1]):
                    return True
            return False
        return leaks_future

    for transform in (lambda z: torch.zeros_like(z), lambda z: 1 - z, lambda z: torch.randn_like(z) + 0.1):
        assert check_leak_test(changed_by(transform)).status == "correct"

    # Wrong (fifth round): scaling the later tokens leaves a token's direction as it was, and negating them leaves
    # its length as it was, so a leak through either goes unseen (both are in LEAK_TEST_WRONG_ANSWERS too).
    for transform, words in ((lambda z: 2 * z, "multiply the later tokens"), (lambda z: 0.5 * z, "multiply the later tokens"),
                             (lambda z: -z, "keep each later token's length")):
        feedback = check_leak_test(changed_by(transform))
        assert feedback.status == "incorrect" and words in feedback.message, str(feedback)

    # Wrong (fourth round): adding the same number to every feature leaves a centred copy of a token (a token minus
    # its mean over the features, as a LayerNorm-like step makes) exactly as it was, so such a leak goes unseen.
    for shift in (0.1, 1.0, 0.06):
        feedback = check_leak_test(changed_by(lambda z: z + shift))
        assert feedback.status == "incorrect" and "same number to every feature" in feedback.message, str(feedback)


def test_leak_check_has_a_leak_below_every_tolerance():
    from attn_course.exercises.ch04 import _attention_models

    E, models = _attention_models()
    x = torch.randn(2, 7, E, generator=torch.Generator().manual_seed(0))
    later = x.clone()
    later[:, 3:] = torch.randn_like(later[:, 3:])
    tiny = [model for name, model, leaks, _ in models if leaks and "rounding step" in name]
    assert len(tiny) == 1
    a, b = tiny[0](x)[:, 0], tiny[0](later)[:, 0]
    assert not torch.equal(a, b)                                   # an exact comparison sees it
    assert torch.allclose(a, b, rtol=1e-7, atol=1e-12)             # every tolerance one would pick does not


def test_masked_attention_names_which_computation_let_the_huge_score_in():
    def renormalise_clamped(q, k, v, allowed):  # softmax first, the sum clamped at 1e-30: zeros, not NaN
        w = torch.softmax(q @ k.T / q.size(-1) ** 0.5, -1) * allowed
        w = w / w.sum(-1, keepdim=True).clamp_min(1e-30)
        return w @ v, w

    def exp_unshifted_nan(q, k, v, allowed):  # exp without any shift, times the mask: NaN
        e = torch.exp(q @ k.T / q.size(-1) ** 0.5) * allowed
        w = e / e.sum(-1, keepdim=True)
        return w @ v, w

    for answer, text in [(renormalise_after, "softmax first and then zero and renormalise"),
                         (renormalise_clamped, "softmax first and then zero and renormalise"),
                         (_masked_exp_shifted_by_allowed_max, "went into an exponential"),
                         (exp_unshifted_nan, "NaN")]:
        feedback = check_masked_attention(answer)
        assert feedback.status == "incorrect" and text in feedback.message, (answer, str(feedback))


@pytest.mark.parametrize("divisor, text", [(lambda q, k: math.sqrt(8), "the notebook's E"), (lambda q, k: math.sqrt(k.size(0)), "number of keys")])
def test_masked_attention_wrong_widths_are_named(divisor, text):
    def answer(q, k, v, allowed):
        scores = q @ k.T / divisor(q, k)
        w = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1).nan_to_num(0.0)
        return w @ v, w
    feedback = check_masked_attention(answer)
    assert feedback.status == "incorrect" and text in feedback.message, str(feedback)


def test_leak_test_with_tiny_changes_is_named():
    def tiny(model, x):
        base = model(x)
        for t in range(x.size(1) - 1):
            changed = x.clone()
            changed[:, t + 1:] += 1e-3
            if not torch.equal(model(changed)[:, : t + 1], base[:, : t + 1]):
                return True
        return False
    feedback = check_leak_test(tiny)
    assert feedback.status == "incorrect" and "changes to the tokens are tiny" in feedback.message, str(feedback)


def test_batch_mask_padded_to_the_longest_instead_of_T_is_named():
    feedback = check_batch_mask(lambda lengths, T: batch_mask(lengths, max(lengths)))
    assert feedback.status == "incorrect" and "the longest length" in feedback.message, str(feedback)
