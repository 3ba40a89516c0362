"""Checks for the exercises of chapter 11, multi-head latent attention (DeepSeek-V2's MLA).

Each check tries the answer on cases chosen so that the usual mistakes give a wrong result, and names
the mistake when it recognises one; the table of those mistakes is in tests/test_exercises_ch11.py.
They use the shared mechanism of ``attn_course.exercises``: the package forbidden where the exercise
asks for plain torch (``forbid=("attn_course",)``: its ``cache_elements_per_token`` and
``MultiHeadLatentAttention`` among the rest), inputs watched for changes in place, sizes unlike the
notebook's (one head, a head width unlike the latent's, one query and several, batch 1 and 3, no
rotary part), float64 as well as float32, numbers given as numpy integers or fractions (and whole
numbers as floats in exercise 1), and one case on another device (the GPU where there is one, else
PyTorch's "meta" device, which has shapes but no values), so that a tensor made without ``device=``
is caught.

Exercise 2 asks for the absorbed form, which never builds a key per head and cached token: its check
watches every tensor that the answer creates (a ``TorchDispatchMode`` around every call) and rejects an
answer that makes one as large as the keys of one head for every cached token, or that does as many
multiply-adds (matrix, outer and elementwise products, and quotients of two tensors, alike; an elementwise
product counts by the size of its output, so a one-element operand hides nothing) as rebuilding one head's
keys. Each case applies those two limits where its sizes tell the forms apart (where every absorbed answer
stays below them); two cases do, one query with batch 1 and three queries with batch 2, so that an answer
that rebuilds the keys only for several queries (section 4's advice for prefill) is named too. A third, a prefill
(as many queries as cached tokens, heads 32 times wider than the latent), names an answer that rebuilds the keys
whenever the queries are about as many as the cached tokens (vLLM's rule): there every query still meets every
key in the head width, several times the work of the absorbed form, which scores in the latent's width. A fourth, a
long cache (300 tokens) with wide heads and a narrow latent, adds a third limit, the count of all the numbers the
answer's operations produce (views not counted): one head's keys are more numbers than the absorbed form produces
there, so keys rebuilt through operations the multiply-add count has no formula for (``prod``, ``pow``, a
polarization identity) are named as well. Two more cases have DeepSeek-V2's proportions (a latent four times a
head's width), so that an answer that rebuilds the keys only when the heads are narrower than the latent is named
by the multiply-add limit; and one with three heads and one in float64 are watched too. It also forbids
leaving torch (``Tensor.numpy``, ``__array__``, ``tolist``, ``item``, ``float()``, ``int()``): keys built in
numpy, Python lists or Python numbers would hide from that watch, on a machine with a GPU as on one without.

Results follow the course's dtype policy (``expect_close``): a float32 result of float64 inputs passes,
half precision of float32 or float64 inputs does not; the statements ask for no particular dtype.
"""

from __future__ import annotations

import math
import numbers

import torch

from . import (Mismatch, call, call_elsewhere, exercise, expect, expect_close, expect_int, expect_number, expect_on_device,
               expect_sequence, forbidden, other_device, randn, rng)
from ._ch11_watch import _LargestTensor

__all__ = ["check_cache_per_token", "check_absorbed_scores", "check_merged_output"]


# --------------------------------------------------------------------------------------------------
# Another device

def _call_elsewhere(fn, *args, device: torch.device, what: str, shape: tuple) -> None:
    """``call(fn, *args)`` with ``args`` on ``device`` (:func:`other_device`): the result must be a tensor of
    ``shape`` on that device. On the meta device an answer that needs values (``.item()``, an ``if`` on a
    tensor) cannot be judged and passes here (the CPU cases judge it)."""
    got = call_elsewhere(fn, *args, device=device, what=what, made_by="torch.zeros, torch.empty, torch.tensor ...")
    if got is None and device.type == "meta":
        return
    got = expect_on_device(got, device, what)
    expect(tuple(got.shape) == tuple(shape), f"{what}: expected shape {tuple(shape)}, got {tuple(got.shape)}")


