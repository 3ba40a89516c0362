"""Checks for the exercises of chapter 06, positional encoding and embeddings.

Each check names the usual mistakes (the column index in the exponent, sine and cosine swapped, the
[sin | cos] layout, the dot product not normalised, a bisection that misses the first crossing of a
curve that is not monotone, an angle difference that is not wrapped, the inverse rotation) and uses the
shared mechanism of ``attn_course.exercises``: the package forbidden where the exercise says so
(``forbid=("attn_course",)``), inputs watched for changes in place, numpy integers accepted. Exercise
3 tries positions around 23,559 and 70,676, where the slowest pair of a 64-wide encoding passes π and 3π, and
around 47,119, where it completes a turn (an angle read in [0, 2π) jumps there), and the widths 32 and 128 near
their own such points; it wants an integer, as exercise 2 does. The table
of wrong answers is in tests/test_exercises_ch06.py.
"""

from __future__ import annotations

import math

import torch

from ..positional import sinusoidal_positional_encoding
from . import Mismatch, call, exercise, expect, expect_close, expect_int, expect_number, expect_tensor

__all__ = [
    "check_sinusoidal_encoding",
    "check_first_offset_below",
    "check_recover_offset",
    "check_halves_shift_matrix",
]


def _close(got, want) -> bool:
    return (
        isinstance(got, torch.Tensor)
        and tuple(got.shape) == tuple(want.shape)
        and torch.allclose(got.detach().double().cpu(), want, atol=1e-5, rtol=1e-4)
    )


def _variants(max_len: int, d_model: int) -> dict[str, torch.Tensor]:
    """Common wrong encodings, to say precisely what went wrong."""
    position = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    pair = torch.arange(d_model // 2, dtype=torch.float64)  # i = 0 .. d_model/2 - 1
    angles = position / 10000 ** (2 * pair / d_model)  # (max_len, d_model/2)
    column = torch.arange(d_model, dtype=torch.float64)  # j = 0 .. d_model - 1
    column_angles = position / 10000 ** (2 * column / d_model)  # the exponent with j in place of i
    by_column = torch.where(column % 2 == 0, torch.sin(column_angles), torch.cos(column_angles))
    swapped = torch.stack([torch.cos(angles), torch.sin(angles)], dim=-1).flatten(1)
    halves = torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)

    def interleave(angles):  # (max_len, d_model/2) angles -> the interleaved (sin, cos) table
        return torch.stack([torch.sin(angles), torch.cos(angles)], dim=-1).flatten(1)

    return {
        "column index": by_column,
        "swapped": swapped,
        "halves": halves,
        "from one": interleave((position + 1) / 10000 ** (2 * pair / d_model)),  # positions 1 .. max_len
        "no two": interleave(position / 10000 ** (pair / d_model)),  # exponent i / d_model
        "multiplied": interleave(position * 10000 ** (2 * pair / d_model)),  # pos * 10000^(2i/d)
    }


