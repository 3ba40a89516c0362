"""Checks for the exercises of chapter 06, positional encoding and embeddings."""

from __future__ import annotations

import math

import torch

from ..positional import sinusoidal_positional_encoding
from . import Mismatch, attempted, call, exercise, expect, expect_close, expect_tensor

__all__ = [
    "check_sinusoidal_encoding",
    "check_encoding_dot_product",
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
    hint="angles = position[:, None] / 10000 ** (2 * i / d_model) with i = torch.arange(d_model // 2); "
    "then pe[:, 0::2] = sin(angles) and pe[:, 1::2] = cos(angles)",
)
def check_sinusoidal_encoding(sinusoidal_encoding) -> str:
    for max_len, d_model in ((50, 16), (7, 10), (3, 2)):
        what = f"sinusoidal_encoding(max_len={max_len}, d_model={d_model})"
        got = call(sinusoidal_encoding, max_len, d_model)
        expect_tensor(got, what=what, shape=(max_len, d_model))
        expect(got.is_floating_point(), f"{what}: expected floating-point numbers, got dtype {got.dtype}")
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
        expect_close(got, right, what=what)
    return "your encoding matches ac.sinusoidal_positional_encoding (interleaved sin/cos, i < d_model/2)."


def _frequencies(d_model: int) -> torch.Tensor:
    return 10000 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (d_model/2,)