# --------------------------------------------------------------------------------------------------
# Exercise 1: the cache per token, and the GQA groups with the same cache

def _cache(num_layers: int, num_heads: int, head_dim: int, kv_latent_dim: int, rope_head_dim: int):
    mha = 2 * num_heads * head_dim * num_layers  # a key and a value per head, per layer
    mla = (kv_latent_dim + rope_head_dim) * num_layers  # the latent and the one shared rotary key, per layer
    groups = (kv_latent_dim + rope_head_dim) / (2 * head_dim)  # a GQA group caches a key and a value of width d_h
    return mha, mla, groups


def _whole(got, *, what: str) -> int:
    """A count of numbers: an int, a numpy integer, a one-element tensor, or a float that is a whole number
    (34560.0 from ``2.25 * 2 * 128 * 60``); 34560.5 is a Mismatch."""
    try:
        return expect_int(got, what=what)
    except Mismatch:
        value = expect_number(got, what=what)
        if isinstance(value, numbers.Real) and math.isfinite(value) and float(value).is_integer():
            return int(value)
        raise Mismatch(f"{what}: a count of numbers is a whole number, got {value!r}") from None


@exercise(
    "Exercise 1, the cache per token of MHA and MLA, and the GQA groups with the same cache",
    hint="count the numbers one token leaves in every layer's cache: multi-head attention keeps a key and a value "
         "for each head; latent attention keeps its latent once (keys and values are both rebuilt from it) and one "
         "rotary key shared by all heads; a GQA group keeps one key and one value of a head's width",
    forbid=("attn_course",),
)
def check_cache_per_token(cache_per_token) -> str:
    cases = [  # (num_layers, num_heads, head_dim, kv_latent_dim, rope_head_dim)
        (60, 128, 128, 512, 64),  # DeepSeek-V2 (section 3.1.2)
        (2, 8, 4, 4, 4),  # the miniature of this chapter
        (3, 5, 6, 7, 0),  # no rotary part, a latent unlike the heads
        (1, 1, 8, 3, 2),  # one head, one layer
        (27, 16, 128, 512, 64),  # the small models of the paper's Table 9
    ]
    for num_layers, num_heads, head_dim, d_c, d_r in cases:
        what = (f"cache_per_token(num_layers={num_layers}, num_heads={num_heads}, head_dim={head_dim}, "
                f"kv_latent_dim={d_c}, rope_head_dim={d_r})")
        got = expect_sequence(call(cache_per_token, num_layers, num_heads, head_dim, d_c, d_r), what=what,
                              names=("mha_elements", "mla_elements", "equivalent_groups"))
        mha = _whole(got[0], what=f"{what}: mha_elements")
        mla = _whole(got[1], what=f"{what}: mla_elements")
        groups = expect_number(got[2], what=f"{what}: equivalent_groups")
        want_mha, want_mla, want_groups = _cache(num_layers, num_heads, head_dim, d_c, d_r)
        # Multi-head attention.
        if mha != want_mha:
            if mha == want_mha // 2:
                raise Mismatch(f"{what}: mha_elements = {mha:,} is half the answer: each head caches a key *and* a value")
            if num_layers > 1 and mha == want_mha // num_layers:
                raise Mismatch(f"{what}: mha_elements = {mha:,} is one layer's cache: every layer keeps its own")
            raise Mismatch(f"{what}: mha_elements should be {want_mha:,}, got {mha:,}")
        # Latent attention.
        if mla != want_mla:
            if num_heads > 1 and d_r and mla == (d_c + num_heads * d_r) * num_layers:
                raise Mismatch(f"{what}: mla_elements = {mla:,} counts a rotary key per head; k_R is one per token, "
                               "shared by every head")
            if mla == 2 * want_mla:
                raise Mismatch(f"{what}: mla_elements = {mla:,} is twice the answer: the latent is cached once, and both "
                               "the keys and the values are rebuilt from it (and the rotary key is one vector)")
            if d_r and mla == d_c * num_layers:
                raise Mismatch(f"{what}: mla_elements = {mla:,} leaves out the decoupled rotary key, which is cached too")
            if num_layers > 1 and mla == want_mla // num_layers:
                raise Mismatch(f"{what}: mla_elements = {mla:,} is one layer's cache: every layer keeps its own")
            raise Mismatch(f"{what}: mla_elements should be {want_mla:,}, got {mla:,}")
        # The groups of GQA with the same cache.
        if not math.isclose(groups, want_groups, rel_tol=1e-6, abs_tol=1e-12):  # float32 holds 7 digits
            if math.isclose(groups, 2 * want_groups, rel_tol=1e-9):
                raise Mismatch(f"{what}: equivalent_groups = {groups:g} is twice the answer: a GQA group caches a key "
                               f"and a value, 2 * head_dim = {2 * head_dim} numbers per layer")
            if math.isclose(groups, want_mla / want_mha, rel_tol=1e-9):
                raise Mismatch(f"{what}: equivalent_groups = {groups:g} is MLA's fraction of MHA's cache, not a number "
                               "of GQA groups: how many groups of one key and one value cache as much as MLA?")
            if num_layers > 1 and math.isclose(groups, want_groups * num_layers, rel_tol=1e-9):
                raise Mismatch(f"{what}: equivalent_groups = {groups:g} compares all layers of MLA with one layer of "
                               "GQA; compare one layer with one layer")
            raise Mismatch(f"{what}: equivalent_groups should be {want_groups:g}, got {groups:g}")
    v2_mha, v2_mla, v2_groups = _cache(*cases[0])
    return (f"DeepSeek-V2's sizes give {v2_mla:,} numbers per token against {v2_mha:,} for MHA, the cache of GQA with "
            f"{v2_groups:g} groups. Now run your function on the sizes the exercise names.")