@exercise(
    "Exercise 1, the sinusoidal encoding by hand",
    hint="one angle per (position, pair): the position divided by 10000 to the power 2i / d_model, where i counts "
    "the pairs (there are d_model / 2 of them, not d_model); the sine of each angle goes in the even column of its "
    "pair, the cosine in the odd one",
    forbid=("attn_course",),
)
def check_sinusoidal_encoding(sinusoidal_encoding) -> str:
    for max_len, d_model in ((50, 16), (7, 10), (3, 2), (1, 64), (64, 128)):
        what = f"sinusoidal_encoding(max_len={max_len}, d_model={d_model})"
        got = call(sinusoidal_encoding, max_len, d_model)
        expect_tensor(got, what=what, shape=(max_len, d_model), dtype="float")
        if got.dtype not in (torch.float32, torch.float64):
            raise Mismatch(f"{what}: your table is {got.dtype}; compute and return it in float32 or float64. In half "
                           "precision the angles of later positions are rounded (float16 holds no integer above 2048 "
                           "exactly) and the table's values carry only about three significant digits.")
        right = sinusoidal_positional_encoding(max_len, d_model, dtype=torch.float64)
        wrong = {name: w for name, w in _variants(max_len, d_model).items() if not torch.allclose(w, right)}
        if "column index" in wrong and _close(got, wrong["column index"]):
            raise Mismatch(
                f"{what}: your exponent uses the column index j (0 .. d_model-1) where the formula has the pair "
                "index i = j // 2 (0 .. d_model/2 - 1). Half of your columns then have wavelengths far beyond "
                "10000 * 2π and are nearly constant."
            )
        if "swapped" in wrong and _close(got, wrong["swapped"]):
            raise Mismatch(f"{what}: sine and cosine are swapped: even columns hold the sine, odd columns the cosine.")
        if "from one" in wrong and _close(got, wrong["from one"]):
            raise Mismatch(f"{what}: your row 0 holds position 1 (off by one): positions run 0 .. max_len - 1, "
                           "so row 0 is sin 0 = 0 and cos 0 = 1.")
        if "no two" in wrong and _close(got, wrong["no two"]):
            raise Mismatch(f"{what}: your exponent is i / d_model; the formula has 2i / d_model, so the "
                           "wavelengths reach (almost) 10000 * 2π, not only 100 * 2π.")
        if "multiplied" in wrong and _close(got, wrong["multiplied"]):
            raise Mismatch(f"{what}: you multiplied the position by 10000^(2i/d_model); it is divided by it "
                           "(omega_i = 1 / 10000^(2i/d_model) shrinks with i: later pairs turn more slowly).")
        if "halves" in wrong and _close(got, wrong["halves"]):
            raise Mismatch(
                f"{what}: you put all sines in the first half and all cosines in the second. That layout is used "
                "too, but this exercise (and the paper's formula) interleaves them: column 2i sine, column 2i+1 cosine."
            )
        try:
            expect_close(got, right, what=what, device=None)  # no input to take a device from: any device will do
        except Mismatch:
            error = (got.detach().double().cpu() - right).abs()  # (max_len, d_model)
            if float(error[0].max()) < 1e-6 and float(error.max()) < 0.05:  # row 0 right, the later rows nearly
                raise Mismatch(f"{what}: row 0 is right and the other rows are close, but off by up to "
                               f"{float(error.max()):.1e}, more than rounding in float32 allows. Were the angles or "
                               "the frequencies computed in half precision (float16, bfloat16) before converting, "
                               "or a constant rounded (ln 10000, say)? Compute in float32 or float64 with exact "
                               "constants.") from None
            raise
    return "your encoding matches ac.sinusoidal_positional_encoding (interleaved sin/cos, i < d_model/2)."


def _frequencies(d_model: int) -> torch.Tensor:
    return 10000 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (d_model/2,)


def _similarity(k, d_model: int, base: float = 10000.0) -> torch.Tensor:
    """PE_p · PE_(p+k) / (PE_p · PE_p) = the mean over the pairs of cos(omega_i k), for one or many offsets k."""
    omega = float(base) ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (d_model/2,)
    k = torch.as_tensor(k, dtype=torch.float64)
    return torch.cos(k[..., None] * omega).mean(-1)


def _first_below(fraction: float, d_model: int, base: float, *, limit: int = 100_000, similarity=_similarity):
    """The smallest k in 1 .. limit with similarity(k) < fraction, or None."""
    ks = torch.arange(1, limit + 1)
    below = (similarity(ks, d_model, base) < fraction).nonzero()
    return int(below[0]) + 1 if len(below) else None


def _bisection(fraction: float, d_model: int, base: float, high: int) -> int:
    """What a bisection over 1 .. high finds, as if the similarity fell steadily."""
    low = 1
    while low < high:
        middle = (low + high) // 2
        if float(_similarity(middle, d_model, base)) < fraction:
            high = middle
        else:
            low = middle + 1
    return low