@exercise(
    "Exercise 2, the dot product as a function of distance",
    hint="sin(a)sin(b) + cos(a)cos(b) = cos(a - b): each pair i contributes cos(omega_i * k), "
    "with omega_i = 1 / 10000 ** (2 * i / d_model), i = 0 .. d_model/2 - 1",
)
def check_encoding_dot_product(encoding_dot_product) -> str:
    for d_model in (16, 64):
        pe = sinusoidal_positional_encoding(200, d_model, dtype=torch.float64)
        for k in (3, 1, 0, -3, 10, 57):
            what = f"encoding_dot_product(k={k}, d_model={d_model})"
            got = attempted(call(encoding_dot_product, k, d_model))
            if isinstance(got, torch.Tensor):
                expect(got.numel() == 1, f"{what}: expected one number, got a tensor of shape {tuple(got.shape)}")
                got = got.item()
            expect(isinstance(got, (int, float)) and not isinstance(got, bool),
                   f"{what}: expected a number, got {type(got).__name__}")
            want = float(torch.cos(_frequencies(d_model) * k).sum())
            columns = torch.arange(d_model, dtype=torch.float64)  # j = 0 .. d_model - 1
            if k != 0 and math.isclose(got, float(torch.cos(k / 10000 ** (2 * columns / d_model)).sum()), abs_tol=1e-6):
                raise Mismatch(f"{what}: expected {want:.4f}, got {got:.4f}. You summed over all d_model columns j "
                               "with the column index in the exponent; the sum runs over the d_model/2 pairs i, "
                               "each pair (sin, cos) adding one cos(omega_i k).")
            if k != 0 and math.isclose(got, 2 * want, abs_tol=1e-6):
                raise Mismatch(f"{what}: expected {want:.4f}, got {got:.4f}, twice too much: each pair (sin, cos) "
                               "adds cos(omega_i k) once (sin·sin + cos·cos), not once per column.")
            if k != 0 and math.isclose(got, float(torch.sin(_frequencies(d_model) * k).sum()), abs_tol=1e-6):
                raise Mismatch(f"{what}: expected {want:.4f}, got {got:.4f}. You summed sines; "
                               "sin(a)sin(b) + cos(a)cos(b) = cos(a - b).")
            if k != 0 and math.isclose(
                got, float(torch.cos(k / 10000 ** (torch.arange(d_model // 2, dtype=torch.float64) / d_model)).sum()),
                abs_tol=1e-6,
            ):
                raise Mismatch(f"{what}: expected {want:.4f}, got {got:.4f}: your frequencies use the exponent "
                               "i / d_model; the encoding's are omega_i = 1 / 10000^(2i / d_model).")
            if k == 0 and abs(got - d_model) < 1e-6:
                raise Mismatch(f"{what}: expected {want:g}, got {got:g}. At distance 0 each (sin, cos) pair adds "
                               f"sin² + cos² = 1, and there are d_model/2 = {d_model // 2} pairs.")
            if not math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-6):
                measured = float(pe[100] @ pe[100 + k])
                raise Mismatch(f"{what}: expected {want:.4f} (= PE[100] · PE[100 + k], measured {measured:.4f}), "
                               f"got {got:.4f}.")
    return "PE[p] · PE[p + k] = Σᵢ cos(ωᵢ k): it depends on the distance k only, and on neither its sign nor p."


@exercise(
    "Exercise 3, read the offset off two encodings",
    hint="take the slowest pair (the last two columns): its angle is atan2(sin, cos); the difference of the two "
    "angles, divided by that pair's omega, is k. Or try every k in range(-100, 101) with the shift matrix",
)
def check_recover_offset(recover_offset) -> str:
    d_model = 64
    pe = sinusoidal_positional_encoding(1400, d_model, dtype=torch.float64)
    cases = [(0, 0), (7, 1), (7, -1), (300, 5), (40, -17), (1234, 42), (150, -99), (3, 98)]
    answers = []
    for p, k in cases:
        what = f"recover_offset(PE[{p}], PE[{p + k}]) with d_model={d_model}"
        got = attempted(call(recover_offset, pe[p].clone(), pe[p + k].clone()))
        if isinstance(got, torch.Tensor):
            expect(got.numel() == 1, f"{what}: expected one number, got a tensor of shape {tuple(got.shape)}")
            got = got.item()
        expect(isinstance(got, (int, float)) and not isinstance(got, bool),
               f"{what}: expected a number, got {type(got).__name__}")
        expect(math.isfinite(got), f"{what}: expected a finite number, got {got}")
        answers.append((p, k, got))
    wrong = [(p, k, got) for p, k, got in answers if round(got) != k or abs(got - k) > 1e-3]
    if wrong:
        if all(round(got) == -k for _, k, got in answers):
            raise Mismatch("every offset has the wrong sign: k is defined by PE[p + k] = second argument, so "
                           "k > 0 when the second position comes later.")
        if all(round(got) == abs(k) for _, k, got in answers):
            raise Mismatch("you found the distance |k| but not its direction (the dot product cannot tell them "
                           "apart). Use the angles of the pairs, which rotate one way for k > 0 and the other for k < 0.")
        fast = [math.remainder(k, 2 * math.pi) for _, k, _ in answers]  # what the fastest pair (omega = 1) reads
        if all(abs(got - f) < 0.51 for (_, _, got), f in zip(answers, fast)):
            raise Mismatch("your answers are right for small |k| but wrap around for larger ones: you read the "
                           "fastest pair (omega = 1), whose angle repeats every 2π ≈ 6.3 positions. Use a pair "
                           "that turns by less than π over 100 positions (a slow one, near the last columns).")
        p, k, got = wrong[0]
        raise Mismatch(f"{len(wrong)} of {len(answers)} offsets are wrong; for example recover_offset(PE[{p}], "
                       f"PE[{p + k}]) should be {k}, got {got}.")
    return "the offset k can be read off the encodings alone, sign included: position is relative as well as absolute."


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
    hint="pair i now sits in columns i (sine) and i + d_model/2 (cosine), so its 2 x 2 rotation by omega_i * k "
    "fills the entries (i, i), (i, i + d_model/2), (i + d_model/2, i) and (i + d_model/2, i + d_model/2); "
    "torch.diag of a (d_model/2,) vector builds one such block for all pairs at once",
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
            M = got.detach().to(device="cpu", dtype=torch.float64)
            results[(d_model, k)] = M
            first, last = max(0, -k), max_len - max(0, k)  # every p with p and p + k in the table
            shifted = table[first:last] @ M.T  # (P, d) @ (d, d): row p is M @ PE_half[p]
            target = table[first + k : last + k]  # (P, d): PE_half[p + k]
            if torch.allclose(shifted, target, atol=tol):
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
            if not torch.allclose(M @ M.T, torch.eye(d_model, dtype=torch.float64), atol=tol):
                raise Mismatch(f"{what}: your matrix is not a rotation (M Mᵀ ≠ I), so it cannot map one encoding, "
                               "of norm sqrt(d_model/2), onto another of the same norm. Check the signs of the "
                               "sine blocks: one is +sin, the other -sin.")
            bad = int(((shifted - target).abs() > tol).any(dim=-1).sum())
            raise Mismatch(f"{what}: M @ PE_half[p] differs from PE_half[p + k] at {bad} of {last - first} positions p.")
    return ("M_k works in the [sin | cos] layout too: the same 2 x 2 rotations, with pair i in columns i and "
            "i + d_model/2. It is the layout of the rotate_half code of GPT-NeoX and Llama (chapter 09).")
