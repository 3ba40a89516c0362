"""The exercise checks of chapter 06: a right answer, written several ways, passes; each plausible wrong
answer is rejected with a message that names the mistake (the answers the review found accepted among
them: an exercise 3 that does not wrap the angle difference, or reads each absolute position and
subtracts, which break where the slowest pair wraps around, near position 23,559; the old exercise 2,
a copy of a displayed formula, is replaced); a crash is reported without a traceback; the untouched
scaffold counts as not attempted."""

import math

import numpy as np
import pytest
import torch

import attn_course as ac
import attn_course.exercises.ch06 as ch06
from attn_course.exercises.ch06 import (
    check_first_offset_below,
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


def similarity(k, d_model, base=10000.0, pairs=None, two=2, normaliser=None):
    pairs = d_model // 2 if pairs is None else pairs
    total = sum(math.cos(k / base ** (two * i / d_model)) for i in range(pairs))
    return total / (d_model / 2 if normaliser is None else normaliser)


def first_offset_below(fraction, d_model, base=10000.0, bound=None, pairs=None, two=2, normaliser=None):
    # try k = 1, 2, 3, ... in turn (1024 offsets at a time, for speed: the check's answers reach 65994);
    # with a bound, a search that stops there and returns the bound
    pairs = d_model // 2 if pairs is None else pairs
    omega = float(base) ** (-two * torch.arange(pairs, dtype=torch.float64) / d_model)
    for start in range(1, bound or 10**7, 1024):
        ks = torch.arange(start, start + 1024 if bound is None else min(start + 1024, bound), dtype=torch.float64)
        below = (torch.cos(ks[:, None] * omega).sum(-1) / (d_model / 2 if normaliser is None else normaliser)
                 < fraction).nonzero()
        if len(below):
            return start + int(below[0])
    return bound


def first_offset_vectorised(fraction, d_model, base=10000.0):  # another right answer: every k at once, torch
    omega = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    k = torch.arange(1, 100_001, dtype=torch.float64)
    similarity = torch.cos(k[:, None] * omega).mean(-1)
    return int(k[similarity < fraction][0])


def first_offset_numpy(fraction, d_model, base=10000.0):  # and another: numpy, a numpy integer returned
    omega = base ** (-np.arange(0, d_model, 2) / d_model)
    k = np.arange(1, 100_001)
    return k[np.cos(k[:, None] * omega).mean(-1) < fraction][0]


def first_offset_bisect(fraction, d_model, base=10000.0):  # assumes the similarity falls steadily
    low, high = 1, 10_000
    while low < high:
        middle = (low + high) // 2
        if similarity(middle, d_model, base) < fraction:
            high = middle
        else:
            low = middle + 1
    return low


def first_offset_package(fraction, d_model, base=10000.0):  # reads the package's table (base ignored, too)
    pe = ac.sinusoidal_positional_encoding(3000, d_model, dtype=torch.float64)
    similarity = (pe[0] @ pe.T) / (pe[0] @ pe[0])
    return int((similarity[1:] < fraction).nonzero()[0]) + 1


def recover_offset(pe_a, pe_b, pair=-1):
    d_model = pe_a.numel()
    i = d_model // 2 + pair if pair < 0 else pair  # the slowest pair by default; -2 the next slowest ...
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


def no_wrap_offset(pe_a, pe_b):  # the slowest pair, the difference of its angles not brought into (-π, π]
    d_model = pe_a.numel()
    omega = 10000 ** (-(d_model - 2) / d_model)
    turn = torch.atan2(pe_b[-2], pe_b[-1]) - torch.atan2(pe_a[-2], pe_a[-1])
    return round(turn.item() / omega)


def absolute_positions_offset(pe_a, pe_b):  # read each position off the slowest pair, then subtract
    d_model = pe_a.numel()
    omega = 10000 ** (-(d_model - 2) / d_model)
    return round(torch.atan2(pe_b[-2], pe_b[-1]).item() / omega) - round(torch.atan2(pe_a[-2], pe_a[-1]).item() / omega)


def unit_circle_positions_offset(pe_a, pe_b):  # each position read with its angle in [0, 2π), then subtracted
    d_model = pe_a.numel()
    omega = 10000 ** (-(d_model - 2) / d_model)
    angle = lambda pe: torch.remainder(torch.atan2(pe[-2], pe[-1]), 2 * math.pi).item()  # noqa: E731
    return round((angle(pe_b) - angle(pe_a)) / omega)


def hard_coded_width_offset(pe_a, pe_b):  # the slowest pair, but d_model = 64 whatever the vectors' length
    omega = 10000 ** (-(64 - 2) / 64)
    turn = math.remainder(float(torch.atan2(pe_b[-2], pe_b[-1]) - torch.atan2(pe_a[-2], pe_a[-1])), 2 * math.pi)
    return round(turn / omega)


def fitted_shift(k, d_model):  # least squares on 160 positions: fits d_model = 8, not the slow pairs of 64
    n = 160 + abs(k)
    table = sinusoidal_encoding(n + 200, d_model, layout="halves", dtype=torch.float64)
    A = table[max(0, -k):max(0, -k) + n - abs(k)]
    B = table[max(0, k):max(0, k) + n - abs(k)]
    return torch.linalg.lstsq(A, B).solution.T


def half_angles_shift(k, d_model):  # the angles and their sines and cosines in float16, the result cast back
    omega = 10000 ** (-torch.arange(0, d_model, 2, dtype=torch.float16) / d_model)
    cos, sin = torch.diag(torch.cos(omega * k)), torch.diag(torch.sin(omega * k))
    return torch.cat([torch.cat([cos, sin], 1), torch.cat([-sin, cos], 1)], 0).double()


RIGHT = [
    (check_sinusoidal_encoding, sinusoidal_encoding),
    (check_first_offset_below, first_offset_below),
    (check_first_offset_below, first_offset_vectorised),
    (check_first_offset_below, first_offset_numpy),
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
    assert check_recover_offset(lambda a, b: recover_offset(a, b, pair=-5))  # any slow-enough pair works
    assert check_recover_offset(lambda a, b: torch.tensor(recover_offset(a, b)))  # a one-element integer tensor
    assert check_sinusoidal_encoding(lambda n, d: sinusoidal_encoding(n, d, dtype=torch.float64))
    assert check_first_offset_below(lambda f, d, b=10000.0: next(  # a scan with no bound, float32 angles
        k for k in range(1, 10**6) if torch.cos(k * b ** (-torch.arange(0, d, 2).float() / d)).mean() < f))
    assert check_recover_offset(lambda a, b: np.int64(recover_offset(a, b)))  # a numpy integer is a number
    assert check_first_offset_below(lambda f, d, b: torch.tensor(first_offset_below(f, d, b)))  # one-element tensor
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
        (check_first_offset_below, lambda f, d, b: math.cos(f) / 0, "ZeroDivisionError"),
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
        (check_sinusoidal_encoding, lambda n, d: ac.sinusoidal_positional_encoding(n, d),
         "you called attn_course.sinusoidal_positional_encoding"),
        (check_recover_offset, lambda a, b: -recover_offset(a, b), "wrong sign"),
        (check_recover_offset, lambda a, b: abs(recover_offset(a, b)), "not its direction"),
        (check_recover_offset, lambda a, b: recover_offset(a, b) + 1, "28 of 28 offsets are wrong"),
        (check_recover_offset, lambda a, b: float("nan"), "finite"),
        # exercise 1: off by one, the exponent, the direction of the division
        (check_sinusoidal_encoding, lambda n, d: sinusoidal_encoding(n, d, first=1), "off by one"),
        (check_sinusoidal_encoding, lambda n, d: sinusoidal_encoding(n, d, two=1), "i / d_model"),
        (check_sinusoidal_encoding, lambda n, d: sinusoidal_encoding(n, d, multiply=True, dtype=torch.float64), "multiplied"),
        (check_sinusoidal_encoding, lambda n, d: sinusoidal_encoding(n, d).double() + 1e-3, "values differ"),
        # exercise 2: a bisection (the curve is not monotone), the package's table, the dot product not
        # normalised or normalised by d_model, the base ignored, the column index, off by one, not an integer
        (check_first_offset_below, first_offset_bisect, "a bisection lands on a later crossing"),
        (check_first_offset_below, first_offset_package, "you called attn_course.sinusoidal_positional_encoding"),
        (check_first_offset_below, lambda f, d, b: first_offset_below(f, d, b, normaliser=1.0),
         "compared the dot product itself"),
        (check_first_offset_below, lambda f, d, b: first_offset_below(f, d, b, normaliser=d), "divided by d_model"),
        (check_first_offset_below, lambda f, d, b: first_offset_below(f, d), "use the base you are given"),
        (check_first_offset_below, lambda f, d, b: first_offset_below(f, d, b, pairs=d, normaliser=d),
         "column index j"),
        (check_first_offset_below, lambda f, d, b: first_offset_below(f, d, b) - 1, "off by one"),
        (check_first_offset_below, lambda f, d, b: first_offset_below(f, d, b) + 1, "already was below 0.5 at k = 46"),
        (check_first_offset_below, lambda f, d, b: float(first_offset_below(f, d, b)), "return an integer, got float"),
        (check_first_offset_below, lambda f, d, b: 0, "positive number of positions"),
        # exercise 3: the fast pair wraps around; the slow pair without wrapping the difference, or each
        # absolute position read and subtracted (the review: accepted, as every position was below 23,559)
        (check_recover_offset, no_wrap_offset, "off by one whole turn of the slowest pair"),
        (check_recover_offset, absolute_positions_offset, "off by one whole turn of the slowest pair"),
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
        # the second review's accepted answers. Exercise 1: half precision; the check module's own helper
        (check_sinusoidal_encoding, lambda n, d: sinusoidal_encoding(n, d, dtype=torch.float64).half(),
         "float32 or float64"),
        (check_sinusoidal_encoding, lambda n, d: sinusoidal_encoding(n, d, dtype=torch.float64).bfloat16(),
         "float32 or float64"),
        (check_sinusoidal_encoding, lambda n, d: sinusoidal_encoding(n, d, dtype=torch.float16), "float32 or float64"),
        (check_sinusoidal_encoding, lambda n, d: ch06._encoding_rows(list(range(n)), d), "check's own code"),
        # the third review: the angles in half precision, the table cast back to float32; ln 10000 rounded
        (check_sinusoidal_encoding, lambda n, d: sinusoidal_encoding(n, d, dtype=torch.float16).float(),
         "half precision"),
        (check_sinusoidal_encoding, lambda n, d: torch.stack([f(torch.arange(n)[:, None] * torch.exp(
            -torch.arange(0, d, 2) / d * 9.21)) for f in (torch.sin, torch.cos)], dim=-1).flatten(1),
         "a constant rounded"),
        # exercise 2: the search starts at k = 2 (a loop that adds one first), a bounded scan, the check's helper
        (check_first_offset_below, lambda f, d, b: next(k for k in range(2, 10**6) if similarity(k, d, b) < f),
         "start the search at k = 1"),
        (check_first_offset_below, lambda f, d, b: next((k for k in range(1, 1000) if similarity(k, d, b) < f), 999),
         "stop early"),
        (check_first_offset_below, lambda f, d, b: ch06._first_below(f, d, b), "check's own code"),
        # the third review: a scan with a bound of its own above the 1109 of base 10000 (base 500000 needs 12267);
        # frequencies 4i / d scanned in order (not a later crossing of the true curve: the similarity differs)
        (check_first_offset_below, lambda f, d, b: next((k for k in range(1, 2001) if similarity(k, d, b) < f), 2000),
         "stop early"),
        (check_first_offset_below, lambda f, d, b: first_offset_below(f, d, b, two=4), "your similarity differs"),
        # the third review: a bound of its own above 12267 (20000: accepted); the check's answers now reach 65994
        (check_first_offset_below, lambda f, d, b: first_offset_below(f, d, b, bound=20_000),
         "stop early"),
        (check_first_offset_below, lambda f, d, b: first_offset_below(f, d, b, bound=50_000),
         "stop early"),
        # exercise 3: each position read in [0, 2π) and subtracted, wrong where the slowest pair completes a turn
        (check_recover_offset, unit_circle_positions_offset, "passes 2π (a full turn)"),
        # exercise 3: the width hard-coded (the notebook's d_demo = 64), an unrounded float
        (check_recover_offset, hard_coded_width_offset, "right for d_model = 64 but not for d_model = 32"),
        (check_recover_offset, lambda a, b: recover_offset(a, b) + 1e-9, "return the integer k"),
        (check_recover_offset, lambda a, b: float(recover_offset(a, b)), "return the integer k"),
        # exercise 4: the package's rotary embedding (the rotate_half layout), the check's helper
        (check_halves_shift_matrix, lambda k, d: ac.apply_rotary_embedding(
            torch.eye(d, dtype=torch.float64), torch.full((d,), k), interleaved=False),
         "you called attn_course.apply_rotary_embedding"),
        (check_halves_shift_matrix, lambda k, d: ch06._halves_shift(k, d), "check's own code"),
        # exercise 4: half precision, returned as such or cast back to float64
        (check_halves_shift_matrix, lambda k, d: halves_shift_matrix(k, d).half(), "float16"),
        (check_halves_shift_matrix, half_angles_shift, "half precision"),
        # the third review: a matrix fitted by least squares to the table's positions (rejected, but blamed on signs)
        (check_halves_shift_matrix, fitted_shift, "If you fitted it to encodings"),
    ],
)
def test_wrong_answers_say_what_is_wrong(check, answer, words):
    feedback = check(answer)
    assert feedback.status == "incorrect", str(feedback)
    assert words in feedback.message, feedback.message
    assert "Hint:" in str(feedback)
