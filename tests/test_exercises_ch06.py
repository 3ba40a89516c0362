"""The exercise checks of chapter 06: a right answer passes, a wrong one says what is wrong, a crash
is reported without a traceback, and the untouched scaffold counts as not attempted."""

import math

import pytest
import torch

from attn_course.exercises.ch06 import (
    check_encoding_dot_product,
    check_recover_offset,
    check_sinusoidal_encoding,
    check_unshuffle,
)


def scaffold(*args):
    ...


def sinusoidal_encoding(max_len, d_model, layout="interleaved", column_exponent=False):
    position = torch.arange(max_len, dtype=torch.float32)[:, None]
    i = torch.arange(d_model if column_exponent else d_model // 2, dtype=torch.float32)
    angles = position / 10000 ** (2 * i / d_model)
    pe = torch.zeros(max_len, d_model)
    if column_exponent:
        pe[:, 0::2], pe[:, 1::2] = torch.sin(angles[:, 0::2]), torch.cos(angles[:, 1::2])
    elif layout == "interleaved":
        pe[:, 0::2], pe[:, 1::2] = torch.sin(angles), torch.cos(angles)
    elif layout == "swapped":
        pe[:, 0::2], pe[:, 1::2] = torch.cos(angles), torch.sin(angles)
    else:
        pe = torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)
    return pe


def encoding_dot_product(k, d_model):
    return sum(math.cos(k / 10000 ** (2 * i / d_model)) for i in range(d_model // 2))


def recover_offset(pe_a, pe_b):
    d_model = pe_a.numel()
    omega = 10000 ** (-(d_model - 2) / d_model)  # the slowest pair
    angle_a = torch.atan2(pe_a[-2], pe_a[-1])
    angle_b = torch.atan2(pe_b[-2], pe_b[-1])
    return round(float(angle_b - angle_a) / omega)


def unshuffle(y_shuffled, perm):
    return y_shuffled[torch.argsort(perm)]


RIGHT = [
    (check_sinusoidal_encoding, sinusoidal_encoding),
    (check_encoding_dot_product, encoding_dot_product),
    (check_recover_offset, recover_offset),
    (check_unshuffle, unshuffle),
]


@pytest.mark.parametrize("check, answer", RIGHT, ids=lambda f: f.__name__)
def test_right_answers_pass(check, answer):
    feedback = check(answer)
    assert feedback.status == "correct", str(feedback)
    assert bool(feedback)


def test_other_right_answers_pass():
    def brute_force_offset(pe_a, pe_b):  # try every k with the shift (rotation) matrix
        d = pe_a.numel()
        omega = 10000 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        best = min(range(-100, 101), key=lambda k: float(
            (torch.stack([pe_a[0::2] * torch.cos(omega * k) + pe_a[1::2] * torch.sin(omega * k),
                          pe_a[1::2] * torch.cos(omega * k) - pe_a[0::2] * torch.sin(omega * k)], -1).flatten() - pe_b).norm()))
        return torch.tensor(best)

    assert check_recover_offset(brute_force_offset)
    assert check_encoding_dot_product(lambda k, d: torch.cos(k * 10000 ** (-torch.arange(0, d, 2) / d)).sum())
    assert check_sinusoidal_encoding(lambda n, d: torch.stack(
        [torch.sin(torch.arange(n)[:, None] / 10000 ** (torch.arange(0, d, 2) / d)),
         torch.cos(torch.arange(n)[:, None] / 10000 ** (torch.arange(0, d, 2) / d))], dim=-1).flatten(1))


@pytest.mark.parametrize("check", [c for c, _ in RIGHT], ids=lambda f: f.__name__)
def test_untouched_scaffold_is_not_attempted(check):
    for answer in (scaffold, ...):
        feedback = check(answer)
        assert feedback.status == "not attempted" and not feedback
        assert "Not attempted yet" in str(feedback)


@pytest.mark.parametrize(
    "check, answer, error",
    [
        (check_sinusoidal_encoding, lambda n, d: torch.zeros(n, d)[:, ::2].view(n, d), "RuntimeError"),
        (check_encoding_dot_product, lambda k, d: math.cos(k) / 0, "ZeroDivisionError"),
        (check_recover_offset, lambda a, b: a @ torch.zeros(3), "RuntimeError"),
        (check_unshuffle, lambda y, p: y[p + 100], "IndexError"),
    ],
)
def test_crashing_answers_are_reported_without_a_traceback(check, answer, error):
    feedback = check(answer)
    assert feedback.status == "error"
    assert error in feedback.message and "Traceback" not in str(feedback)
    assert "Hint:" in str(feedback)


@pytest.mark.parametrize(
    "check, answer, words",
    [
        (check_sinusoidal_encoding, lambda n, d: sinusoidal_encoding(n, d, column_exponent=True), "column index j"),
        (check_sinusoidal_encoding, lambda n, d: sinusoidal_encoding(n, d, layout="swapped"), "swapped"),
        (check_sinusoidal_encoding, lambda n, d: sinusoidal_encoding(n, d, layout="halves"), "first half"),
        (check_sinusoidal_encoding, lambda n, d: sinusoidal_encoding(n, d)[:, :-1], "expected shape (50, 16)"),
        (check_sinusoidal_encoding, lambda n, d: sinusoidal_encoding(n, d) * 2, "values differ"),
        (check_sinusoidal_encoding, lambda n, d: torch.zeros(n, d, dtype=torch.long), "floating-point"),
        (check_encoding_dot_product, lambda k, d: float(d), "d_model/2 = 8 pairs"),
        (check_encoding_dot_product, lambda k, d: encoding_dot_product(k, d) + 0.5, "expected 8.0000"),
        (check_encoding_dot_product, lambda k, d: torch.ones(2), "one number"),
        (check_encoding_dot_product, lambda k, d: "close", "expected a number, got str"),
        (check_recover_offset, lambda a, b: -recover_offset(a, b), "wrong sign"),
        (check_recover_offset, lambda a, b: abs(recover_offset(a, b)), "not its direction"),
        (check_recover_offset, lambda a, b: recover_offset(a, b) + 1, "8 of 8 offsets are wrong"),
        (check_recover_offset, lambda a, b: float("nan"), "finite"),
        (check_unshuffle, lambda y, p: y[p], "applied perm a second time"),
        (check_unshuffle, lambda y, p: y, "values differ"),
        (check_unshuffle, lambda y, p: y.T, "expected shape (7, 3)"),
    ],
)
def test_wrong_answers_say_what_is_wrong(check, answer, words):
    feedback = check(answer)
    assert feedback.status == "incorrect", str(feedback)
    assert words in feedback.message, feedback.message
    assert "Hint:" in str(feedback)