# --------------------------------------------------------------------------------------------------
# Exercise 2: absorbed scores, every head, with the decoupled rotary part

def _naive_scores(q_content, q_rope, w_uk, latents, rope_keys, *, scale=None, head_order="hd", rope=True):
    """The scores of equations (16)-(18) before the softmax, with per-head keys built (float64)."""
    q_content, w_uk, latents = q_content.double(), w_uk.double(), latents.double()
    B, H, L, D = q_content.shape
    S, Dc = latents.shape[1], latents.shape[2]
    if head_order == "hd":
        w = w_uk.view(H, D, Dc)  # rows h*D .. h*D + D - 1 belong to head h
    elif head_order == "dh":
        w = w_uk.view(D, H, Dc).transpose(0, 1)  # the wrong split: head h takes rows h, h + H, ...
    else:  # "hcd": the numbers of w_uk read as (H, Dc, D), then turned the right way
        w = w_uk.reshape(H, Dc, D).transpose(1, 2)
    keys = torch.einsum("hdc,bsc->bhsd", w, latents)  # (B, H, S, D)
    scores = q_content @ keys.transpose(-2, -1)  # (B, H, L, S)
    Dr = 0 if q_rope is None else q_rope.shape[-1]
    if rope and q_rope is not None:
        scores = scores + q_rope.double() @ rope_keys.double()[:, None].transpose(-2, -1)  # (B, H, L, S)
    return scores * (1.0 / math.sqrt(D + Dr) if scale is None else scale)


def _absorbed_bounds(B, H, L, D, Dc, Dr, S):
    """Generous ceilings on what an absorbed answer makes and does, written any of the ways the tests try (matrix
    products, einsum, broadcasting and sums, the concatenated [q ; q_R] . [c ; k_R] form, scaling any operand by a
    tensor): its largest tensor, and its multiply-adds."""
    largest = max(B * H * L * S * (Dc + Dr), B * H * L * D * Dc, H * D * Dc, B * S * (Dc + Dr), B * H * L * (D + Dr))
    work = B * H * L * D * Dc + B * H * L * S * (Dc + Dr + 1) + B * H * L * (D + Dr + Dc)
    # every number it produces: copies of the inputs (a cast, a contiguous copy, the check's own), the broadcast
    # products of the queries with W_UK and of the latent queries with the latents, a few versions of the scores
    inputs = B * H * L * (D + Dr) + H * D * Dc + B * S * (Dc + Dr)
    produced = (3 * inputs + B * H * L * D * Dc + 2 * B * H * L * S * (Dc + Dr) + 6 * B * H * L * S
                + 2 * B * H * L * (Dc + Dr))
    return largest, work, produced


