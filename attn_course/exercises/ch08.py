"""Checks for the exercises of chapter 08, efficient attention.

Each check tries the answer on cases chosen so that the usual mistakes give a wrong result, and
names the mistake when it recognises one; the table of those mistakes is in
tests/test_exercises_ch08.py. They use the shared mechanism of ``attn_course.exercises``: library
softmaxes and attention forbidden where the exercise asks for the loop itself, inputs watched for
changes in place (the cache buffers of exercise 5 are ``mutable``), results' kind of dtype and
device, sizes unlike the notebook's, scores near 100 in float32 (``large_scores``) and near 1000 in
float64, where an online softmax without its max shift overflows, and one case of exercises 1, 2, 3 and 5 on
another device (``other_device``: the notebook's GPU, else the meta device). Exercise 2 also counts the
matrix products and the exponentials of the answer: a loop over k tiles takes at least k of the latter,
and an online one takes its first exponential before it combines the queries with a second tile's keys (it
runs once more with every key after the first tile NaN and watches for a result computed from the queries
that holds NaN before the first exponential, however the products are written: two passes, or every tile's
scores stored, are named). Exercises 1, 2, 3 and 5 have float64 cases whose scores all lie near -20000, at
-1e12 and at -1e300, below any finite mask fill or starting maximum tried (-100 to -1e30: the blocked keys
then take the weight in exercises 2 and 5, and every exponential underflows to 0 in 1 and 3), and ones in which each later key scores about 1e10 or 1e300 more than the one before,
where a mask that subtracts a fixed amount from the blocked scores lets them through; -inf and the dtype's
smallest number pass. Exercise 2 also has a case in which the first two queries see none of the second key tile, whose
scores lie far above the first tile's (a fill computed from the tile's own scores is named), and exercise 3 one pair
of states whose maxima lie 3000 apart in float64 and one 300 apart in float32 (a reference between the two maxima,
such as their midpoint, overflows and is named). Half-precision results of exercises 1 and 3 (a float16 or bfloat16 result, a sum equal to
the right one with a step rounded through float16 or bfloat16 in 1, an l or acc rounded through float16 or bfloat16
and back in 3) are named, and so is a maximum shared by all the rows of a tile in exercise 2 (NaN in the rows far
below it). In exercises 1 and 3, by the course's dtype policy, a float32 result of float64 inputs passes (with
float32's tolerance), and so do the same numbers converted back to float64; exercises 2 and 5 ask for the inputs'
dtype, so there a float32 output is named, and so is a float64 output that holds float32 numbers and misses the
float64 answer by float32's rounding. Exercise 5 also has a
float32 run whose scores lie near 100, where a softmax written without its max shift overflows. Where the
meta device cannot run an answer (it reads a value), exercises 1, 2, 3 and 5 run it on the CPU under the
shared device watch, which names a tensor made without device=; exercise 1 there runs both of its steps.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

from ..masks import causal_mask
from ._device import DeviceWatch
from . import (Mismatch, attempted, call, call_elsewhere, exercise, expect, expect_close, expect_int, expect_number,
               expect_on_device, expect_tensor, large_scores, mutable, other_device, randn, rng, tolerance)

__all__ = [
    "check_online_softmax_update",
    "check_causal_tile_attention",
    "check_merge_states",
    "check_kv_cache_bytes",
    "check_cache_attention_step",
]


def _pair(result, what: str):
    expect(isinstance(result, (tuple, list)) and len(result) == 2,
           f"{what}: return a pair (new_max, new_sum); got {type(result).__name__}")
    return tuple(result)


def _sixteen_bit_sums(running_max, running_sum, block, new_max) -> dict:
    """The right new_sum with some of its steps rounded through float16 or bfloat16, by the ways an answer can take
    them (an exponent, an exponential, the block's sum, the rescaled old sum, the result; or every step in 16 bits),
    named by the dtype: a 16-bit answer equals one of these up to float64's rounding, other mistakes do not."""
    import itertools

    sums = {}
    for dtype in (torch.float16, torch.bfloat16):
        name = str(dtype).replace("torch.", "")
        r = lambda x: x.to(dtype).double()  # noqa: E731 - rounded through the 16-bit dtype and back

        def exponential(x, how):  # exp(x): exact, its result rounded, of a rounded x, or computed in 16 bits
            return (torch.exp(x), r(torch.exp(x)), torch.exp(r(x)), r(torch.exp(r(x))))[how]

        shifted = (block - new_max[:, None], r(block) - new_max[:, None])  # the block as given, or rounded first
        for block_in, block_how, block_sum, correction_how, old_part, result in itertools.product(
                range(2), range(4), range(2), range(4), range(2), range(2)):
            terms = exponential(shifted[block_in], block_how).sum(dim=-1)
            old = running_sum * exponential(running_max - new_max, correction_how)
            total = (r(old) if old_part else old) + (r(terms) if block_sum else terms)
            sums.setdefault(name, []).append(r(total) if result else total)
        low_max = torch.maximum(running_max.to(dtype), block.to(dtype).amax(dim=-1))  # every step in 16 bits
        sums[name].append((running_sum.to(dtype) * torch.exp(running_max.to(dtype) - low_max)
                           + torch.exp(block.to(dtype) - low_max[:, None]).sum(dim=-1)).double())
    return sums


@exercise(
    "Exercise 1, one step of the online softmax",
    hint="the new maximum of each row is the larger of its running maximum and the block's own maximum (over the "
         "last axis); the old sum was counted relative to the old maximum, so rescale it by the exponential of "
         "(old maximum minus new maximum) before adding the block's exponentials, each taken relative to the new "
         "maximum: every exponent then stays at or below 0",
    forbid=("softmax",),
)
def check_online_softmax_update(update) -> str:
    generator = rng(8)
    scores = randn(3, 10, generator=generator, dtype=torch.float64, scale=3.0)
    scores[1, 6] = 12.0  # row 1's maximum arrives late, so the sum so far must be rescaled
    # One step on a known state first, for a precise message.
    running_max = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    running_sum = torch.tensor([1.5, 2.0, 1.0], dtype=torch.float64)
    block = scores[:, :4]
    new_max, new_sum = _pair(call(update, running_max, running_sum, block), "update(running_max, running_sum, block)")
    expected_max = torch.maximum(running_max, block.amax(dim=-1))
    if isinstance(new_max, torch.Tensor) and new_max.shape == (4,):
        raise Mismatch("new_max has shape (4,), one entry per column of the block: you took the maximum over dim 0 "
                       "(the rows); each row needs its own maximum, over the last axis")
    if isinstance(new_max, torch.Tensor) and new_max.numel() == 1:
        raise Mismatch("new_max is one number for all rows: each row (each query) keeps its own running maximum, "
                       "one per row")
    if (isinstance(new_max, torch.Tensor) and new_max.shape == (3,)
            and torch.allclose(new_max.double(), torch.maximum(running_max.max(), block.max()).expand(3))):
        raise Mismatch("new_max is the largest score of the whole block, repeated: the maximum is per row, "
                       "not global")
    for result, name in ((new_max, "new_max"), (new_sum, "new_sum")):
        _not_half(result, f"update(running_max, running_sum, block) with float64 inputs: {name}")
    expect_close(new_max, expected_max, what="new_max (the largest score seen so far, per row)")
    not_rescaled = running_sum + torch.exp(block - expected_max[:, None]).sum(dim=-1)
    expected_sum = running_sum * torch.exp(running_max - expected_max) + torch.exp(block - expected_max[:, None]).sum(dim=-1)
    got_sum = expect_tensor(new_sum, what="new_sum", shape=(3,), dtype="float").detach().double()
    if not torch.allclose(got_sum, expected_sum) and torch.allclose(got_sum, not_rescaled):
        raise Mismatch(
            "new_sum adds the new block correctly but keeps the old sum as it was: the old sum was "
            "computed relative to the old maximum, so multiply it by exp(running_max - new_max) first"
        )
    inverted = running_sum * torch.exp(expected_max - running_max) + torch.exp(block - expected_max[:, None]).sum(dim=-1)
    if not torch.allclose(got_sum, expected_sum) and torch.allclose(got_sum, inverted):
        raise Mismatch("new_sum rescales the old sum by exp(new_max - running_max), which is 1 or more: the rescaling "
                       "goes the other way, exp(running_max - new_max), at most 1")
    off = float(((got_sum - expected_sum).abs() / expected_sum.abs()).max())  # the largest relative error
    if 1e-5 < off <= 3e-2:  # float32's rounding is about 1e-7, float16's 5e-4, bfloat16's 4e-3
        # blamed on 16 bits only where the sum is the right one rounded through a 16-bit dtype (keeping the top
        # scores only, or clamping the exponents, is off by as much, and gets the plain comparison below)
        rounded = [name for name, values in _sixteen_bit_sums(running_max, running_sum, block, expected_max).items()
                   if any(float(((got_sum - value).abs() / expected_sum.abs()).max()) <= off / 10 for value in values)]
        if rounded:
            raise Mismatch(f"new_sum is off by a relative {off:.1e} with float64 inputs: that is the rounding of a "
                           f"16-bit dtype (it equals the right sum with a step rounded through {rounded[0]}; float16 "
                           "keeps about 3 significant digits, bfloat16 about 2), so a step of your sum went through "
                           "float16 or bfloat16 (.half(), .bfloat16(), or a tensor made in that dtype). Keep the inputs' "
                           "dtype: a running sum over many blocks needs at least float32")
    expect_close(new_sum, expected_sum, what="new_sum (sum of exp(score - new_max) over the scores seen so far)")
    # Then whole streams, starting from nothing seen (max -inf, sum 0): the notebook's rows, rows of other
    # widths in blocks of 1 and of 4, and float32 rows near +100 and -100, where exp(score) overflows.
    streams = [("3 rows of 10 scores in blocks of 3", scores, 3),
               ("1 row of 7 scores in blocks of 1", randn(1, 7, generator=generator, dtype=torch.float64), 1),
               ("5 rows of 9 scores in blocks of 4", randn(5, 9, generator=generator, dtype=torch.float64, scale=2.0), 4),
               ("4 rows of 8 float32 scores near +100 and -100, in blocks of 3", large_scores(4, 8, generator=generator), 3),
               ("4 rows of 8 float64 scores near +1000 and -1000, in blocks of 3", _near_1000(generator), 3),
               # the maximum jumps far up between blocks: an answer that exponentiates score - old maximum (> 0
               # then) and rescales afterwards overflows there, while every stream above leaves it finite
               ("2 rows of 6 float32 scores whose maximum jumps by about 100 between blocks, in blocks of 3",
                _jumping(torch.float32, 100.0), 3),
               ("2 rows of 6 float64 scores whose maximum jumps by about 1000 between blocks, in blocks of 3",
                _jumping(torch.float64, 1000.0), 3),
               # every score far below any finite starting or floored maximum a student tries (-1e4, -1e9, -1e30)
               ("3 rows of 6 float64 scores all near -20000, in blocks of 3",
                randn(3, 6, generator=generator, dtype=torch.float64) - 20000.0, 3),
               ("3 rows of 6 float64 scores all equal to -1e12, in blocks of 3",
                torch.full((3, 6), -1e12, dtype=torch.float64), 3),
               ("3 rows of 6 float64 scores all equal to -1e300, in blocks of 3",
                torch.full((3, 6), -1e300, dtype=torch.float64), 3)]
    for description, rows, size in streams:
        what = f"update(...) on a stream of {description}"
        R = rows.size(0)
        state = (torch.full((R,), float("-inf"), dtype=rows.dtype), torch.zeros(R, dtype=rows.dtype))
        for start in range(0, rows.size(1), size):
            state = _pair(call(update, state[0], state[1], rows[:, start:start + size]), what)
        final_max = expect_tensor(state[0], what=f"{what}: the final running maximum", shape=(R,), dtype="float")
        final_sum = expect_tensor(state[1], what=f"{what}: the final running sum", shape=(R,), dtype="float")
        if (not bool(torch.isfinite(final_sum).all()) or not bool((final_sum > 0).all())) and "jumps" in description:
            raise Mismatch(f"{what}: your sums became inf or NaN where a block raises the row's maximum by about "
                           f"{100 if rows.dtype == torch.float32 else 1000}. You exponentiated score - old maximum, which "
                           "is positive when a block raises the maximum: it overflows (above exp(88.7) in float32, "
                           "exp(709) in float64), and rescaling by exp(old maximum - new maximum) afterwards comes too "
                           "late. Exponentiate the block against the new maximum, so that every exponent is at most 0.")
        if "all equal to -1e300" in description and bool(torch.isneginf(final_max.detach()).all()):
            continue  # computed in float32 (passes, by the dtype policy): -1e300 is -inf there, out of its range
        if description.startswith("3 rows of 6 float64 scores all") and (
                not bool(torch.isfinite(final_sum).all()) or not bool((final_sum > 0).all())
                or not torch.allclose(final_max.detach().double(), rows.amax(dim=-1), rtol=1e-6, atol=0.0)):
            raise Mismatch(f"{what}: got the final running maximum {float(final_max[0]):g} and sum "
                           f"{float(final_sum[0]):g} for row 0, whose largest score is {float(rows[0].amax()):g}. A "
                           "running maximum (or the reference in the exponent) started or floored at a finite value, "
                           "such as -1e4, -1e9, -1e30 or .clamp(min=...), lies above scores this low, so every "
                           "exp(score - maximum) underflows to 0. Use -inf, not a large negative number: the state "
                           "starts at running_max = -inf, and exp(-inf - new_max) is already 0")
        if not bool(torch.isfinite(final_sum).all()) or not bool((final_sum > 0).all()):
            huge = rows.abs().amax() > 500  # the float64 stream near +-1000
            raise Mismatch(f"{what}: your sums became {'0, ' if bool((final_sum == 0).any()) else ''}inf or NaN. "
                           + ("With scores near 100, exp(score) overflows float32 (above exp(88.7)): never "
                              "exponentiate a score or a maximum alone, only differences to the new maximum, which are "
                              "at most 0" if rows.dtype == torch.float32 else
                              "With scores near 1000, exp(score) overflows even float64 (above exp(709)) and exp(-1000) "
                              "underflows to 0: computing in float64 does not replace the max shift. Never exponentiate "
                              "a score or a maximum alone, only differences to the new maximum, which are at most 0"
                              if huge else
                              "Starting from running_max = -inf and running_sum = 0, exp(-inf - new_max) must give 0"))
        expect_close(final_max, rows.amax(dim=-1), what=f"{what}: the final running maximum")
        expect_close(torch.log(final_sum.double()) + final_max.double(), torch.logsumexp(rows.double(), dim=-1),
                     what=f"{what}: max + log(sum) after all blocks (it must equal torch.logsumexp)",
                     atol=1e-4 if rows.dtype == torch.float32 else (1e-3 if final_sum.dtype == torch.float32 else None))
        # float32 (inputs or a float32 result of float64 ones, which passes): log of a sum of up to 8 terms near 1000
    # Another device: the notebook's GPU, or the meta device (a tensor made without device= is named), from the
    # starting state, so that an answer that treats running_max = -inf apart takes that branch there too.
    device = other_device()
    rows = randn(2, 6, generator=generator, dtype=torch.float32)
    shown = ("update(...) on a stream of 2 rows of 6 float32 scores in blocks of 3, from running_max = -inf and "
             f"running_sum = 0, with every tensor on the {device.type} device")
    shown_steps = (shown, shown.replace("from running_max = -inf and running_sum = 0", "the second block, from the "
                                        "state after the first (a finite running_max)"))
    state = (torch.full((2,), float("-inf"), device=device), torch.zeros(2, device=device))
    first_max = rows[:, :3].amax(dim=-1)  # the right state after the first block, for the CPU run of the second
    right_states = ((torch.full((2,), float("-inf")), torch.zeros(2)),
                    (first_max, torch.exp(rows[:, :3] - first_max[:, None]).sum(dim=-1)))
    judged = True
    for step, start in enumerate((0, 3)):
        # .cpu() ... .to(device) is right on a GPU; where the meta device cannot run the answer (it needs values),
        # each step runs on CPU copies under the shared device watch, which names a CPU tensor or result: the
        # first from the starting state, the second from a finite one, so that both branches of an answer that
        # treats running_max = -inf apart are watched.
        here = (*right_states[step], rows[:, start:start + 3])
        result = call_elsewhere(update, state[0], state[1], rows[:, start:start + 3].to(device), device=device,
                                what=shown_steps[step], copy_out_is_a_mistake=False, cpu_args=here)
        if result is None:  # the meta device cannot judge the values: the CPU streams above did
            judged = False
            state = tuple(x.to(device) for x in right_states[1])
            continue
        state = tuple(expect_on_device(x, device, f"{shown_steps[step]}: {name}", dtype="float")
                      for x, name in zip(_pair(result, shown_steps[step]), ("new_max", "new_sum")))
    if judged:
        for x, name in zip(state, ("the final running maximum", "the final running sum")):
            expect_tensor(x, what=f"{shown}: {name}", shape=(2,))
        if device.type != "meta":  # meta tensors have no values to compare
            expect_close(state[0], rows.amax(dim=-1).to(device), what=f"{shown}: the final running maximum")
            expect_close(torch.log(state[1].double()) + state[0].double(), torch.logsumexp(rows.double(), dim=-1).to(device),
                         what=f"{shown}: max + log(sum) after all blocks (it must equal torch.logsumexp)", atol=1e-4)
    return ("streaming the blocks through your update gives the exact softmax normaliser (torch.logsumexp), also for "
            "float32 scores near 100 and float64 scores near 1000.")


def _not_half(result, what: str) -> None:
    """Name a float16 or bfloat16 result: the running state of a softmax loses too much in 16 bits."""
    if isinstance(result, torch.Tensor) and result.dtype in (torch.float16, torch.bfloat16):
        raise Mismatch(f"{what} is {str(result.dtype).replace('torch.', '')}: a 16-bit dtype keeps about 3 significant "
                       "digits (bfloat16 about 2), too few for a running maximum, sum or accumulator. Keep the inputs' "
                       "dtype (float64 here; float32 passes too): do not convert with .half() or .bfloat16()")


def _only_float32_numbers(*tensors: torch.Tensor) -> bool:
    """Whether every finite nonzero number of these tensors is one that float32 holds exactly (and there is one): a
    float64 result computed in float32 and converted back (a float64 computation practically never gives that)."""
    numbers = torch.cat([x.detach().to(device="cpu", dtype=torch.float64).flatten() for x in tensors])
    numbers = numbers[torch.isfinite(numbers) & (numbers != 0)]
    return numbers.numel() > 0 and torch.equal(numbers.float().double(), numbers)


def _float32_in_float64(got: torch.Tensor, expected: torch.Tensor) -> bool:
    """A float64 result that misses the float64 answer only by float32's rounding, and holds float32 numbers only."""
    return (got.dtype == torch.float64 and expected.dtype == torch.float64
            and not torch.allclose(got, expected, *reversed(tolerance(torch.float64)))
            and torch.allclose(got, expected, *reversed(tolerance(torch.float32))) and _only_float32_numbers(got))


_FLOAT32_PRECISION = ("your output is float64 for float64 inputs, but every value of it is a float32 number, and it "
                      "differs from the float64 answer only by errors of float32's size (float32 keeps about 7 "
                      "significant digits, float64 about 16): it was computed in float32 (a .float(), or a tensor made "
                      "without dtype=, which is float32) and converted back. The statement asks for the inputs' dtype: "
                      "compute in float64 throughout")


def _near_1000(generator) -> torch.Tensor:
    """(4, 8) float64 scores: rows near +1000 and -1000, where exp(score) overflows or underflows float64."""
    rows = randn(4, 8, generator=generator, dtype=torch.float64, scale=3.0)
    rows[0::2] += 1000.0
    rows[1::2] -= 1000.0
    rows[2, 5] += 20.0  # a late maximum
    return rows


def _jumping(dtype: torch.dtype, jump: float) -> torch.Tensor:
    """(2, 6) scores whose first block of 3 lies near 0 and whose second lies about ``jump`` higher."""
    rows = torch.tensor([[-2.0, 0.0, 1.0, -3.0, -1.0, 0.0], [0.5, -1.0, 2.0, 1.0, -2.0, -0.5]], dtype=torch.float64)
    rows[:, 3:] += jump
    return rows.to(dtype)


def _causal_rows(query_tile, keys, values, first_query: int, block_size: int = 1, *, mask: str = "causal",
                 scale: bool = True, normalise: bool = True):
    """Causal attention of the queries at positions first_query, first_query + 1, ... (or a wrong variant)."""
    D = query_tile.size(-1)
    scores = query_tile.double() @ keys.double().T / (math.sqrt(D) if scale else 1.0)  # (Lb, S)
    query_position = first_query + torch.arange(query_tile.size(0))[:, None]  # (Lb, 1)
    key_position = torch.arange(keys.size(0))[None, :]  # (1, S)
    read = math.ceil((first_query + query_tile.size(0)) / block_size) * block_size  # keys in the tiles read
    blocked = {"causal": key_position > query_position, "none": torch.zeros_like(key_position > query_position),
               "tiles only": (key_position >= read).expand(query_tile.size(0), -1),
               "strict": key_position >= query_position,
               "from zero": key_position > query_position - first_query}[mask]
    scores = scores.masked_fill(blocked, float("-inf"))
    if not normalise:  # the accumulator before the last division: exp(s - m) summed against the values
        return torch.nan_to_num(torch.exp(scores - scores.amax(dim=-1, keepdim=True))) @ values.double()
    return torch.nan_to_num(torch.softmax(scores, dim=-1)) @ values.double()  # (Lb, Dv)


def _tile_loop(query_tile, keys, values, first_query: int, block_size: int, *, rescale_sum: bool = True,
               rescale_acc: bool = True):
    """Section 4's loop with the causal mask and skip, in float64, or one whose rescaling is wrong."""
    q, k, v = query_tile.double(), keys.double(), values.double()
    Lb, D = q.shape
    m = torch.full((Lb, 1), float("-inf"), dtype=torch.float64)
    l, acc = torch.zeros(Lb, 1, dtype=torch.float64), torch.zeros(Lb, v.size(1), dtype=torch.float64)
    positions = first_query + torch.arange(Lb)[:, None]  # (Lb, 1)
    for start in range(0, min(keys.size(0), first_query + Lb), block_size):
        scores = q @ k[start:start + block_size].T / math.sqrt(D)  # (Lb, Sb)
        scores = scores.masked_fill(start + torch.arange(scores.size(1))[None, :] > positions, float("-inf"))
        new = torch.maximum(m, scores.amax(dim=1, keepdim=True))
        p, correction = torch.exp(scores - new), torch.exp(m - new)
        l = (l * correction if rescale_sum else l) + p.sum(dim=1, keepdim=True)
        acc = (acc * correction if rescale_acc else acc) + p @ v[start:start + block_size]
        m = new
    return acc / l


_LOOP_MISTAKES = (
    ({"rescale_acc": False}, "you rescale the running sum l by exp(m - m_new) but not the accumulator acc: when a tile "
                             "raises the maximum, both were counted relative to the old maximum and both need the factor"),
    ({"rescale_sum": False}, "you rescale the accumulator acc by exp(m - m_new) but not the running sum l: when a tile "
                             "raises the maximum, both were counted relative to the old maximum and both need the factor"),
    ({"rescale_sum": False, "rescale_acc": False}, "neither l nor acc is rescaled when a tile raises the maximum (did you "
                                                   "update m before computing exp(m - m_new), which is then 1?): both "
                                                   "were counted relative to the old maximum"),
)


_TILE_MISTAKES = (
    ({"mask": "none"}, "every query sees every key: keys after a query's own position must be hidden (score -inf) "
                       "in the tiles that straddle it"),
    ({"mask": "tiles only"}, "every query sees every key of the tiles you read: keys after a query's own position must "
                             "be hidden (score -inf) in the tiles that straddle it"),
    ({"mask": "strict"}, "each query also hides its own key: query i at position first_query + i sees keys "
                         "0 .. first_query + i, itself included"),
    ({"mask": "from zero"}, "your mask counts the queries' positions from 0; the tile's queries sit at positions "
                            "first_query, first_query + 1, ..."),
    ({"scale": False}, "the scores are not divided by sqrt(D)"),
    ({"normalise": False}, "your output is not divided by the running sum at the end"),
)


_PRODUCTS = {"matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "einsum", "tensordot", "inner", "linear", "addmm",
             "baddbmm", "mv", "dot", "vdot", "chain_matmul", "vecdot", "multi_dot", "addbmm", "addmv", "bilinear"}


class _CountProducts(TorchFunctionMode):
    """Counts the matrix products that torch functions compute while it is in force (any route, by name)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "").rstrip("_") in _PRODUCTS or getattr(func, "__name__", "") in _PRODUCTS:
            self.count += 1
        return func(*args, **(kwargs or {}))


_EXPONENTIALS = {"exp", "exp2", "expm1", "logsumexp", "logaddexp", "logaddexp2", "sigmoid", "special_exp2",
                 "special_expm1", "special_logsumexp", "pow", "float_power"}


class _CountExponentials(TorchFunctionMode):
    """Counts the torch calls that exponentiate (exp and its relatives, any route, by name) while it is in force:
    a loop over k tiles exponentiates each tile's scores, so at least k of them."""

    def __init__(self, products: _CountProducts | None = None) -> None:
        super().__init__()
        self.count = 0
        self.products, self.products_before = products, None  # products counted before the first exponential

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name.rstrip("_") in _EXPONENTIALS or name.lstrip("_").rstrip("_") in ("pow", "rpow"):
            self.count += 1
            if self.products_before is None and self.products is not None:
                self.products_before = self.products.count
        return func(*args, **(kwargs or {}))


class _ScoresBeforeExp(TorchFunctionMode):
    """Records the first torch call, before the answer's first exponential, whose result is computed from the
    queries and holds NaN: with every key after the first tile set to NaN, that is a score (or a maximum) of a
    later tile, however the products are written (matmul, broadcast and sum, vecdot ...). An online loop
    exponentiates the first tile's scores before it computes any other tile's; a copy of the keys alone (a
    transpose, keys / sqrt(D)) does not come from the queries and is not counted."""

    def __init__(self, queries: torch.Tensor) -> None:
        super().__init__()
        self.from_queries = WeakIdKeyDictionary()
        self.from_queries[queries] = True
        self.exponentiated = False
        self.found: str | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name.rstrip("_") in _EXPONENTIALS or name.lstrip("_").rstrip("_") in ("pow", "rpow"):
            self.exponentiated = True
        out = func(*args, **kwargs)
        if self.exponentiated:
            return out
        leaves = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        if not any(x in self.from_queries for x in leaves):
            return out
        if name == "__iter__":  # iterating over a tensor: its rows come from it
            out = list(out)
            for row in out:
                self.from_queries[row] = True
            return iter(out)
        touched = [x for x in tree_leaves(out) if isinstance(x, torch.Tensor)]
        if name == "__setitem__" or name.endswith("_"):  # written in place: the target comes from the queries now
            touched += [x for x in leaves[:1]]
        for tensor in touched:
            self.from_queries[tensor] = True
            if (self.found is None and tensor.is_floating_point() and tensor.device.type != "meta"
                    and bool(torch.isnan(tensor.detach()).any())):
                self.found = name
        return out


def _unwritten_after(tensor: torch.Tensor, start: int) -> torch.Tensor:
    """A copy of ``tensor`` whose rows from ``start`` on are NaN, as memory that no one wrote would be."""
    poisoned = tensor.clone()
    poisoned[start:] = float("nan")
    return poisoned


@exercise(
    "Exercise 2, FlashAttention's inner loop with a causal mask",
    hint="keep a running maximum, a running sum and an unnormalised output per query, as in section 4; walk over "
         "the key tiles in order and stop at the first tile that starts after the last query's position; in the "
         "tiles you read, give keys later than a query's position the score minus infinity; divide by the running "
         "sum at the end",
    forbid=("sdpa", "softmax"),
)
def check_causal_tile_attention(causal_tile_attention) -> str:
    generator = rng(9)
    cases = [  # (description, Lb, S, D, Dv, first_query, block_size, dtype, key scale)
        ("the notebook's sizes", 4, 12, 8, 5, 4, 4, torch.float64, 1.0),
        ("a query tile that straddles two key tiles", 3, 11, 4, 3, 5, 4, torch.float64, 1.0),
        ("the first query alone (it sees only key 0)", 1, 9, 4, 2, 0, 3, torch.float64, 1.0),
        ("the last queries, a key tile shorter than the others", 5, 13, 6, 4, 8, 4, torch.float64, 1.0),
        ("tiles of one key", 2, 6, 4, 3, 2, 1, torch.float64, 1.0),
        ("one tile larger than the sequence", 3, 7, 4, 3, 4, 16, torch.float64, 1.0),
        ("float32 scores near 100", 4, 12, 8, 5, 6, 4, torch.float32, 12.0),
        ("one query late in the sequence, six tiles of 2 keys to read", 1, 14, 4, 3, 10, 2, torch.float64, 1.0),
        ("float32 scores near 0 in the first key tile and near 100 in the later ones", 2, 8, 4, 3, 4, 2, torch.float32, 1.0),
        ("float64 scores near 0 in the first key tile and near 1000 in the later ones", 2, 8, 4, 3, 4, 2, torch.float64, 1.0),
        # where a finite mask fill or a fixed penalty lets the blocked keys through (as in exercise 5)
        ("float64 scores all near -20000", 3, 12, 4, 3, 4, 4, torch.float64, 1.0),
        ("float64 scores all equal to -1e12", 3, 12, 4, 3, 4, 4, torch.float64, 1.0),
        ("float64 scores rising by 1e10 from each key to the next", 3, 12, 4, 3, 4, 4, torch.float64, 1.0),
        # steps beyond any fixed penalty short of float64's range (first: near -1e300, a penalty such as 1e30 is
        # lost in rounding), and scores far below any finite fill or starting maximum a student tries (-1e30 too):
        # -inf and torch.finfo(float64).min (-1.8e308) still pass
        ("float64 scores rising by 1e300 from each key to the next", 3, 12, 4, 3, 4, 4, torch.float64, 1.0),
        ("float64 scores all equal to -1e300", 3, 12, 4, 3, 4, 4, torch.float64, 1.0),
        # a finite fill computed from the tile's own scores (its minimum minus a margin) lies below the tile's scores
        # but not below the earlier tiles': queries 2 and 3 see none of keys 4..7, which score 0, far above the
        # -1e300 of the keys they see
        (_FALLING, 4, 8, 4, 3, 2, 4, torch.float64, 1.0),
    ]
    for description, Lb, S, D, Dv, first_query, block_size, dtype, key_scale in cases:
        query_tile = randn(Lb, D, generator=generator, dtype=dtype, scale=key_scale)
        keys = randn(S, D, generator=generator, dtype=dtype, scale=key_scale)
        jump = 100.0 if "near 100 in" in description else 1000.0 if "near 1000 in" in description else 0.0
        if jump:  # coordinate 0: 10 in every query, 0 in the first tile's keys, then jump * sqrt(D) / 10, so that
            query_tile[:, 0] = 10.0  # the maximum rises by about `jump` at the second tile
            keys[:block_size, 0] = 0.0
            keys[block_size:, 0] = jump * math.sqrt(D) / 10.0
        level = ("-20000" if "near -20000" in description else "-1e12" if "-1e12" in description
                 else "-1e300" if "-1e300" in description else None)
        rising = "1e300" if "rising by 1e300" in description else "1e10" if "rising" in description else None
        falling = description == _FALLING
        if falling:  # coordinate 0 only: -1000 in every query, 1e297 sqrt(D) in keys 0..3, 0 in keys 4..7: keys 0..3
            query_tile[:, 1:], query_tile[:, 0] = 0.0, -1000.0  # score exactly -1e300, keys 4..7 exactly 0
            keys[:, 0], keys[block_size:, 0] = 1e297 * math.sqrt(D), 0.0
        if level == "-20000":  # coordinate 0: -10 in every query, 2000 sqrt(D) in every key: every score near -20000
            query_tile[:, 0], keys[:, 0] = -10.0, 2000.0 * math.sqrt(D)
        if level == "-1e12":  # only coordinate 0 of the queries: every score exactly -1e12, whatever the order of sums
            query_tile[:, 1:], query_tile[:, 0], keys[:, 0] = 0.0, -1000.0, 1e9 * math.sqrt(D)
        if level == "-1e300":  # the same with 1e297 sqrt(D) in every key: every score exactly -1e300
            query_tile[:, 1:], query_tile[:, 0], keys[:, 0] = 0.0, -1000.0, 1e297 * math.sqrt(D)
        if rising:  # coordinate 0: 10 in every query, 1e9 t sqrt(D) (or 1e299 t sqrt(D)) in key t: key t scores
            step = 1e9 if rising == "1e10" else 1e299  # about 1e10 t (or 1e300 t)
            query_tile[:, 0], keys[:, 0] = 10.0, step * math.sqrt(D) * torch.arange(S, dtype=dtype)
        values = randn(S, Dv, generator=generator, dtype=dtype)
        what = (f"causal_tile_attention(query_tile of shape {(Lb, D)}, keys of shape {(S, D)}, values of shape {(S, Dv)}, "
                f"first_query={first_query}, block_size={block_size}) on {description}")
        result = call(causal_tile_attention, query_tile, keys, values, first_query, block_size)
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise Mismatch(f"{what}: return a pair (output, tiles_read); got {type(result).__name__}")
        output = expect_tensor(result[0], what=f"{what}: output", shape=(Lb, Dv), dtype="float", device=query_tile)
        if output.dtype != dtype:
            raise Mismatch(f"{what}: your output is {output.dtype} for {dtype} inputs; the statement asks for the inputs' "
                           "dtype: create m, l and acc with dtype=query_tile.dtype (torch.zeros and torch.full make "
                           "float32 unless told otherwise)")
        tiles_read = expect_int(result[1], what=f"{what}: tiles_read")
        expected = _causal_rows(query_tile, keys, values, first_query)
        got = output.detach().double()
        needed = min(math.ceil((first_query + Lb) / block_size), math.ceil(S / block_size))
        if (torch.isnan(got).any() or torch.isinf(got).any()) and dtype == torch.float64 and tiles_read < needed:
            raise Mismatch(f"{what}: your output holds NaN or inf, and tiles_read = {tiles_read} where the queries up to "
                           f"position {first_query + Lb - 1} need {needed}: your loop stops too early. A tile that starts "
                           "at or before the last query's position holds keys that query sees; stop only at a tile that "
                           "starts *after* it. A query none of whose visible keys was read keeps l = 0, and acc / l is "
                           "NaN.")
        if (torch.isnan(got).any() or torch.isinf(got).any()) and level:
            raise Mismatch(f"{what}: your output holds NaN or inf. Every real score here lies near {level}: did your "
                           "running maximum m start at a finite number above them (-1e4, -1e9, -1e30)? Then it never comes "
                           "down to the scores, every exp(score - m) underflows to 0 and l stays 0. Scores can be any "
                           "number: start m at float('-inf'), and fill the blocked scores with float('-inf').")
        if (torch.isnan(got).any() or torch.isinf(got).any()) and jump:
            raise Mismatch(f"{what}: your output holds NaN or inf. The second key tile raises the maximum by about "
                           f"{jump:.0f}: did you exponentiate the scores against the old running maximum (score - m, "
                           "positive when a tile raises the maximum) and rescale by exp(m - m_new) afterwards? That "
                           "overflows (above exp(88.7) in float32, exp(709) in float64) before the rescaling can help. "
                           "Compute m_new first and exponentiate the tile against it, so that every exponent is at most 0.")
        if (torch.isnan(got).any() or torch.isinf(got).any()) and _shared_maximum_breaks(
                got, query_tile, keys, values, first_query, block_size):
            raise Mismatch(f"{what}: your output holds NaN or inf in the rows whose scores lie far below the other "
                           "rows' (here, in float32, the rows' largest scores lie more than 100 apart), as it does when one running "
                           "maximum is shared by all the rows of the tile (s.amax(), or a maximum over dim 0): in a row "
                           "far below that shared maximum every exp(score - m) underflows to 0, l stays 0 and acc / l is "
                           "NaN. Each query keeps its own maximum: take the tile's maximum over the keys, "
                           "s.amax(dim=1, keepdim=True), one per row")
        if torch.isnan(got).any() or torch.isinf(got).any():
            raise Mismatch(f"{what}: your output holds NaN or inf"
                           + (": with scores near 100, exp(score) overflows float32; exponentiate only differences "
                              "to the running maximum" if dtype == torch.float32 else
                              ": a query that has seen only blocked keys so far has maximum -inf, and "
                              "exp(-inf - (-inf)) is NaN. Exponentiate a tile's scores against the running maximum "
                              "(finite once key 0 is read), not the tile's own maximum, which is -inf for a query that "
                              "sees none of the tile's keys; read the tiles in order, so that key 0, which every query "
                              "sees, comes first"))
        if not torch.allclose(got, expected, atol=1e-5, rtol=1e-4):
            if level and torch.allclose(got, _finite_fill_rows(query_tile, keys, values, first_query, needed * block_size),
                                        atol=1e-5, rtol=1e-4):
                raise Mismatch(f"{what}: {_FINITE_FILL.format(level=level)}")
            if rising:
                raise Mismatch(f"{what}: {_FIXED_PENALTY.format(step=rising)}")
            if falling and not torch.allclose(got[:2], expected[:2], atol=1e-5, rtol=1e-4) and torch.allclose(
                    got[2:], expected[2:], atol=1e-5, rtol=1e-4):
                raise Mismatch(f"{what}: {_TILE_FILL}")
            for options, message in _LOOP_MISTAKES:
                variant = _tile_loop(query_tile, keys, values, first_query, block_size, **options)
                if torch.allclose(got, variant, atol=1e-5, rtol=1e-4) and not torch.allclose(variant, expected, atol=1e-5):
                    raise Mismatch(f"{what}: {message}")
            for options, message in _TILE_MISTAKES:
                variant = _causal_rows(query_tile, keys, values, first_query, block_size, **options)
                if torch.allclose(got, variant, atol=1e-5, rtol=1e-4) and not torch.allclose(variant, expected, atol=1e-5):
                    raise Mismatch(f"{what}: {message}")
        if _float32_in_float64(output.detach(), expected):
            raise Mismatch(f"{what}: {_FLOAT32_PRECISION}")
        if (level == "-1e12" and torch.allclose(got, expected, atol=1e-4, rtol=1e-3)
                and not torch.allclose(got, expected, atol=1e-7, rtol=1e-7)):
            raise Mismatch(f"{what}: your output is off in the 5th or 6th digit. With every score at -1e12, float64 "
                           "holds a number that large only to about 1e-4, so a state that keeps the log of the sum "
                           "added to the maximum (a running logsumexp, logaddexp, or m + log(l) in place of l) loses "
                           "the sum in rounding. Keep m and l separately, as in section 4: l is a plain sum of "
                           "exp(score - m), rescaled by exp(m - m_new)")
        expect_close(output, expected.to(dtype), what=f"{what}: output (causal attention of the tile's queries)")
        if tiles_read == math.ceil(S / block_size) and needed < tiles_read:
            raise Mismatch(f"{what}: tiles_read = {tiles_read}, every key tile; the tiles that start after the last query "
                           f"(position {first_query + Lb - 1}) are all blocked: skip them, and read only {needed}")
        expect(tiles_read == needed, f"{what}: tiles_read = {tiles_read}; the queries up to position "
               f"{first_query + Lb - 1} need the key tiles that start at or before it: {needed}")
        # The same queries again, with every key and value of the tiles that must not be read set to NaN
        # (unwritten memory, as the future of a sequence still being generated is): an answer that touches
        # them, even with a weight of 0 (0 x NaN = NaN), returns NaN. Meanwhile, count its matrix products.
        unread = needed * block_size
        poisoned = (_unwritten_after(keys, unread), _unwritten_after(values, unread)) if unread < S else (keys, values)
        products = _CountProducts()
        with products, _CountExponentials(products) as exponentials:  # the inner mode sees each call first
            again = call(causal_tile_attention, query_tile, *poisoned, first_query, block_size)
        again = expect_tensor(again[0] if isinstance(again, (tuple, list)) else again,
                              what=f"{what}: output", shape=(Lb, Dv), dtype="float")
        if unread < S and torch.isnan(again.detach()).any():
            raise Mismatch(f"{what}: your answer read the keys or values from position {unread} on (here they were NaN, "
                           "as memory not yet written would be, and your output became NaN): the tiles that start "
                           "after the last query's position must not be read at all, not even multiplied by a weight "
                           "of 0. Stop the loop at the first of them.")
        if 0 < products.count < needed:
            raise Mismatch(f"{what}: your answer computed the scores of the {needed} key tiles it needs with "
                           f"{products.count} matrix product(s), so all at once rather than one tile after another. "
                           "The loop is the exercise: read one tile of keys at a time and fold it into m, l and acc.")
        if needed > 1 and (exponentials.products_before or 0) >= needed:
            raise Mismatch(f"{what}: your answer computed {exponentials.products_before} matrix products, the scores "
                           f"of all {needed} key tiles it needs, before its first exponential: it took the maximum "
                           "over every tile first (two passes over the keys, or every tile's scores stored), so it "
                           "holds or recomputes a whole row of scores, which is what FlashAttention avoids. Keep m, l "
                           "and acc per query as in section 4: compute one tile's scores, update the running maximum, "
                           "exponentiate that tile against it and fold it in before reading the next tile.")
        if exponentials.count < needed:
            raise Mismatch(f"{what}: your answer took exponentials {exponentials.count} time(s) for the {needed} key "
                           "tiles it needs, so it weighed their scores all at once (by broadcasting, or one query row "
                           "at a time over all its keys), not one tile after another. The loop is the exercise: read "
                           "one tile of keys at a time, exponentiate its scores against the running maximum and fold "
                           "them into m, l and acc.")
        if needed > 1:  # once more, every key after the first tile NaN: a score of a later tile before the first
            probe = _ScoresBeforeExp(query_tile)  # exponential becomes NaN, however the products are written
            try:
                with probe:
                    causal_tile_attention(query_tile, _unwritten_after(keys, block_size), values, first_query,
                                          block_size)
            except Exception:  # the output is not read: only the order of the answer's operations counts
                pass
            if probe.found is not None:
                raise Mismatch(f"{what}: your answer combined the queries with the keys of a later tile (from position "
                               f"{block_size} on) before its first exponential (in a run where those keys were NaN, "
                               f"a result of `{probe.found}` computed from the queries held NaN before any "
                               "exponential): it took the maximum over every tile first (two passes over the keys, "
                               "or every tile's scores stored), so it holds or recomputes a whole row of scores, "
                               "which is what FlashAttention avoids. Keep m, l and acc per query as in section 4: "
                               "compute the first tile's scores, update the running maximum, exponentiate that tile "
                               "against it and fold it in before reading the next tile.")
    # Another device: the notebook's GPU, or the meta device (m, l or acc made without device= is named).
    device = other_device()
    query_tile, keys, values = (randn(*shape, generator=generator, dtype=torch.float32) for shape in ((3, 4), (9, 4), (9, 2)))
    shown = (f"causal_tile_attention(query_tile, keys, values, first_query=4, block_size=3) with the inputs on the "
             f"{device.type} device")
    result = call_elsewhere(causal_tile_attention, *(x.to(device) for x in (query_tile, keys, values)), 4, 3,
                            device=device, what=shown)
    if result is None:  # the meta device cannot run it (it reads a value): on the CPU under the shared device watch
        _watched_on_cpu(causal_tile_attention, (query_tile, keys, values), (query_tile, keys, values, 4, 3), shown,
                        output=lambda r: r[0] if isinstance(r, (tuple, list)) and len(r) == 2 else r)
    if result is not None:
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise Mismatch(f"{shown}: return a pair (output, tiles_read); got {type(result).__name__}")
        output = expect_on_device(result[0], device, f"{shown}: output", dtype="float")
        expect_tensor(output, what=f"{shown}: output", shape=(3, 2))
        if device.type != "meta":
            expect_close(output, _causal_rows(query_tile, keys, values, 4).float().to(device), what=f"{shown}: output")
    return ("your loop gives causal attention exactly, reads only the key tiles a query can see, and stays finite on "
            "float32 scores near 100: FlashAttention's inner loop, with its causal tile skipping.")


_FINITE_FILL = ("the keys your mask blocks took the weight. Every real score here lies near {level}, far below your "
                "fill value: a finite fill such as -100, -1e4, -1e9 or -1e30 blocks a key only while the real "
                "scores lie far above it, and scores can be any number. Fill the blocked scores with float('-inf'), or "
                "torch.finfo(scores.dtype).min, which lie below every score")
_FALLING = ("float64 scores 1e300 lower in the first key tile than in the second (0), which the first two queries "
            "cannot see at all")  # no "-1e300" in it: that names another case
_TILE_FILL = ("the first two queries (positions 2 and 3) are wrong: keys 4..7, which they cannot see, took their weight. "
              "Their whole second tile is blocked, and its keys score 0, far above the -1e300 of the keys they see: a "
              "finite fill computed from the tile's own scores (its minimum minus a margin, or any value measured "
              "from this tile) lies below this tile's scores but not below the earlier tiles', so the blocked keys "
              "outrank the real ones. Scores can be any number: fill the blocked scores with float('-inf'), or "
              "torch.finfo(scores.dtype).min, which lie below every score")
_FIXED_PENALTY = ("keys after a query's position took the weight. Here each later key scores about {step} more than the "
                  "one before: a mask that lowers the blocked scores by a fixed amount (subtracting 100, 1e4, 1e9 or "
                  "1e30) leaves a blocked key above the visible ones whenever its score is that much higher, and scores "
                  "can be any number. Replace the blocked scores with float('-inf') (or torch.finfo(scores.dtype).min)")


def _shared_maximum_breaks(got, query_tile, keys, values, first_query: int, block_size: int) -> bool:
    """Whether section 4's loop with one running maximum for all the rows of the tile, in the answer's dtype, leaves
    NaN or inf in the same rows as the answer (it does where a row's scores lie far below the others')."""
    q, k, v = query_tile.detach(), keys.detach(), values.detach()
    Lb, D = q.shape
    m = torch.full((Lb, 1), float("-inf"), dtype=q.dtype)
    l, acc = torch.zeros(Lb, 1, dtype=q.dtype), torch.zeros(Lb, v.size(1), dtype=q.dtype)
    positions = first_query + torch.arange(Lb)[:, None]  # (Lb, 1)
    for start in range(0, min(k.size(0), first_query + Lb), block_size):
        scores = q @ k[start:start + block_size].T / math.sqrt(D)  # (Lb, Sb)
        scores = scores.masked_fill(start + torch.arange(scores.size(1))[None, :] > positions, float("-inf"))
        new = torch.maximum(m, scores.amax()).expand(Lb, 1)  # one maximum for every row: the mistake
        p, correction = torch.exp(scores - new), torch.nan_to_num(torch.exp(m - new), nan=0.0)
        l, acc, m = l * correction + p.sum(dim=1, keepdim=True), acc * correction + p @ v[start:start + block_size], new
    broken = ~torch.isfinite(acc / l).all(dim=1)  # (Lb,)
    return bool(broken.any()) and torch.equal(broken, ~torch.isfinite(got).all(dim=1))


def _finite_fill_rows(query_tile, keys, values, first_query: int, read: int) -> torch.Tensor:
    """The tile's output when the blocked keys of the tiles read get a finite score far above the real ones."""
    scores = query_tile.double() @ keys[:read].double().T / math.sqrt(query_tile.size(-1))  # (Lb, read)
    blocked = torch.arange(scores.size(1))[None, :] > first_query + torch.arange(query_tile.size(0))[:, None]
    return torch.softmax(scores.masked_fill(blocked, -100.0), dim=-1) @ values[:read].double()


def _watched_on_cpu(fn, on_device: tuple, args: tuple, what: str, output=lambda result: result) -> None:
    """Where the meta device cannot run an answer (it reads a value), run it on the CPU arguments ``args`` under
    the shared device watch, with ``on_device`` (tensors, buffers to be written in place included) standing for
    the device's: name a tensor made without device= that meets them, and an output (``output(result)``; a
    count such as tiles_read may be a CPU number) left off the device. ``args`` may hold :func:`mutable` markers."""
    with DeviceWatch(*on_device) as watch:
        result = call(fn, *args)
    if watch.mixed is not None:
        raise Mismatch(f"{what}: your code reads a tensor's value, so the meta device (which stands for a GPU here "
                       "and has no values) cannot run it. Run on the CPU instead, your code mixed a tensor made without "
                       "device= (torch.zeros, torch.full, torch.tensor, torch.arange ...), which lives on the CPU "
                       f"whatever the inputs, with tensors computed from the inputs in `{watch.mixed}`: on a GPU that "
                       "fails. Make new tensors on the inputs' device (device= from an input, or zeros_like, "
                       "new_zeros, full_like)")
    if watch.off_device(output(result)):
        raise Mismatch(f"{what}: your code reads a tensor's value, so the meta device (which stands for a GPU here "
                       "and has no values) cannot run it. Run on the CPU instead, your output is made without device= "
                       "(torch.zeros, torch.full, torch.tensor, torch.arange ..., or data brought to the host with "
                       ".tolist(), .numpy(), .item()): on a GPU it would be on the CPU, not on the inputs' device. Make "
                       "it on the inputs' device (device= from an input, or zeros_like, new_zeros, full_like), or move "
                       "it back with .to(input.device)")


def _state(scores: torch.Tensor, values: torch.Tensor):
    """(m, l, acc) of rows of scores (R, n) over values (n, Dv); a row of -inf gives (-inf, 0, 0)."""
    if scores.size(-1) == 0:  # no keys at all
        R = scores.size(0)
        return (torch.full((R,), float("-inf"), dtype=scores.dtype), torch.zeros(R, dtype=scores.dtype),
                torch.zeros(R, values.size(-1), dtype=scores.dtype))
    m = scores.amax(dim=-1)  # (R,)
    safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # 0 in place of an infinite maximum
    p = torch.exp(scores - safe[:, None])  # (R, n)
    return m, p.sum(dim=-1), p @ values  # (R,), (R,), (R, Dv)


def _triple(result, what: str):
    expect(isinstance(result, (tuple, list)) and len(result) == 3,
           f"{what}: return a triple (m, l, acc); got {type(result).__name__}")
    return tuple(result)


@exercise(
    "Exercise 3, merge two partial softmax states",
    hint="the merged maximum is the larger of the two maxima, query by query; each state's sum and accumulator were "
         "computed relative to its own maximum, so rescale each by the exponential of (its maximum minus the merged "
         "one) before adding them; where the merged maximum is minus infinity (nothing seen on either side), use 0 in "
         "its place in the exponent",
)
def check_merge_states(merge) -> str:
    generator = torch.Generator().manual_seed(12)
    R, S, Dv = 7, 12, 3
    scores = torch.randn(R, S, generator=generator, dtype=torch.float64) * 3  # (R, S): one row per query
    scores[1, 9] = 14.0  # row 1's largest score is in the second part
    scores[2] -= 1000.0  # row 2 lives far below the others: a maximum over all rows underflows it
    scores[3, :7] = float("-inf")  # row 3 sees nothing in the first part (masked), only in the second
    scores[4] = float("-inf")  # row 4 sees nothing at all
    scores[5, 7:] -= 1000.0  # rows 5 and 6: the parts' maxima lie about 1000 apart, beyond exp's range (709 in
    scores[6, :7] -= 1000.0  # float64), so exp(m_part - m) overflows unless m is the larger maximum
    values = torch.randn(S, Dv, generator=generator, dtype=torch.float64)  # (S, Dv)
    live = torch.ones(R, dtype=torch.bool)
    live[4] = False  # rows with at least one key
    exact = torch.softmax(scores[live], dim=-1) @ values  # (6, Dv): attention over all S keys
    lse = torch.logsumexp(scores[live], dim=-1)  # (6,): what m + log(l) must be
    for split in (7, 3, 0):
        a, b = _state(scores[:, :split], values[:split]), _state(scores[:, split:], values[split:])
        what = f"merge(state_a, state_b) with keys 0..{split - 1} in state_a and {split}..{S - 1} in state_b"
        m, l, acc = _merged(merge, a, b, what, R, Dv)
        output = acc[live] / l[live, None]  # (6, Dv)
        if bool(torch.isnan(output[2]).any() | (l[2] == 0)) and not bool(torch.isnan(output[:2]).any()):
            raise Mismatch(f"{what}: row 2, whose scores are all near -1000, lost its whole sum (l = 0 or NaN). "
                           "Did you take one maximum over all rows (global) instead of one per row? Each query "
                           "keeps its own m: the larger of m_a and m_b, query by query.")
        _expect_the_maximum(m, torch.maximum(a[0], b[0]), what)
        if split > 0:
            plain = (a[2] + b[2])[live] / (a[1] + b[1])[live, None]
            if torch.allclose(output, plain, atol=1e-6) and not torch.allclose(plain, exact, atol=1e-6):
                raise Mismatch(f"{what}: you added the two sums and accumulators as they are; each is relative to its "
                               "own maximum, so rescale each by exp(its maximum - the merged maximum) first.")
            mean = (a[2][:3] / a[1][:3, None] + b[2][:3] / b[1][:3, None]) / 2
            if torch.allclose(output[:3], mean, atol=1e-6):
                raise Mismatch(f"{what}: your output is the mean of the two partial outputs. Each part deserves a "
                               "weight proportional to its share of the softmax mass, l · exp(m), not one half.")
            scale_a = torch.exp(a[0] - torch.maximum(a[0], b[0]))[:3]
            scale_b = torch.exp(b[0] - torch.maximum(a[0], b[0]))[:3]
            only_l = (a[2][:3] + b[2][:3]) / (a[1][:3] * scale_a + b[1][:3] * scale_b)[:, None]
            if torch.allclose(output[:3], only_l, atol=1e-6) and not torch.allclose(only_l, exact[:3], atol=1e-6):
                raise Mismatch(f"{what}: you rescaled the sums l but not the accumulators acc; both must be multiplied "
                               "by exp(m_part - m).")
        _expect_exact(m, l, acc, live, exact, lse, what)
    # States whose scores all lie far below any finite starting or floored maximum a student tries (-1e3 to -1e30).
    for level, text in ((-20000.0, "all near -20000"), (-1e12, "all equal to -1e12"), (-1e300, "all equal to -1e300")):
        low = (torch.randn(3, 6, generator=generator, dtype=torch.float64) + level if level == -20000.0
               else torch.full((3, 6), level, dtype=torch.float64))  # (3, 6): 3 queries, 6 keys
        a, b = _state(low[:, :3], values[:3]), _state(low[:, 3:], values[3:6])
        what = f"merge(state_a, state_b) with float64 scores {text}, keys 0..2 in state_a and 3..5 in state_b"
        m, l, acc = _merged(merge, a, b, what, 3, Dv)
        single = getattr(acc, "_from_float32", False)  # a float32 result of float64 states passes (dtype policy)
        if level == -1e300 and (single or bool(torch.isneginf(m).all())):
            continue  # -1e300 is -inf in float32, out of its range (a float32 merge converted back to float64 too)
        expected = low.amax(dim=-1)
        if (not bool((torch.isfinite(l) & (l > 0)).all()) or not bool(torch.isfinite(acc).all())
                or not torch.allclose(m, expected, rtol=1e-6, atol=0.0)):
            raise Mismatch(f"{what}: got m = {float(m[0]):g} and l = {float(l[0]):g} for row 0, whose largest score is "
                           f"{float(expected[0]):g}. A maximum (or the reference in the exponent) started or floored at "
                           "a finite value, such as -1e4, -1e9, -1e30 or .clamp(min=...), lies above scores this low, "
                           "so both factors exp(m_part - reference) underflow to 0 and the output is 0/0. Use -inf, not "
                           "a large negative number: take the larger of the two maxima as it is, and put 0 in its place "
                           "only where it is -inf (a query that has seen no key)")
        if level != -20000.0:
            continue  # at -1e12 and -1e300 a right merge kept as log-sum-exp loses the log of the sum in rounding
        atol, rtol = tolerance(torch.float32, torch.float64) if single else (None, None)
        if single and not torch.allclose(acc / l[:, None], torch.softmax(low, dim=-1) @ values[:6], atol=atol, rtol=rtol):
            # a merge computed in float32 from float64 states passes too (dtype policy): float32 holds a maximum
            # near -20000 only to about 0.002, so its exact answer is the merge of the states rounded to float32
            # (up to a relative 1e-2 from the float64 one), to float32's tolerance
            a, b = (tuple(x.float().double() for x in state) for state in (a, b))
        reference = torch.maximum(a[0], b[0])
        scale_a, scale_b = torch.exp(a[0] - reference), torch.exp(b[0] - reference)
        exact_l = a[1] * scale_a + b[1] * scale_b
        exact_output = (a[2] * scale_a[:, None] + b[2] * scale_b[:, None]) / exact_l[:, None]
        expect_close(acc / l[:, None], exact_output, what=f"{what}: the output acc / l", atol=atol, rtol=rtol)
        expect_close(m + torch.log(l), reference + torch.log(exact_l), what=f"{what}: m + log(l)", atol=atol, rtol=rtol)
    # States whose maxima lie far apart in their own dtype: 3000 in float64, 300 in float32. A reference between
    # the two maxima (their midpoint) overflows here, exp(1500) or exp(150); only the larger maximum keeps every
    # exponent at most 0. Row 0: state_b far below, row 1: state_a far below, row 2: the two close together.
    for dtype, gap in ((torch.float64, 3000.0), (torch.float32, 300.0)):
        far = torch.randn(3, 6, generator=generator, dtype=torch.float64)  # (3, 6): 3 queries, 6 keys
        far[0, 3:] -= gap
        far[1, :3] -= gap
        far = far.to(dtype).double()  # the scores the dtype holds
        a = tuple(x.to(dtype) for x in _state(far[:, :3], values[:3]))
        b = tuple(x.to(dtype) for x in _state(far[:, 3:], values[3:6]))
        name = str(dtype).replace("torch.", "")
        what = (f"merge(state_a, state_b) with {name} states whose maxima lie about {gap:.0f} apart (rows 0 and 1), "
                "keys 0..2 in state_a and 3..5 in state_b")
        m, l, acc = _merged(merge, a, b, what, 3, Dv)
        if not (bool(torch.isfinite(l).all()) and bool(torch.isfinite(acc).all())):
            raise Mismatch(f"{what}: your l or acc holds NaN or inf in row(s) "
                           f"{(~(torch.isfinite(l) & torch.isfinite(acc).all(-1))).nonzero().flatten().tolist()}. "
                           f"There the two maxima lie about {gap:.0f} apart: exponentiating against a reference "
                           f"between them (their midpoint, their mean) needs exp of about {gap / 2:.0f}, beyond "
                           f"{name}'s range (exp(88.7) in float32, exp(709) in float64). Exponentiate only differences "
                           "at most 0: rescale each state by exp(its maximum - m), with m the larger of the two maxima")
        _expect_the_maximum(m, torch.maximum(a[0], b[0]).double(), what)
        single = dtype == torch.float32 or getattr(acc, "_from_float32", False)
        atol, rtol = tolerance(torch.float32, torch.float64) if single else (None, None)
        expect_close(acc / l[:, None], torch.softmax(far, dim=-1) @ values[:6].to(dtype).double(),
                     what=f"{what}: the output acc / l", atol=atol, rtol=rtol)
    # Flash-Decoding merges several parts: the merged state must merge again, in either order.
    first, middle, last = (_state(scores[:, start:end], values[start:end]) for start, end in ((0, 3), (3, 7), (7, S)))
    merged_ab = _merged(merge, first, middle, "merge(state_a, state_b) with keys 0..2 in state_a and 3..6 in state_b", R, Dv)
    merged_bc = _merged(merge, middle, last, f"merge(state_b, state_c) with keys 3..6 in state_b and 7..{S - 1} in state_c",
                        R, Dv)
    for what, x, y in ((f"merge(merge(state_a, state_b), state_c) with keys 0..2, 3..6 and 7..{S - 1}", merged_ab, last),
                       (f"merge(state_a, merge(state_b, state_c)) with keys 0..2, 3..6 and 7..{S - 1}", first, merged_bc)):
        m, l, acc = _merged(merge, x, y, what, R, Dv)
        _expect_the_maximum(m, scores.amax(dim=-1), what)
        _expect_exact(m, l, acc, live, exact, lse, what)
    # Another device: the notebook's GPU, or the meta device (a tensor made without device= is named). Row 4 saw
    # nothing on either side, so an answer that puts 0 in place of an infinite maximum has a row to do it for.
    device = other_device()
    a, b = _state(scores[:, :7], values[:7]), _state(scores[:, 7:], values[7:])
    shown = (f"merge(state_a, state_b) with keys 0..6 in state_a and 7..{S - 1} in state_b, every tensor on the "
             f"{device.type} device")
    result = call_elsewhere(merge, tuple(x.to(device) for x in a), tuple(x.to(device) for x in b), device=device,
                            what=shown, copy_out_is_a_mistake=False,  # .cpu() ... .to(device) is right on a GPU
                            cpu_args=(a, b))  # where meta cannot run it: on the CPU under the shared device watch
    if result is not None:
        got = tuple(expect_on_device(x, device, f"{shown}: {name}", dtype="float")
                    for x, name in zip(_triple(result, shown), ("m", "l", "acc")))
        for x, name, shape in zip(got, ("m", "l", "acc"), ((R,), (R,), (R, Dv))):
            expect_tensor(x, what=f"{shown}: {name}", shape=shape)
        if device.type != "meta":  # meta tensors have no values to compare
            m, l, acc = (x.detach().double().cpu() for x in got)
            acc._from_float32 = any(x.dtype == torch.float32 for x in got) or _only_float32_numbers(l, acc)
            _expect_exact(m, l, acc, live, exact, lse, shown)
    return ("two partial states merge exactly, and merge again: attention over a long cache can be split among workers "
            "and combined at the end (the idea of Flash-Decoding), and FlashAttention's loop is this merge, one block at a "
            "time.")


def _merged(merge, a, b, what: str, R: int, Dv: int):
    """The student's merge of states a and b, as float64 (m, l, acc) of the expected shapes."""
    got = _triple(call(merge, a, b), what)
    for x, name in zip(got, ("m", "l", "acc")):
        _not_half(x, f"{what} with float64 states: {name}")
    m, l, acc = (expect_tensor(x, what=f"{what}: {name}", shape=shape)
                 for x, name, shape in zip(got, ("m", "l", "acc"), ((R,), (R,), (R, Dv))))
    m, l, acc = (x.detach() for x in (m, l, acc))
    # float32 results of float64 states pass (the dtype policy), and so do the same numbers converted back to float64
    single = any(x.dtype == torch.float32 for x in (m, l, acc)) or _only_float32_numbers(l, acc)
    m, l, acc = (x.double() for x in (m, l, acc))
    acc._from_float32 = single  # read by _expect_exact: float32's tolerance
    return m, l, acc


def _expect_the_maximum(m: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """m must be the merged maximum: -inf for a query that saw nothing, the larger part's maximum otherwise."""
    empty = torch.isneginf(expected)
    if bool((empty & ~torch.isneginf(m)).any()):
        row = int((empty & ~torch.isneginf(m)).nonzero()[0])
        raise Mismatch(f"{what}: row {row} has seen no key in either state, so its merged m must stay -inf (nothing seen "
                       f"is the state (-inf, 0, 0)); got m = {float(m[row]):g}. With 0 or NaN there, merging this state "
                       "again goes wrong: a later part's scores near -1000 would be measured against 0, and exp "
                       "underflows them all.")
    far = ~empty & ~torch.isclose(m, expected, rtol=1e-4, atol=1e-5)  # float32's tolerance: a float32 m passes
    if bool(far.any()):
        row = int(far.nonzero()[0])
        raise Mismatch(f"{what}: m must be the larger of the two maxima, query by query; row {row} got m = "
                       f"{float(m[row]):g}, its maximum is {float(expected[row]):g}. Measured against anything smaller "
                       "than the maximum, exp(m_part - m) overflows when the parts' maxima lie far apart (rows 5 and 6 "
                       "here: about 1000 apart). A renormalised state such as (m + log l, 1, acc / l) has the same "
                       "output acc / l, but it is not the state asked for: its m is not the maximum.")


def _not_rounded_to_16_bits(x: torch.Tensor, what: str) -> None:
    """Name a float64 (or float32) result whose every nonzero number is one a 16-bit dtype holds exactly: it went
    through float16 or bfloat16 and back (random sums and accumulators practically never are)."""
    numbers = x[torch.isfinite(x) & (x != 0)]
    if numbers.numel() < 2:
        return
    for dtype in (torch.bfloat16, torch.float16):  # bfloat16 first: its numbers (in range) are float16's too
        if torch.equal(numbers.to(dtype).to(numbers.dtype), numbers):
            raise Mismatch(f"{what}: every number of it is one that {str(dtype).replace('torch.', '')} holds exactly, so "
                           "a step of your merge rounded it through a 16-bit dtype (.half(), .bfloat16(), or a tensor "
                           "made in that dtype) and converted it back. A 16-bit dtype keeps about 3 significant digits "
                           "(bfloat16 about 2), too few for a sum or an accumulator: keep the inputs' dtype (float64 "
                           "here; float32 passes too)")


def _expect_exact(m, l, acc, live, exact, lse, what: str) -> None:
    broken = ~(torch.isfinite(l) & torch.isfinite(acc).all(-1))  # (R,)
    if bool((broken & live).any()):
        raise Mismatch(f"{what}: your l or acc holds NaN or inf in row(s) {(broken & live).nonzero().flatten().tolist()}, "
                       "which have seen keys. Each part's factor exp(m_part - m) must be at most 1, with m the larger "
                       "of the two maxima: exp(m - m_part), or a reference below the maximum, overflows when the "
                       "parts' maxima lie far apart (rows 5 and 6: about 1000 apart).")
    if bool(broken.any()):
        raise Mismatch(f"{what}: your l or acc holds NaN or inf in row(s) {broken.nonzero().flatten().tolist()}. "
                       "Where both maxima are -inf (a query that has seen no key), exp(-inf - (-inf)) is NaN: use 0 "
                       "in place of an infinite maximum in the exponent, and keep l = 0, acc = 0 for such a row.")
    for x, name in ((l[live], "l"), (acc[live], "acc")):
        _not_rounded_to_16_bits(x, f"{what}: {name}")
    atol, rtol = tolerance(torch.float32, torch.float64) if getattr(acc, "_from_float32", False) else (None, None)
    expect_close(acc[live] / l[live, None], exact, what=f"{what}: the output acc / l of the rows that see a key",
                 atol=atol, rtol=rtol)
    expect_close(m[live] + torch.log(l[live]), lse, atol=atol, rtol=rtol,
                 what=f"{what}: m + log(l), which must be the log of the whole softmax denominator")
    expect(bool((l[4] == 0) and (acc[4] == 0).all()),
           f"{what}: row 4 has seen no key on either side; its merged state must keep l = 0 and acc = 0, got "
           f"l = {float(l[4]):g}")


@exercise(
    "Exercise 4, how big is a KV cache?",
    hint="two tensors (keys and values) per layer, each holding one number per sequence of the batch, per head, per "
         "token and per head dimension, each number bytes_per_number bytes. For the question: a GiB is 2 to the "
         "power 30 bytes; divide the 64 GiB by the bytes that one token of GPT-2 small's cache takes",
)
def check_kv_cache_bytes(kv_cache_bytes, gpt2_tokens_in_64_gib=None) -> str:
    import numpy

    cases = [  # (num_layers, num_heads, head_dim, seq_len, batch_size, bytes_per_number)
        (3, 4, 16, 100, 5, 4),  # every factor different, so that each mistake has its own number
        (12, 12, 64, 1024, 1, 2),  # GPT-2 small, float16
        (32, 32, 128, 4096, 8, 2),  # a 7B-parameter model with multi-head attention, float16
        tuple(numpy.int64(n) for n in (2, 8, 32, 10, 3, 1)),  # numpy integers, one byte per number
    ]
    for case in cases:
        num_layers, num_heads, head_dim, seq_len, batch_size, bytes_per_number = (int(n) for n in case)
        expected = 2 * num_layers * batch_size * num_heads * seq_len * head_dim * bytes_per_number
        what = (f"kv_cache_bytes(num_layers={num_layers}, num_heads={num_heads}, head_dim={head_dim}, seq_len={seq_len}, "
                f"batch_size={batch_size}, bytes_per_number={bytes_per_number})")
        got = expect_number(call(kv_cache_bytes, *case), what=what)
        if got != expected and got != expected / bytes_per_number:  # does the answer change with bytes_per_number?
            other_bytes = 8 if bytes_per_number != 8 else 1
            other = expect_number(call(kv_cache_bytes, *case[:5], other_bytes), what=what)
            if other == got:
                raise Mismatch(f"{what} = {got:,}, and the same with bytes_per_number={other_bytes}: your answer does "
                               "not use bytes_per_number (a fixed size per number?); multiply by it")
        if got == expected / 2:
            raise Mismatch(f"{what} = {got:,}, exactly half the answer: the cache stores keys *and* values")
        if num_layers > 1 and got == expected / num_layers:
            raise Mismatch(f"{what} = {got:,}: that is one layer; every layer keeps its own keys and values")
        if batch_size > 1 and got == expected / batch_size:
            raise Mismatch(f"{what} = {got:,}: that is one sequence; each of the batch_size sequences has its own cache")
        if bytes_per_number > 1 and got == expected / bytes_per_number:
            raise Mismatch(f"{what} = {got:,}: that counts numbers, not bytes; multiply by bytes_per_number")
        expect(got == expected, f"{what}: expected {expected:,} bytes, got {got:,}")
    answer = expect_number(attempted(gpt2_tokens_in_64_gib), what="gpt2_tokens_in_64_gib (a number of tokens)")
    per_token = 2 * 12 * 12 * 64 * 2  # bytes of GPT-2 small's cache per token, float16
    tokens = 64 * 2**30 / per_token
    close = 0.005  # the question asks for an order of magnitude: half a percent is near enough
    if abs(answer - 64e9 / per_token) <= close * tokens / 2:
        raise Mismatch(f"gpt2_tokens_in_64_gib = {answer:,.0f}: you used 64 GB (10^9 bytes); section 1's 64 GiB "
                       "are 64 times 2^30 bytes")
    if abs(answer - 2 * tokens) <= close * 2 * tokens:
        raise Mismatch(f"gpt2_tokens_in_64_gib = {answer:,.0f}, twice the answer: a token stores a key *and* a value, "
                       "and each float16 number takes 2 bytes")
    if abs(answer - tokens * 12) <= close * tokens * 12 or abs(answer - tokens / 12) <= close * tokens / 12:
        raise Mismatch(f"gpt2_tokens_in_64_gib = {answer:,.0f}, off by a factor of 12: GPT-2 small has 12 layers and 12 "
                       "heads per layer; count all 12 layers (each keeps its own cache) and all 12 heads (each its own "
                       "keys and values), each once")
    expect(abs(answer - tokens) <= close * tokens,
           f"gpt2_tokens_in_64_gib = {answer:,.0f}: divide 64 GiB by the bytes one token of GPT-2 small's cache takes "
           "(kv_cache_bytes with seq_len=1 and batch_size=1); within half a percent counts as right")
    big = 2 * 32 * 8 * 32 * 4096 * 128 * 2
    return (f"right: the memory of one layer's weights for one 32k-token sequence would hold GPT-2 small's cache "
            f"for millions of tokens. And a 7B-size model with batch 8 and 4096 tokens needs {big / 2**30:.0f} GiB "
            "for its cache alone.")


def _cache_reference(query, key, value, cache_keys, cache_values, length, mask="bottom_right", whole=False,
                     scale=None):
    """The right step (or one of its plausible wrong variants) on copies of the buffers: write, then attend."""
    T = query.size(2)
    keys, values = cache_keys.clone(), cache_values.clone()
    keys[:, :, length:length + T], values[:, :, length:length + T] = key, value
    S = keys.size(2) if whole else length + T
    keys, values = keys[:, :, :S], values[:, :, :S]  # (B, H, S, D)
    if mask == "inverted":  # the other convention: True = blocked
        allowed = ~causal_mask(T, S, align="bottom_right")
    else:
        allowed = None if mask is None else causal_mask(T, S, align=mask)  # (T, S), True = may attend
    return F.scaled_dot_product_attention(query, keys, values, attn_mask=allowed, scale=scale)  # (B, H, T, D)


def _finite_fill_reference(query, key, value, cache_keys, cache_values, length, fill=-100.0):
    """The step with the blocked scores filled with a finite value: where every real score lies far below it (near
    -20000), the blocked keys share the weight, whatever finite fill above the scores it was."""
    T = query.size(2)
    keys, values = cache_keys.clone(), cache_values.clone()
    keys[:, :, length:length + T], values[:, :, length:length + T] = key, value
    keys, values = keys[:, :, :length + T].double(), values[:, :, :length + T].double()  # (B, H, S, D)
    scores = query.double() @ keys.transpose(-2, -1) / math.sqrt(query.size(-1))  # (B, H, T, S)
    allowed = causal_mask(T, length + T, align="bottom_right")  # (T, S), True = may attend
    return torch.softmax(scores.masked_fill(~allowed, fill), dim=-1) @ values  # (B, H, T, D)


_CACHE_MISTAKES = (
    ("whole buffer", "you attended to all max_len slots of the buffers, the empty ones too; take only the first "
                     "length + T positions"),
    ("whole buffer, masked", "you attended to all max_len slots of the buffers, the empty ones too; take only the "
                             "first length + T positions"),
    ("no mask", "the new tokens of a chunk see each other's future: with T > 1 new tokens, query i (token "
                "length + i) may attend only to keys 0 .. length + i, a causal mask aligned to the bottom-right corner"),
    ("top left", "your causal mask is aligned to the top-left corner, so query i sees only keys 0 .. i. The new "
                 "queries are the *last* T of the length + T tokens: use align='bottom_right'"),
    ("no scale", "the scores are not divided by sqrt(D)"),
    ("inverted", "your mask blocks the past and allows the future: ac.causal_mask is True where attending is "
                 "*allowed* (the convention of F.scaled_dot_product_attention too); did you use it the other way round?"),
)


_CACHE_RUNS = (  # (B, H, D, max_len, dtype, steps as (first token, end)): the notebook's, then other sizes
    (2, 3, 8, 16, torch.float64, ((0, 5), (5, 6), (6, 9), (9, 12))),  # a prompt of 5, one token, chunks of 3
    (1, 1, 4, 9, torch.float32, ((0, 1), (1, 4), (4, 5), (5, 9))),  # one sequence, one head, float32, a full buffer
    (3, 2, 5, 11, torch.float32, ((0, 2), (2, 3), (3, 7))),  # three sequences, an odd head width
    (2, 2, 4, 10, torch.float32, ((0, 3), (3, 4), (4, 7))),  # float32 scores near 100 (see _check_cache_run)
    (2, 2, 4, 10, torch.float64, ((0, 3), (3, 4), (4, 7))),  # float64 scores near -20000, below any finite fill
    (1, 2, 4, 9, torch.float64, ((0, 5), (5, 6), (6, 9))),  # float64, each later key scoring 1e10 more
    (2, 2, 4, 10, torch.float64, ((0, 3), (3, 4), (4, 7))),  # float64 scores all equal to -1e12, below -1e5 and -1e9
    (1, 2, 4, 9, torch.float64, ((0, 5), (5, 6), (6, 9))),  # float64, each later key scoring 1e300 more
    (2, 2, 4, 10, torch.float64, ((0, 3), (3, 4), (4, 7))),  # float64 scores all equal to -1e300, below -1e30 too
)  # (the 1e300 steps first: near -1e300, a fixed penalty such as 1e30 is lost in rounding and reads as no mask)
_LARGE_RUN, _FAR_BELOW_RUN, _RISING_RUN, _FARTHEST_RUN, _STEEPEST_RUN, _LOWEST_RUN = 3, 4, 5, 6, 7, 8  # in _CACHE_RUNS


@exercise(
    "Exercise 5, the key/value cache update",
    hint="write the new keys and values into the buffers in place, at the positions right after the length stored "
         "ones; attend over the first length + T positions only; the mask is causal and aligned to the bottom-right "
         "corner, because new query i is token length + i",
)
def check_cache_attention_step(cache_attention_step) -> str:
    for run, (B, H, D, max_len, dtype, steps) in enumerate(_CACHE_RUNS):
        _check_cache_run(cache_attention_step, B, H, D, max_len, dtype, steps, seed=21 + run, large=run == _LARGE_RUN,
                         far_below={_FAR_BELOW_RUN: "-20000", _FARTHEST_RUN: "-1e12", _LOWEST_RUN: "-1e300"}.get(run),
                         rising={_RISING_RUN: "1e10", _STEEPEST_RUN: "1e300"}.get(run))
    # Another device: the notebook's GPU, or the meta device (a mask made without device= is named).
    device = other_device()
    generator = rng(31)
    q, k, v = (randn(1, 2, 3, 4, generator=generator, dtype=torch.float32) for _ in range(3))  # (B, H, T, D)
    cache_keys, cache_values = (randn(1, 2, 8, 4, generator=generator, dtype=torch.float32) for _ in range(2))
    shown = ("cache_attention_step(query, key, value, cache_keys, cache_values, length=2) for 3 new tokens, with every "
             f"tensor on the {device.type} device")
    on = [x.to(device) for x in (q, k, v, cache_keys, cache_values)]
    got = call_elsewhere(cache_attention_step, *on[:3], mutable(on[3]), mutable(on[4]), 2, device=device, what=shown)
    if got is None:  # the meta device cannot run it (it reads a value): on the CPU under the shared device watch
        here = [x.clone() for x in (q, k, v, cache_keys, cache_values)]
        _watched_on_cpu(cache_attention_step, here, (*here[:3], mutable(here[3]), mutable(here[4]), 2), shown)
    if got is not None:
        got = expect_on_device(got, device, shown, dtype="float")
        expect_tensor(got, what=shown, shape=(1, 2, 3, 4))
        if device.type != "meta":
            want = _cache_reference(q, k, v, cache_keys, cache_values, 2)
            expect_close(got, want.to(device), what=shown)
    return ("your step fills the cache in place and gives the same outputs as attention over the whole sequence, "
            "for a prompt, a single token and chunks, at every size tried: the update of ac.KVCache and the attention "
            "of ac.cached_self_attention.")


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal, NaN where the other is NaN included (the buffers' unwritten slots hold NaN)."""
    return torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))


def _check_cache_run(cache_attention_step, B, H, D, max_len, dtype, steps, seed, large=False, far_below=None,
                     rising=None) -> None:
    generator = rng(seed)
    tokens = steps[-1][1]
    q, k, v = (randn(B, H, tokens, D, generator=generator, dtype=dtype) for _ in range(3))  # (B, H, tokens, D)
    if large:  # coordinate 0: 10 in every query, 10 sqrt(D) in every key, so every score lies near 100
        q[..., 0], k[..., 0] = 10.0, 10.0 * math.sqrt(D)
    if far_below == "-20000":  # coordinate 0: -10 in every query, 2000 sqrt(D) in every key: every score near
        q[..., 0], k[..., 0] = -10.0, 2000.0 * math.sqrt(D)  # -20000, below a finite fill of -100, -1e3 or -1e4
    if far_below == "-1e12":  # only coordinate 0 of the queries: every score exactly -1e12, below -1e5 and -1e9 too
        q[..., 1:], q[..., 0], k[..., 0] = 0.0, -1000.0, 1e9 * math.sqrt(D)
    if far_below == "-1e300":  # the same with 1e297 sqrt(D) in every key: every score exactly -1e300, below -1e30
        q[..., 1:], q[..., 0], k[..., 0] = 0.0, -1000.0, 1e297 * math.sqrt(D)  # and any finite fill tried
    if rising:  # coordinate 0: 10 in every query, 1e9 t sqrt(D) (or 1e299 t sqrt(D)) in key t, so that key t scores
        q[..., 0] = 10.0  # about 1e10 t (1e300 t): each later key that much above the one before, and a blocked score
        step = 1e9 if rising == "1e10" else 1e299  # lowered by a fixed amount (1e9, or 1e30) still outranks the rest
        k[..., 0] = step * math.sqrt(D) * torch.arange(tokens, dtype=dtype)
    full = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True).to(dtype)  # (B, H, tokens, D)
    # (B, H, max_len, D): nothing stored yet. NaN, as a buffer from torch.empty may hold: a step that reads the slots
    # after length + T (attention over the whole buffer, even with those slots masked: 0 x NaN is NaN) shows it.
    cache_keys = torch.full((B, H, max_len, D), float("nan"), dtype=dtype)
    cache_values = torch.full((B, H, max_len, D), float("nan"), dtype=dtype)
    for start, end in steps:
        T = end - start
        what = (f"cache_attention_step(...) for tokens {start}..{end - 1} with length={start} "
                f"(B={B}, H={H}, D={D}, max_len={max_len}, {str(dtype).replace('torch.', '')})")
        before_keys, before_values = cache_keys.clone(), cache_values.clone()
        new = [t[:, :, start:end].clone() for t in (q, k, v)]
        got = call(cache_attention_step, *new, mutable(cache_keys), mutable(cache_values), start)  # written in place
        got = expect_tensor(got, what=what, shape=(B, H, T, D), dtype="float", device=q)
        if got.dtype != dtype:  # before the comparisons below cast it to float64
            raise Mismatch(f"{what}: your output is {got.dtype} for {dtype} inputs; the statement asks for the inputs' "
                           "dtype (attention over the buffers gives it: do not convert)")
        got = got.detach().double()
        if _same(cache_keys, before_keys) and _same(cache_values, before_values):
            raise Mismatch(f"{what}: the cache buffers did not change. Write the new keys and values into "
                           "cache_keys and cache_values in place (cache_keys[:, :, a:b] = key), so that later steps "
                           "find them; torch.cat makes a new tensor and leaves the buffers as they were.")
        if start > 0 and torch.allclose(cache_keys[:, :, :T], k[:, :, start:end]):
            raise Mismatch(f"{what}: you wrote the new keys at position 0, over the first tokens; they go after the "
                           f"{start} stored ones, at positions length .. length + T - 1.")
        if not (torch.allclose(cache_keys[:, :, :end], k[:, :, :end]) and torch.allclose(cache_values[:, :, :end], v[:, :, :end])):
            raise Mismatch(f"{what}: after the step, the first {end} positions of the buffers should hold the keys "
                           f"and values of tokens 0..{end - 1}; they do not (check the slice you write into, and "
                           "that keys go to cache_keys and values to cache_values).")
        if not (_same(cache_keys[:, :, end:], before_keys[:, :, end:])
                and _same(cache_values[:, :, end:], before_values[:, :, end:])):
            raise Mismatch(f"{what}: you wrote beyond position {end - 1}: the slots after the stored tokens must stay "
                           "as they were.")
        if large and not torch.isfinite(got).all():
            raise Mismatch(f"{what}: your output holds NaN or inf. Every score here lies near 100, and exp(100) "
                           "overflows float32 (its largest exponent is about 88.7): a softmax written by hand must "
                           "subtract each row's maximum score before exponentiating (or use .softmax or "
                           "F.scaled_dot_product_attention, which do).")
        if torch.isnan(got).any() and end < max_len:
            raise Mismatch(f"{what}: your output holds NaN. The buffers' slots after the stored and new tokens "
                           f"(positions {end} .. {max_len - 1}) hold NaN here, as a buffer made by torch.empty may: "
                           "if you attended to all max_len slots of the buffers, the empty ones too, even with them "
                           "masked (a weight of 0 times NaN is NaN), take only the first length + T positions. "
                           "Otherwise NaN comes from a query that has every key blocked: ac.causal_mask is True where "
                           "attending is *allowed*; new query i (token length + i) sees keys 0 .. length + i, its own "
                           "included.")
        if torch.isnan(got).any():
            raise Mismatch(f"{what}: your output holds NaN, which happens when a query has every key blocked. "
                           "ac.causal_mask is True where attending is *allowed*: did you use it the other way round? Or "
                           "does your mask hide each query's own key? New query i (token length + i) sees keys 0 .. "
                           "length + i, its own included (the first token of a prompt sees only itself).")
        right = full[:, :, start:end]
        atol = 1e-6 if dtype == torch.float64 else 1e-5
        if rising and not torch.allclose(got, right.double(), atol=atol):
            raise Mismatch(f"{what}: {_FIXED_PENALTY.format(step=rising)}, or pass the boolean mask to "
                           "F.scaled_dot_product_attention.")
        if not torch.allclose(got, right.double(), atol=atol):
            for name, message in _CACHE_MISTAKES:
                mask = {"no mask": None, "whole buffer": None, "top left": "top_left", "inverted": "inverted"}.get(
                    name, "bottom_right")
                variant = _cache_reference(*new, before_keys, before_values, start, mask=mask,
                                           whole=name.startswith("whole"), scale=1.0 if name == "no scale" else None)
                if torch.allclose(got, variant.double(), atol=atol) and not torch.allclose(variant, right, atol=atol):
                    raise Mismatch(f"{what}: {message}.")
            if far_below and torch.allclose(got, _finite_fill_reference(*new, before_keys, before_values, start),
                                            atol=atol):
                raise Mismatch(f"{what}: {_FINITE_FILL.format(level=far_below)} (or pass the boolean mask to "
                               "F.scaled_dot_product_attention).")
        if _float32_in_float64(got, right):
            raise Mismatch(f"{what}: {_FLOAT32_PRECISION}.")
        expect_close(got, right, what=f"{what}: the outputs of the new tokens (they must equal causal attention over "
                                      f"all {end} tokens, at positions {start}..{end - 1})")
