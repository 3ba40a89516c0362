"""The exercise checks of chapter 06: a right answer passes, a wrong one says what is wrong, a crash
is reported without a traceback, and the untouched scaffold counts as not attempted."""

import math

import pytest
import torch

from attn_course.exercises.ch06 import (
    check_encoding_dot_product,
    check_halves_shift_matrix,
    check_recover_offset,
    check_sinusoidal_encoding,
)


def scaffold(*args):
    ...


def sinusoidal_encoding(max_len, d_model, layout="interleaved", column_exponent=False, first=0, two=2,
                        multiply=False, dtype=torch.float32):
    position = torch.arange(first, first + max_len, dtype=dtype)[:, None]
    i = torch.arange(d_model if column_exponent else d_model // 2, dtype=dtype)
    angles = position * 10000 ** (two * i / d_model) if multiply else position / 10000 ** (two * i / d_model)
    pe = torch.zeros(max_len, d_model, dtype=dtype)
    if column_exponent:
        pe[:, 0::2], pe[:, 1::2] = torch.sin(angles[:, 0::2]), torch.cos(angles[:, 1::2])
    elif layout == "interleaved":
        pe[:, 0::2], pe[:, 1::2] = torch.sin(angles), torch.cos(angles)
    elif layout == "swapped":
        pe[:, 0::2], pe[:, 1::2] = torch.cos(angles), torch.sin(angles)
    else:
        pe = torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)
    return pe


def encoding_dot_product(k, d_model, pairs=None, two=2, trig=math.cos):
    pairs = d_model // 2 if pairs is None else pairs
    return sum(trig(k / 10000 ** (two * i / d_model)) for i in range(pairs))


def recover_offset(pe_a, pe_b, pair=-1):
    d_model = pe_a.numel()
    i = d_model // 2 - 1 if pair == -1 else pair  # the slowest pair by default
    omega = 10000 ** (-2 * i / d_model)
    angle_a = torch.atan2(pe_a[2 * i], pe_a[2 * i + 1])
    angle_b = torch.atan2(pe_b[2 * i], pe_b[2 * i + 1])
    turn = math.remainder(float(angle_b - angle_a), 2 * math.pi)  # in [-π, π]
    return round(turn / omega)


def halves_shift_matrix(k, d_model, sign=1, two=2, layout="halves", dtype=torch.float64):
    half = d_model // 2
    omega = 10000 ** (-two * torch.arange(half, dtype=torch.float64) / d_model)
    cos, sin = torch.cos(omega * k), sign * torch.sin(omega * k)
    M = torch.zeros(d_model, d_model, dtype=torch.float64)
    if layout == "halves":
        sine, cosine = torch.arange(half), torch.arange(half) + half  # the columns of pair i
    else:  # the interleaved layout of section 4
        sine, cosine = torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)
    M[sine, sine], M[sine, cosine] = cos, sin  # new sine   = cos(wk) sin + sin(wk) cos
    M[cosine, sine], M[cosine, cosine] = -sin, cos  # new cosine = cos(wk) cos - sin(wk) sin
    return M.to(dtype)