def _scores_case(absorbed_scores, generator, B, H, L, D, Dc, Dr, S, dtype=torch.float32, decode_passed=False,
                 prefill=False):
    q_content = randn(B, H, L, D, generator=generator, dtype=dtype)
    q_rope = randn(B, H, L, Dr, generator=generator, dtype=dtype)
    w_uk = randn(H * D, Dc, generator=generator, dtype=dtype, scale=0.5)
    latents = randn(B, S, Dc, generator=generator, dtype=dtype)
    rope_keys = randn(B, S, Dr, generator=generator, dtype=dtype)
    what = (f"absorbed_scores(q_content {tuple(q_content.shape)}, q_rope {tuple(q_rope.shape)}, w_uk "
            f"{tuple(w_uk.shape)}, latents {tuple(latents.shape)}, rope_keys {tuple(rope_keys.shape)})")
    watcher = _LargestTensor()
    with watcher, _in_torch():
        got = call(absorbed_scores, q_content, q_rope, w_uk, latents, rope_keys)
    # The two limits, where this case's sizes tell the forms apart: one head's keys for every cached token are
    # larger, and take more multiply-adds, than anything an absorbed answer makes or does (_absorbed_bounds).
    largest, work, produced = _absorbed_bounds(B, H, L, D, Dc, Dr, S)
    watch_size, watch_work = B * S * D > largest, B * S * D * Dc > work
    # However the products are written (matmul, prod, pow, a polarization identity), one head's keys for every
    # cached token are B * S * D new numbers, more than everything an absorbed answer produces at these sizes.
    if B * S * D > produced and watcher.produced >= B * S * D:
        raise Mismatch(f"{what}: your function produced {watcher.produced:,} numbers in all (the outputs of its "
                       f"operations, views not counted), at least as many as one head's keys for all {S} cached "
                       f"tokens ({S} x {D} = {B * S * D:,}), where the absorbed form produces at most {produced:,} "
                       "here: it rebuilt the keys, piece by piece or at once, whatever operation made the products. "
                       f"Multiply each head's query by its block of W_UK first (a vector of width {Dc}), then score "
                       "it against the latents themselves")
    watched = watch_size and watcher.numel >= B * S * D or watch_work and watcher.multiply_adds >= B * S * D * Dc
    if watched and L > 1 and decode_passed:
        raise Mismatch(f"{what}: with L = {L} queries your function rebuilt the cached tokens' keys (its largest "
                       f"tensor has shape {watcher.shape}, and it did {watcher.multiply_adds:,} multiply-adds, where "
                       f"one head's keys for all {S} cached tokens take {B * S * D * Dc:,}), though with one query it "
                       "did not. "
                       "Section 4 counts building the keys as less work for a prefill (as many queries as cached "
                       "tokens), and serving systems do it there; that is a serving choice, not this exercise: the "
                       "exercise is the absorbed decode path, the same for every L. Multiply each head's queries by its block of W_UK first, then score them against the "
                       "latents themselves")
    # A prefill (L == S) with heads much wider than the latent: building the keys is no cheaper here, since every
    # query still meets every key in width d_h (B*H*L*S*D multiply-adds), far above the absorbed ceiling.
    scored_in_head_width = B * H * L * S * D
    if prefill and watcher.multiply_adds >= scored_in_head_width > work:
        raise Mismatch(f"{what}: with L = S = {L} (a prefill) your function did {watcher.multiply_adds:,} "
                       f"multiply-adds, as many as scoring every query against a key of width d_h = {D} for every "
                       f"cached token ({scored_in_head_width:,}); the absorbed form scores in width d_c + d_h^R = "
                       f"{Dc + Dr} and does at most {work:,} here: with several queries your function rebuilt the "
                       "cached tokens' keys, though with one query it did not. "
                       "Section 4 counts building the keys as less work for a prefill at its sizes, and serving "
                       "systems choose it there (vLLM when the queries are about as many as the cached tokens); that "
                       "is a serving choice, not this exercise: the exercise is the absorbed decode path, the same for "
                       "every L. Multiply each head's queries by its block of W_UK first, then score them against the "
                       "latents themselves")
    if watch_size and watcher.numel >= B * S * D:
        raise Mismatch(f"{what}: your function made a tensor of shape {watcher.shape}, {watcher.numel:,} numbers, as "
                       f"many as the keys of a head for all {S} cached tokens ({S} x {D}): that is the up-projection "
                       "the absorbed form avoids. Multiply each head's query by its block of W_UK first (a vector of "
                       f"width {Dc}), then score it against the latents themselves")
    if watch_work and watcher.multiply_adds >= B * S * D * Dc:
        raise Mismatch(f"{what}: your function did {watcher.multiply_adds:,} multiply-adds (matrix and outer "
                       f"products, convolutions, elementwise products and quotients of two tensors), at least as many "
                       f"as rebuilding one head's keys "
                       f"for all {S} cached tokens ({S} x "
                       f"{D} x {Dc} = {B * S * D * Dc:,}; the keys of all H = {H} heads take {B * S * H * D * Dc:,}): the absorbed "
                       "form never up-projects the cache, piece by piece or at once. Multiply each head's query by its "
                       f"block of W_UK first (a vector of width {Dc}), then score it against the latents")
    if not isinstance(got, torch.Tensor):
        raise Mismatch(f"{what}: expected a torch.Tensor of scores, got {type(got).__name__}")
    expected = _naive_scores(q_content, q_rope, w_uk, latents, rope_keys).to(dtype)
    if tuple(got.shape) == tuple(expected.shape) and got.is_floating_point() and H > 1 and D > 1:
        g = got.detach().double()
        mistakes = {
            "you scaled by 1/sqrt(d_h), the head width of the content part; in MLA a query is [q_C ; q_R], so the "
            "scale is 1/sqrt(d_h + d_h^R)": _naive_scores(q_content, q_rope, w_uk, latents, rope_keys,
                                                             scale=1 / math.sqrt(D)),
            "these scores are not scaled: divide by sqrt(d_h + d_h^R), the width of a whole query":
                _naive_scores(q_content, q_rope, w_uk, latents, rope_keys, scale=1.0),
            "the rotary part q_R . k_R is missing: each head's score adds its rotary query times the shared rotary key":
                _naive_scores(q_content, q_rope, w_uk, latents, rope_keys, rope=False),
            "the heads' rows of w_uk are split the wrong way: rows h*D to h*D + D - 1 belong to head h "
            "(view it as (H, D, d_c), not (D, H, d_c))": _naive_scores(q_content, q_rope, w_uk, latents, rope_keys,
                                                                        head_order="dh"),
            "w_uk was reshaped as (H, d_c, D), which reads its numbers in the wrong order: it is (H * D, d_c), so "
            "view it as (H, D, d_c), or transpose it first": _naive_scores(q_content, q_rope, w_uk, latents, rope_keys,
                                                                            head_order="hcd"),
        }
        right = expected.double()
        summed = right.sum(dim=1, keepdim=True)  # (B, 1, L, S): every head given the sum of the heads' scores
        for mistake, wrong in mistakes.items():
            if torch.allclose(g, wrong, atol=1e-5, rtol=1e-4) and not torch.allclose(wrong, right, atol=1e-5, rtol=1e-4):
                raise Mismatch(f"{what}: {mistake}")
        if torch.allclose(g, summed.expand_as(g), atol=1e-5, rtol=1e-4):
            raise Mismatch(f"{what}: every head got the same scores, the sum over heads: W_UK was applied to all the "
                           "heads' queries at once. Each head has its own block of W_UK and its own scores")
    # The course's dtype policy: a float32 result of float64 inputs passes (with float32's tolerance); half
    # precision of float32 or float64 inputs does not (expect_close names it). The statement asks for no dtype.
    expect_close(got, expected, what=what)