@exercise(
    "Exercise 2, where the similarity of two positions first drops",
    hint="divide the dot product of section 4 by its value at offset zero (a mean over the pairs instead of a "
    "sum), with the frequencies of the given base; the answer is the first offset, counting from one, whose "
    "similarity is below the fraction, however far along it lies",
    forbid=("attn_course",),
)
def check_first_offset_below(first_offset_below) -> str:
    cases = [(0.5, 128, 10000.0), (0.25, 128, 10000.0), (0.6, 16, 10000.0), (0.8, 16, 10000.0),
             (0.5, 64, 500000.0), (0.4, 32, 100.0), (0.1, 128, 10000.0), (0.95, 16, 10000.0),
             (0.05, 128, 10000.0), (0.05, 128, 500000.0), (0.05, 256, 500000.0), (0.05, 256, 2000000.0)]
    # answers 46, 198, 8, 2, 78, 9, 721, 1, 1109, 12267, 22094, 65994: the last two catch a search that stops
    # at a bound of its own (20,000 or 50,000, say) above the notebook's answers
    for fraction, d_model, base in cases:
        what = f"first_offset_below({fraction}, d_model={d_model}, base={base:g})"
        got = expect_int(call(first_offset_below, fraction, d_model, base), what=what)
        want = _first_below(fraction, d_model, base)
        if got == want:
            continue
        message = f"{what}: expected {want}, got {got}."
        at = lambda k: float(_similarity(k, d_model, base))  # noqa: E731
        if got < 1:
            raise Mismatch(message + " The offset k is a positive number of positions: start from k = 1")
        if want == 1:
            raise Mismatch(message + " Here the similarity is already below the fraction at k = 1 "
                           f"({at(1):.3f} < {fraction}): start the search at k = 1 itself (a loop that adds one "
                           "before its first test skips it)")
        sums = lambda ks, d, b: _similarity(ks, d, b) * (d // 2)  # noqa: E731  (the dot product, not normalised)
        wrong = {
            "You compared the dot product itself with the fraction: divide it by PE_p · PE_p = d_model / 2 (its "
            "value at k = 0) first, so that the similarity starts at 1":
                _first_below(fraction, d_model, base, similarity=sums, limit=20_000),
            "You divided by d_model; PE_p · PE_p is d_model / 2 (one sin² + cos² = 1 per pair), so the similarity "
            "at k = 0 must be 1":
                _first_below(fraction, d_model, base, similarity=lambda ks, d, b: _similarity(ks, d, b) / 2),
            "These are the frequencies of base 10000: use the base you are given":
                _first_below(fraction, d_model, 10000.0) if base != 10000.0 else None,
            "Your frequencies use the column index j (0 .. d_model - 1) in the exponent; the sum runs over the "
            "d_model / 2 pairs i, with omega_i = base^(-2i / d_model)":
                _first_below(fraction, 2 * d_model, base, similarity=lambda ks, d, b: _similarity(ks, d, b ** 2)),
        }
        for mistake, answer in wrong.items():
            if answer is not None and got == answer:
                raise Mismatch(f"{message} {mistake}.")
        if got == want + 1 and at(got) < fraction:
            raise Mismatch(f"{message} The similarity already was below {fraction} at k = {want} ({at(want):.3f}): "
                           "off by one, return the first k that is below (a loop that adds one after its test "
                           "returns one too many)")
        if got > want and at(got) < fraction <= at(got - 1):  # got is a later crossing of the true curve
            searched = any(got == _bisection(fraction, d_model, base, high) for high in (1000, 10_000, 100_000))
            raise Mismatch(f"{message} At k = {got} the similarity ({at(got):.3f}) is below {fraction}, but it already "
                           f"was at k = {want} ({at(want):.3f}): the curve is not monotone, it dips below and rises "
                           "back above, so " + ("a bisection lands on a later crossing; " if searched else "") +
                           f"try the offsets in order from k = 1 (if you did, your similarity at k = {want} is not the "
                           "formula's: check the frequencies and the precision, float32 or float64)")
        if got > want:
            raise Mismatch(f"{message} By the formula the similarity is {at(want):.3f} at k = {want}, already below "
                           f"{fraction}, yet your search went on: your similarity differs from the formula's there "
                           "(check the frequencies base^(-2i / d_model), the mean over the d_model / 2 pairs, and the "
                           "precision: float32 or float64)")
        if at(got) >= fraction:
            raise Mismatch(f"{message} At k = {got} the similarity is {at(got):.3f}, not below {fraction}"
                           + (" (off by one: return the first k that is below, not the last that is not)"
                              if got == want - 1 else
                              f" (it first drops below at k = {want}: does your search stop early, at a bound of "
                              "its own?)" if got < want else ""))
        raise Mismatch(message)
    return ("your offsets are where the similarity first drops below each fraction, for every width and base "
            "tried.")


def _encoding_rows(positions, d_model: int) -> torch.Tensor:
    """Rows of the sinusoidal encoding (float64) at the given positions, without building the whole table."""
    position = torch.tensor(positions, dtype=torch.float64)[:, None]  # (P, 1)
    angles = position * _frequencies(d_model)  # (P, d_model/2)
    return torch.stack([torch.sin(angles), torch.cos(angles)], dim=-1).flatten(1)  # (P, d_model), interleaved


@exercise(
    "Exercise 3, read the offset off two encodings",
    hint="the sine and cosine of one pair fix the angle its hand points at; the turn from the first encoding to the "
    "second, divided by that pair's frequency, is k. Pick a pair slow enough to turn by less than half a circle "
    "over 100 positions, and bring the turn into the range from -π to π before dividing",
)
def check_recover_offset(recover_offset) -> str:
    answers = []  # (d_model, p, k, got), every width
    for d_model in (64, 32, 128):
        slowest = float(_frequencies(d_model)[-1])  # for 64 its angle passes π at p = π / omega, about 23,559
        wraps = round(math.pi / slowest)  # (and 3π at 70,676); for 32 about 17,671, for 128 about 27,197
        if d_model == 64:  # small positions, then where the slowest pair's angle passes π, and beyond
            cases = [(0, 0), (7, 1), (7, -1), (300, 5), (40, -17), (1234, 42), (150, -99), (3, 98),
                     (23_540, 42), (23_580, -30), (47_100, 30), (47_130, -30), (50_000, 7), (70_650, 60)]
        else:  # and where it passes 2π (a full turn), at 2 * wraps: about 35,343 for 32, 54,410 for 128
            cases = [(5, 3), (90, -61), (2, 97), (wraps - 20, 45), (wraps + 15, -40),
                     (2 * wraps - 20, 45), (2 * wraps + 15, -40)]
        positions = sorted({q for p, k in cases for q in (p, p + k)})
        rows = _encoding_rows(positions, d_model)
        index = {q: i for i, q in enumerate(positions)}
        for p, k in cases:
            what = f"recover_offset(PE[{p}], PE[{p + k}]) with d_model={d_model}"
            raw = call(recover_offset, rows[index[p]].clone(), rows[index[p + k]].clone())
            got = expect_number(raw, what=what)
            expect(math.isfinite(got), f"{what}: expected a finite number, got {got}")
            expect(isinstance(got, int), f"{what}: return the integer k, got the float {got!r}: round your "
                   "estimate to the nearest integer (it is a whole number of positions)")
            answers.append((d_model, p, k, got))
    wrong = [(d, p, k, got) for d, p, k, got in answers if got != k]
    if wrong:
        if all(got == -k for _, _, k, got in answers):
            raise Mismatch("every offset has the wrong sign: k is defined by PE[p + k] = second argument, so "
                           "k > 0 when the second position comes later.")
        if all(got == abs(k) for _, _, k, got in answers):
            raise Mismatch("you found the distance |k| but not its direction (the dot product cannot tell them "
                           "apart). Use the angles of the pairs, which rotate one way for k > 0 and the other for k < 0.")
        fast = [math.remainder(k, 2 * math.pi) for _, _, k, _ in answers]  # what the fastest pair (omega = 1) reads
        if all(abs(got - f) < 0.51 for (_, _, _, got), f in zip(answers, fast)):
            raise Mismatch("your answers are right for small |k| but wrap around for larger ones: you read the "
                           "fastest pair (omega = 1), whose angle repeats every 2π ≈ 6.3 positions. Use a pair "
                           "that turns by less than π over 100 positions (a slow one, near the last columns).")
        widths = sorted({d for d, *_ in wrong})
        if 64 not in widths:
            d, p, k, got = wrong[0]
            raise Mismatch(f"your offsets are right for d_model = 64 but not for d_model = {d}: for example "
                           f"recover_offset(PE[{p}], PE[{p + k}]) should be {k}, got {got}. Take the width from the "
                           "vectors you are given (their length), not from a number of your own or the notebook's.")
        turns = {d: 2 * math.pi / float(_frequencies(d)[-1]) for d in widths}
        far = [(d, p, k, got) for d, p, k, got in wrong if abs(abs(got - k) - turns[d]) < 0.02 * turns[d]]
        if far == wrong:
            d, p, k, got = wrong[0]
            slowest = float(_frequencies(d)[-1])
            full = math.floor(p * slowest / (2 * math.pi)) != math.floor((p + k) * slowest / (2 * math.pi))
            where = ("2π (a full turn), where an angle read in [0, 2π) jumps from 2π back to 0" if full else
                     "π, where atan2 jumps from π to -π")
            raise Mismatch(f"recover_offset(PE[{p}], PE[{p + k}]) with d_model={d} should be {k}, got {got}: off by "
                           f"one whole turn of the slowest pair (2π / omega ≈ {turns[d]:,.0f} positions). Between "
                           f"these two positions that pair's angle passes {where}: an absolute angle jumps somewhere, "
                           "whatever its range, so do not read each position and subtract; bring the difference of "
                           "the two angles back into (-π, π] before dividing")
        d, p, k, got = wrong[0]
        raise Mismatch(f"{len(wrong)} of {len(answers)} offsets are wrong; for example recover_offset(PE[{p}], "
                       f"PE[{p + k}]) with d_model={d} should be {k}, got {got}.")
    return ("the offset k can be read off the encodings alone, sign included, at every width tried and even far "
            "along: position is relative as well as absolute.")


def _halves_table(max_len: int, d_model: int) -> torch.Tensor:
    """The sinusoidal encoding in the ``[sin | cos]`` layout: column i sine of pair i, column i + d/2 its cosine."""
    pe = sinusoidal_positional_encoding(max_len, d_model, dtype=torch.float64)  # interleaved
    return torch.cat([pe[:, 0::2], pe[:, 1::2]], dim=-1)  # (max_len, d_model)


def _halves_shift(k: int, d_model: int, frequencies: torch.Tensor | None = None) -> torch.Tensor:
    omega = _frequencies(d_model) if frequencies is None else frequencies  # (d_model/2,)
    cos, sin = torch.diag(torch.cos(omega * k)), torch.diag(torch.sin(omega * k))
    return torch.cat([torch.cat([cos, sin], dim=1), torch.cat([-sin, cos], dim=1)], dim=0)  # (d_model, d_model)


def _interleaved_shift(k: int, d_model: int) -> torch.Tensor:
    omega = _frequencies(d_model)
    M = torch.zeros(d_model, d_model, dtype=torch.float64)
    M[0::2, 0::2], M[0::2, 1::2] = torch.diag(torch.cos(omega * k)), torch.diag(torch.sin(omega * k))
    M[1::2, 0::2], M[1::2, 1::2] = torch.diag(-torch.sin(omega * k)), torch.diag(torch.cos(omega * k))
    return M


@exercise(
    "Exercise 4, the shift matrix of the [sin | cos] layout",
    hint="pair i now sits in column i (its sine) and column i + d_model/2 (its cosine): it turns by the same "
    "angle omega_i k as in section 4, so its 2 x 2 rotation keeps its four numbers and only moves to those rows "
    "and columns",
    forbid=("attn_course",),
)
def check_halves_shift_matrix(halves_shift_matrix) -> str:
    max_len, tol = 160, 2e-5  # float32 answers pass: their angles err by about 1e-6 at k = 40
    results = {}
    for d_model in (8, 64):
        table = _halves_table(max_len, d_model)  # (max_len, d_model)
        for k in (1, 5, -3, 40):
            what = f"halves_shift_matrix(k={k}, d_model={d_model})"
            got = call(halves_shift_matrix, k, d_model)
            expect_tensor(got, what=what, shape=(d_model, d_model))
            expect(got.is_floating_point(), f"{what}: expected floating-point numbers, got dtype {got.dtype}")
            expect(got.dtype not in (torch.float16, torch.bfloat16),
                   f"{what}: your matrix is {got.dtype}: its angles omega_i * k and their sines and cosines keep only "
                   "two or three significant digits, too few to shift an encoding exactly; compute in float32 or "
                   "float64")
            M = got.detach().to(device="cpu", dtype=torch.float64)
            results[(d_model, k)] = M
            first, last = max(0, -k), max_len - max(0, k)  # every p with p and p + k in the table
            shifted = table[first:last] @ M.T  # (P, d) @ (d, d): row p is M @ PE_half[p]
            target = table[first + k : last + k]  # (P, d): PE_half[p + k]
            # A rotation too (M Mᵀ = I): a matrix fitted to the table's positions can shift them all within tol
            # while the slow pairs, which barely move over 160 positions, are not rotated (whether it does depends on
            # the least-squares solver's rounding, which differs between PyTorch versions).
            rotation = torch.allclose(M @ M.T, torch.eye(d_model, dtype=torch.float64), atol=tol)
            if rotation and torch.allclose(shifted, target, atol=tol):
                continue
            if torch.allclose(M, torch.eye(d_model, dtype=torch.float64), atol=tol):
                raise Mismatch(f"{what}: your matrix is the identity, which leaves every encoding where it is; "
                               "it must turn pair i by the angle omega_i * k.")
            if k != 1 and torch.allclose(M, results[(d_model, 1)], atol=tol):
                raise Mismatch(f"{what}: your matrix is the same as for k = 1: the angle of pair i must be "
                               "omega_i * k, growing with k.")
            if d_model > 2 and torch.allclose(M, _interleaved_shift(k, d_model), atol=tol):
                raise Mismatch(f"{what}: this is the shift matrix of the interleaved layout of section 4. In the "
                               "[sin | cos] layout, pair i sits in columns i and i + d_model/2, not 2i and 2i + 1.")
            if torch.allclose(M, _halves_shift(-k, d_model), atol=tol):
                raise Mismatch(f"{what}: your matrix shifts by -k (it is the inverse, the transpose of the right "
                               "one): the new sine is cos(omega k)·sin + sin(omega k)·cos, with a plus sign.")
            slower = 10000 ** (-torch.arange(d_model // 2, dtype=torch.float64) / d_model)  # exponent i / d_model
            if torch.allclose(M, _halves_shift(k, d_model, slower), atol=tol):
                raise Mismatch(f"{what}: your frequencies use the exponent i / d_model; the encoding's are "
                               "omega_i = 1 / 10000^(2i / d_model), i = 0 .. d_model/2 - 1.")
            if torch.allclose(M, _halves_shift(k, d_model), atol=1e-2):
                raise Mismatch(f"{what}: your matrix is right to about two decimals only: were its angles or their "
                               "sines and cosines computed in half precision (float16, bfloat16)? Compute in float32 "
                               "or float64.")
            if not torch.allclose(M @ M.T, torch.eye(d_model, dtype=torch.float64), atol=tol):
                raise Mismatch(f"{what}: your matrix is not a rotation (M Mᵀ ≠ I), so it cannot map every encoding, "
                               "of norm sqrt(d_model/2), onto another of the same norm. If you built it from the angles, "
                               "check the signs of the sine blocks: one is +sin, the other -sin. If you fitted it to "
                               "encodings (least squares, a pseudo-inverse), a matrix that fits the table's positions "
                               "need not be the rotation (the slow pairs barely move there): build it from the angles "
                               "omega_i k instead.")
            bad = int(((shifted - target).abs() > tol).any(dim=-1).sum())
            raise Mismatch(f"{what}: M @ PE_half[p] differs from PE_half[p + k] at {bad} of {last - first} positions p.")
    return "your matrix shifts every encoding of the [sin | cos] layout by k positions, for every k and width tried."
