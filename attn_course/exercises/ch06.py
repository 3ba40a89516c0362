"""Checks for the exercises of chapter 06, positional encoding and embeddings."""

from __future__ import annotations

import math

import torch

from ..positional import sinusoidal_positional_encoding
from . import Mismatch, attempted, call, exercise, expect, expect_close, expect_tensor

__all__ = ["check_sinusoidal_encoding", "check_encoding_dot_product", "check_recover_offset", "check_unshuffle"]


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
    return {
        "column index": by_column,
        "swapped": swapped,
        "halves": halves,
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
        for k in (0, 1, 3, -3, 10, 57):
            what = f"encoding_dot_product(k={k}, d_model={d_model})"
            got = attempted(call(encoding_dot_product, k, d_model))
            if isinstance(got, torch.Tensor):
                expect(got.numel() == 1, f"{what}: expected one number, got a tensor of shape {tuple(got.shape)}")
                got = got.item()
            expect(isinstance(got, (int, float)) and not isinstance(got, bool),
                   f"{what}: expected a number, got {type(got).__name__}")
            want = float(torch.cos(_frequencies(d_model) * k).sum())
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
        p, k, got = wrong[0]
        raise Mismatch(f"{len(wrong)} of {len(answers)} offsets are wrong; for example recover_offset(PE[{p}], "
                       f"PE[{p + k}]) should be {k}, got {got}.")
    return "the offset k can be read off the encodings alone, sign included: position is relative as well as absolute."


@exercise(
    "Exercise 4, undo a shuffle",
    hint="the inverse of a permutation is its argsort: y_shuffled[torch.argsort(perm)]",
)
def check_unshuffle(unshuffle) -> str:
    generator = torch.Generator().manual_seed(64)
    for T in (7, 2):
        outputs = torch.randn(T, 3, generator=generator)
        perm = torch.randperm(T, generator=generator)
        while T > 2 and (bool((perm == torch.arange(T)).any()) or bool((perm[perm] == torch.arange(T)).all())):
            perm = torch.randperm(T, generator=generator)  # no fixed point, and not its own inverse
        what = f"unshuffle(y_shuffled, perm) with T = {T}"
        got = call(unshuffle, outputs[perm].clone(), perm.clone())
        expect_tensor(got, what=what, shape=(T, 3))
        if T > 2 and _close(got, outputs[perm][perm].double()):
            raise Mismatch(f"{what}: you applied perm a second time; you need its inverse, which puts row i of "
                           "y_shuffled back at position perm[i].")
        expect_close(got, outputs, what=what)
    return "unshuffling the outputs of a shuffled sequence gives the original outputs: attention without positions ignores order."