def _in_torch() -> forbidden:
    """Exercise 2 asks for plain torch: keys built in numpy, Python lists or Python numbers (``.item()``,
    ``float(t)``, ``int(t)``) would hide from the watch on the tensors the answer makes and on its multiply-adds, on
    every machine."""
    return forbidden(torch.Tensor.numpy, torch.Tensor.__array__, torch.Tensor.tolist, torch.Tensor.item,
                     torch.Tensor.__float__, torch.Tensor.__int__, torch.Tensor.__index__,
                     reason="this exercise asks for plain torch; leaving torch for numpy, Python lists or Python "
                            "numbers (to build the keys there, say) hides the work from the check, which watches the "
                            "tensors your function makes and its multiply-adds; keep every step in torch, on the "
                            "inputs' device")


@exercise(
    "Exercise 2, absorbed scores for every head, with the decoupled rotary part",
    hint="split W_UK into one (d_h, d_c) block per head (rows h*d_h onwards), carry each head's content query "
         "through its block's transpose into the latent space, score that against the cached latents, add the rotary "
         "query's dot product with the shared rotary key, and scale by the width of a whole query",
    forbid=("attn_course",),
)
def check_absorbed_scores(absorbed_scores) -> str:
    generator = rng(1102)
    # Every case is watched; these three have wide heads, so that building the keys shows: one query (decoding)
    # with batch 1 and many cached tokens, then three queries with batch 2 (an answer that builds the keys only for
    # several queries, as section 4 advises for prefill, passes the first and is named at the second), then a prefill.
    _scores_case(absorbed_scores, generator, B=1, H=2, L=1, D=24, Dc=5, Dr=4, S=60)
    _scores_case(absorbed_scores, generator, B=2, H=2, L=3, D=48, Dc=4, Dr=2, S=48, decode_passed=True)
    # A prefill, as many queries as cached tokens, with heads much wider than the latent: an answer that builds the
    # keys whenever the queries are about as many as the cached tokens (vLLM's rule) does 10,496 multiply-adds here,
    # the absorbed form 2,560 (its ceiling 3,776), and it is named.
    _scores_case(absorbed_scores, generator, B=1, H=2, L=8, D=64, Dc=2, Dr=2, S=8, prefill=True)
    # A long cache with wide heads and a narrow latent: one head's keys (19,200 numbers) outnumber everything the
    # absorbed form produces (at most 11,036), so keys rebuilt by any route (prod, pow, ...) are named by their count.
    _scores_case(absorbed_scores, generator, B=1, H=2, L=1, D=64, Dc=2, Dr=2, S=300)
    # DeepSeek-V2's proportions, a latent four times a head's width (d_c = 4 d_h): the multiply-add limit applies
    # here too, so an answer that rebuilds the keys whenever a head is no wider than the latent is named.
    _scores_case(absorbed_scores, generator, B=1, H=2, L=1, D=8, Dc=32, Dr=4, S=100)
    _scores_case(absorbed_scores, generator, B=2, H=2, L=3, D=8, Dc=32, Dr=4, S=100, decode_passed=True)
    # Three heads, and float64: an answer that rebuilds the keys only for more than two heads, or only for float64
    # inputs, is named by the multiply-add limit as well.
    _scores_case(absorbed_scores, generator, B=1, H=3, L=1, D=24, Dc=5, Dr=4, S=60)
    _scores_case(absorbed_scores, generator, B=1, H=2, L=1, D=24, Dc=5, Dr=4, S=60, dtype=torch.float64)
    # The notebook's sizes, then others: several queries, batch 3, one head, a head wider and narrower than the
    # latent, no rotary part, float64 (too small for the limits to tell the forms apart, so they check the numbers).
    for B, H, L, D, Dc, Dr, S in ((2, 4, 1, 8, 6, 4, 10), (3, 3, 4, 6, 10, 2, 7), (1, 1, 2, 5, 3, 2, 9),
                                  (2, 2, 3, 4, 6, 0, 5), (2, 4, 1, 8, 8, 4, 10)):
        _scores_case(absorbed_scores, generator, B, H, L, D, Dc, Dr, S)
    _scores_case(absorbed_scores, generator, 2, 3, 2, 7, 4, 2, 6, dtype=torch.float64)
    # The GPU where there is one, else the meta device: new tensors must follow the inputs.
    device = other_device()
    B, H, L, D, Dc, Dr, S = 2, 4, 1, 8, 6, 4, 10
    inputs = [randn(*size, generator=generator).to(device)
              for size in ((B, H, L, D), (B, H, L, Dr), (H * D, Dc), (B, S, Dc), (B, S, Dr))]
    _call_elsewhere(absorbed_scores, *inputs, device=device, shape=(B, H, L, S),
                    what=f"absorbed_scores with its inputs on the {device.type} device")
    return ("each head scores the cached latents with W_UK folded into its query, as DeepSeek-V2 does at inference: "
            "no key is rebuilt, however long the cache.")