RIGHT = [
    (check_sinusoidal_encoding, sinusoidal_encoding),
    (check_encoding_dot_product, encoding_dot_product),
    (check_recover_offset, recover_offset),
    (check_halves_shift_matrix, halves_shift_matrix),
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

    def permuted_shift(k, d):  # the interleaved M_k of section 4, with its rows and columns reordered
        order = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])  # halves column c = interleaved order[c]
        return halves_shift_matrix(k, d, layout="interleaved")[order][:, order]

    assert check_recover_offset(brute_force_offset)
    assert check_halves_shift_matrix(permuted_shift)
    assert check_halves_shift_matrix(lambda k, d: halves_shift_matrix(k, d, dtype=torch.float32))  # float32 passes
    assert check_recover_offset(lambda a, b: recover_offset(a, b, pair=20))  # any slow-enough pair works
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
        (check_halves_shift_matrix, lambda k, d: torch.eye(d)[:, : d // 2] @ torch.eye(3), "RuntimeError"),
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
        (check_encoding_dot_product, lambda k, d: float(d) if k == 0 else encoding_dot_product(k, d),
         "d_model/2 = 8 pairs"),
        (check_encoding_dot_product, lambda k, d: encoding_dot_product(k, d) + 0.5, "expected 5.5431"),
        (check_encoding_dot_product, lambda k, d: torch.ones(2), "one number"),
        (check_encoding_dot_product, lambda k, d: "close", "expected a number, got str"),
        (check_recover_offset, lambda a, b: -recover_offset(a, b), "wrong sign"),
        (check_recover_offset, lambda a, b: abs(recover_offset(a, b)), "not its direction"),
        (check_recover_offset, lambda a, b: recover_offset(a, b) + 1, "8 of 8 offsets are wrong"),
        (check_recover_offset, lambda a, b: float("nan"), "finite"),
        # exercise 1: off by one, the exponent, the direction of the division
        (check_sinusoidal_encoding, lambda n, d: sinusoidal_encoding(n, d, first=1), "off by one"),
        (check_sinusoidal_encoding, lambda n, d: sinusoidal_encoding(n, d, two=1), "i / d_model"),
        (check_sinusoidal_encoding, lambda n, d: sinusoidal_encoding(n, d, multiply=True, dtype=torch.float64), "multiplied"),
        (check_sinusoidal_encoding, lambda n, d: sinusoidal_encoding(n, d).double() + 1e-3, "values differ"),
        # exercise 2: columns instead of pairs, twice the pairs, sines, the exponent
        (check_encoding_dot_product, lambda k, d: sum(math.cos(k / 10000 ** (2 * j / d)) for j in range(d)),
         "all d_model columns"),
        (check_encoding_dot_product, lambda k, d: 2 * encoding_dot_product(k, d), "twice too much"),
        (check_encoding_dot_product, lambda k, d: encoding_dot_product(k, d, trig=math.sin), "summed sines"),
        (check_encoding_dot_product, lambda k, d: encoding_dot_product(k, d, two=1), "i / d_model"),
        (check_encoding_dot_product, lambda k, d: abs(encoding_dot_product(k, d)) + 1e-3, "expected"),
        # exercise 3: the fast pair wraps around
        (check_recover_offset, lambda a, b: recover_offset(a, b, pair=0), "wrap around"),
        (check_recover_offset, lambda a, b: recover_offset(a, b) // 2, "offsets are wrong"),
        # exercise 4: the other layout, the inverse, the exponent, not a rotation, no k, shape
        (check_halves_shift_matrix, lambda k, d: halves_shift_matrix(k, d, layout="interleaved"), "interleaved layout"),
        (check_halves_shift_matrix, lambda k, d: halves_shift_matrix(k, d, sign=-1), "shifts by -k"),
        (check_halves_shift_matrix, lambda k, d: halves_shift_matrix(k, d).T, "shifts by -k"),
        (check_halves_shift_matrix, lambda k, d: halves_shift_matrix(k, d, two=1), "i / d_model"),
        (check_halves_shift_matrix, lambda k, d: halves_shift_matrix(k, d).abs(), "not a rotation"),
        (check_halves_shift_matrix, lambda k, d: torch.eye(d, dtype=torch.float64), "identity"),
        (check_halves_shift_matrix, lambda k, d: halves_shift_matrix(1, d), "same as for k = 1"),
        (check_halves_shift_matrix, lambda k, d: halves_shift_matrix(k + 1, d), "differs from PE_half[p + k]"),
        (check_halves_shift_matrix, lambda k, d: halves_shift_matrix(k, d)[:-1], "expected shape (8, 8)"),
        (check_halves_shift_matrix, lambda k, d: torch.eye(d, dtype=torch.long), "floating-point"),
    ],
)
def test_wrong_answers_say_what_is_wrong(check, answer, words):
    feedback = check(answer)
    assert feedback.status == "incorrect", str(feedback)
    assert words in feedback.message, feedback.message
    assert "Hint:" in str(feedback)