# --------------------------------------------------------------------------------------------------
# Exercise 3: W_UV folded into W_O

def _merged(w_uv: torch.Tensor, w_o: torch.Tensor, num_heads: int, head_order: str = "hd",
            output_order: str = "hd") -> torch.Tensor:
    HD, Dc = w_uv.shape
    E = w_o.shape[0]
    D = HD // num_heads
    if head_order == "hd":
        uv = w_uv.double().view(num_heads, D, Dc)  # (H, D, Dc): W_UV,h
    elif head_order == "hcd":  # the numbers of w_uv read as (H, Dc, D), then turned the right way
        uv = w_uv.double().reshape(num_heads, Dc, D).transpose(1, 2)
    else:
        uv = w_uv.double().view(D, num_heads, Dc).transpose(0, 1)
    if output_order == "hd":
        o = w_o.double().view(E, num_heads, D)  # (E, H, D): W_O's columns of head h
    else:
        o = w_o.double().view(E, D, num_heads).transpose(1, 2)  # the wrong split: head h takes columns h, h + H, ...
    return torch.einsum("ehd,hdc->ehc", o, uv).reshape(E, num_heads * Dc)  # (E, H * Dc)


@exercise(
    "Exercise 3, fold W_UV into the output projection W_O",
    hint="the output is W_O times the heads' contexts side by side, and head h's context is its block of W_UV times "
         "its average of the latents; so head h's block of columns in the merged matrix is W_O's columns of head h "
         "times W_UV's rows of head h, and the blocks stand side by side in head order",
    forbid=("attn_course",),
)
def check_merged_output(merge_value_into_output) -> str:
    generator = rng(1103)
    for E, H, D, Dc, dtype in ((32, 4, 8, 6, torch.float32), (16, 4, 8, 8, torch.float32), (10, 3, 6, 4, torch.float32), (7, 1, 5, 9, torch.float32),
                               (12, 2, 3, 5, torch.float64)):
        w_uv = randn(H * D, Dc, generator=generator, dtype=dtype)
        w_o = randn(E, H * D, generator=generator, dtype=dtype)
        what = f"merge_value_into_output(w_uv {tuple(w_uv.shape)}, w_o {tuple(w_o.shape)}, num_heads={H})"
        got = call(merge_value_into_output, w_uv, w_o, H)
        if not isinstance(got, torch.Tensor):
            raise Mismatch(f"{what}: expected a torch.Tensor, got {type(got).__name__}")
        expected = _merged(w_uv, w_o, H).to(dtype)
        if tuple(got.shape) == (E, Dc) and H > 1:
            raise Mismatch(f"{what}: shape {tuple(got.shape)} is W_O @ W_UV of the whole matrices, which adds the heads' "
                           "products together; each head averages its own latents, so the merged matrix keeps one block "
                           f"of {Dc} columns per head: shape (E, H * d_c) = {(E, H * Dc)}")
        if tuple(got.shape) == (H, E, Dc) or tuple(got.shape) == (E, H, Dc):
            raise Mismatch(f"{what}: shape {tuple(got.shape)}: put the heads' blocks side by side, head 0 first, in one "
                           f"matrix of shape (E, H * d_c) = {(E, H * Dc)}")
        if tuple(got.shape) == (H * Dc, E):
            raise Mismatch(f"{what}: shape {tuple(got.shape)} is the transpose: like W_O, the merged matrix maps the "
                           f"heads' contexts to the model width, shape (E, H * d_c) = {(E, H * Dc)}")
        if tuple(got.shape) == tuple(expected.shape) and got.is_floating_point() and H > 1:
            g = got.detach().double()
            if torch.allclose(g, _merged(w_uv, w_o, H, head_order="dh"), atol=1e-5, rtol=1e-4):
                raise Mismatch(f"{what}: the heads' rows of w_uv are split the wrong way: rows h*D to h*D + D - 1 "
                               "belong to head h (view it as (H, D, d_c))")
            if torch.allclose(g, _merged(w_uv, w_o, H, head_order="hcd"), atol=1e-5, rtol=1e-4):
                raise Mismatch(f"{what}: w_uv was reshaped as (H, d_c, D), which reads its numbers in the wrong order: "
                               "it is (H * D, d_c), so view it as (H, D, d_c), or transpose it first")
            if torch.allclose(g, _merged(w_uv, w_o, H, output_order="dh"), atol=1e-5, rtol=1e-4):
                raise Mismatch(f"{what}: W_O's columns are split into heads the wrong way: columns h*D to h*D + D - 1 "
                               "multiply head h's context (view w_o as (E, H, D))")
            if torch.allclose(g, expected.double().view(E, H, Dc).transpose(1, 2).reshape(E, H * Dc), atol=1e-5, rtol=1e-4):
                raise Mismatch(f"{what}: the columns are ordered latent by latent (column c * H + h); the heads' averaged "
                               f"latents stand side by side, head 0's {Dc} first, so head h's block is columns h*d_c to "
                               "h*d_c + d_c - 1")
            blocks = g.view(E, H, Dc)
            if torch.allclose(blocks.flip(1), expected.double().view(E, H, Dc), atol=1e-5, rtol=1e-4):
                raise Mismatch(f"{what}: the heads' blocks are in reverse order: head 0's block comes first")
        expect_close(got, expected, what=what)  # the dtype policy: float32 of float64 weights passes, half does not
        # The merged matrix must do the job: the same output as W_UV per head, then W_O.
        context_latent = randn(2, 3, H, Dc, generator=generator, dtype=dtype)  # (B, L, H, Dc)
        per_head = torch.einsum("blhc,hdc->blhd", context_latent, w_uv.view(H, D, Dc)).reshape(2, 3, H * D)
        expect(torch.allclose((context_latent.reshape(2, 3, H * Dc) @ got.to(dtype).T).double(),
                              (per_head @ w_o.T).double(), atol=1e-4, rtol=1e-4),
               f"{what}: multiplying the heads' averaged latents by your matrix does not give the layer's output")
    device = other_device()  # the GPU where there is one, else the meta device: new tensors follow the inputs
    E, H, D, Dc = 10, 3, 6, 4
    _call_elsewhere(merge_value_into_output, randn(H * D, Dc, generator=generator).to(device),
                    randn(E, H * D, generator=generator).to(device), H, device=device, shape=(E, H * Dc),
                    what=f"merge_value_into_output with its inputs on the {device.type} device")
    E, H, D, Dc = 5120, 128, 128, 512  # DeepSeek-V2
    return (f"the merged matrix maps the heads' averaged latents straight to the output, in one product instead of two. "
            f"That saves no work: at DeepSeek-V2's sizes it holds {E * H * Dc / 1e6:.0f}M numbers, so a new token costs "
            f"{E * H * Dc / 1e6:.0f}M multiply-adds through it, against {H * D * Dc / 1e6:.1f}M for W_UV head by head "
            f"plus {E * H * D / 1e6:.1f}M for W_O, {(H * D * Dc + E * H * D) / 1e6:.1f}M in all (section 4 counts "
            f"this).")
