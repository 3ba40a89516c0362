"""Checks for the exercises of chapter 12, linear attention and the delta rule.

Each check tries the answer on cases chosen so that the usual mistakes give a wrong result, and
names the mistake when it recognises one; the table of those mistakes is in
tests/test_exercises_ch12.py. They use the shared mechanism of ``attn_course.exercises``: the
package forbidden by every route in exercises 1 and 2, inputs watched for changes in place (by value,
and by their version counter, so that ``beta.clamp_(0, 1)`` or ``gate.clamp_(max=1)`` that keeps the
values is named too), sizes unlike the notebook's (one token, one head, ``D_k != D_v`` and
``D_k == D_v``, keys shorter and longer than 1), float32 and float64 (a result in the other full
precision passes, half precision does not), one case on the notebook's GPU or on PyTorch's meta
device (tensors made without ``device=`` named; where the meta device cannot run an answer because it
reads a value, an input check such as ``assert (beta <= 1).all()``, the same case runs on the CPU under
the shared device watch, which names such a tensor and a result sent through ``.cpu()``), gates small
enough that a product of them underflows even float64, gates of 1e-3, 1e-4 and 1e-30 among larger
ones, and a long run of gates near 1 (a decay cut off after a few tokens named), exact zeros above
the decay matrix's diagonal, and model sizes other than Qwen3-Next's in exercise 3 (numpy integers
accepted).

Which floors on the gates exercise 2 names: a floor ``gate.clamp(min=m)``, or an epsilon added to the
gates, ``log(gate + m)``, is rejected for every m down to 1e-15. It is named as a floor or an epsilon
for a floor below 0.3 (the smallest gate of the first case; a higher one is rejected as values that
differ), for an epsilon near a power of ten from 1e-3 down, and for any m below about 1e-7: there the
values agree within the tolerance, but the entries behind the gate of 1e-30, which must stay below
1e-20, come out about as large as m. Other epsilons are rejected as values that differ. A floor or
epsilon of 1e-16 or less moves no entry by more than 1e-15, and passes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import (Mismatch, call, call_elsewhere, exercise, expect, expect_close, expect_int, expect_number,
               expect_on_device, expect_sequence, expect_tensor, other_device, rng, tolerance)

__all__ = ["check_delta_rule_loop", "check_decay_matrix", "check_decoding_memory"]


# --------------------------------------------------------------------------------------------------
# Another device


def _call_elsewhere(fn, *args, device: torch.device, what: str, cpu_args: tuple):
    """:func:`call_elsewhere`; copying data out to numpy and back is a right answer here, so the meta device does
    not judge it. Where the meta device cannot run the answer (it copies data out, or reads a value: an input check
    such as ``assert (beta <= 1).all()``), it runs on ``cpu_args`` (the same inputs on the CPU) under the shared
    device watch, which names a tensor made without ``device=`` that meets the inputs and a result left on the CPU
    (``.cpu()``, ``.numpy()`` not moved back)."""
    return call_elsewhere(fn, *args, device=device, what=what, made_by="torch.zeros, torch.ones, torch.eye, torch.tensor ...",
                          copy_out_is_a_mistake=False, cpu_args=cpu_args)


def _call_unchanged(fn, inputs: dict, what: str):
    """:func:`call`, and an in-place change of an input named even where it kept the values (``beta.clamp_(0, 1)``
    on betas in (0, 1), ``gate.clamp_(max=1)``): the tensor's version counter moved, as in chapter 03."""
    versions = {name: tensor._version for name, tensor in inputs.items()}
    result = call(fn, *inputs.values())
    for name, tensor in inputs.items():
        if tensor._version != versions[name]:
            raise Mismatch(f"{what}: your function changed its input `{name}` in place (an operation ending in _, "
                           f"such as clamp_, mul_ or log_, or {name} /= ...), even if its values came out the same. "
                           f"That changes the caller's tensor and breaks backward through anything computed from "
                           f"{name} before: leave {name} alone and use the out-of-place operation "
                           f"({name}.clamp(0, 1), not {name}.clamp_(0, 1))")
    return result


def _on_device(got, device: torch.device, what: str) -> torch.Tensor:
    return expect_on_device(got, device, what, dtype="float")


# --------------------------------------------------------------------------------------------------
# Exercise 1: the delta rule, token by token


def _delta_reference(q, k, v, beta, *, read_before=False, additive=False, no_beta=False, flipped=False,
                     beta_on_value=False, papers_read=False, normalise=False, beta_on_both=False,
                     papers_output=False):
    """The delta rule in the chapter's orientation (state (D_k, D_v), o_t = S_t^T q_t), in float64,
    with one of the plausible mistakes switched on."""
    q, k, v, beta = (x.detach().double() for x in (q, k, v, beta))
    if normalise:
        k = F.normalize(k, dim=-1)
    B, H, L, Dk = k.shape
    Dv = v.size(-1)
    S = torch.zeros(B, H, Dk, Dv, dtype=torch.float64)
    outputs = []
    for t in range(L):
        k_t, v_t, q_t = k[:, :, t], v[:, :, t], q[:, :, t]  # (B, H, D_k), (B, H, D_v), (B, H, D_k)
        b_t = torch.ones_like(beta[:, :, t]) if no_beta else beta[:, :, t]  # (B, H)
        if read_before:
            outputs.append((q_t[..., None, :] @ S).squeeze(-2))
        if papers_read:  # S k_t with S read as (D_v, D_k): only possible when D_k == D_v
            recalled = (S @ k_t[..., :, None]).squeeze(-1)
        else:
            recalled = (k_t[..., None, :] @ S).squeeze(-2)  # k_t^T S_{t-1}, (B, H, D_v)
        if additive:
            write = b_t[..., None] * v_t
        elif beta_on_value:
            write = b_t[..., None] * v_t - recalled
        elif beta_on_both:
            write = b_t[..., None] * (v_t - b_t[..., None] * recalled)
        else:
            write = b_t[..., None] * ((recalled - v_t) if flipped else (v_t - recalled))
        S = S + k_t[..., :, None] * write[..., None, :]  # (B, H, D_k, D_v)
        if papers_output:  # S q_t with S read as (D_v, D_k): only possible when D_k == D_v
            outputs.append((S @ q_t[..., :, None]).squeeze(-1))
        elif not read_before:
            outputs.append((q_t[..., None, :] @ S).squeeze(-2))
    return torch.stack(outputs, dim=2), S


_DELTA_MISTAKES = {
    "read_before": "you read the output before writing token t: o_t = S_t^T q_t uses the state *after* the update "
                   "(the token's own pair is already in it, as in causal attention, where query t sees key t)",
    "additive": "you added beta_t k_t v_t^T without subtracting what the state already returns for k_t: that is "
                "linear attention with a writing strength, not the delta rule",
    "no_beta": "you left out beta_t: the correction v_t - S_{t-1}^T k_t is multiplied by each token's beta_t",
    "flipped": "the correction has the wrong sign: the state moves towards v_t, so it adds beta_t k_t (v_t - v_hat_t)^T "
               "with v_hat_t = S_{t-1}^T k_t",
    "beta_on_value": "beta_t multiplies only v_t: it scales the whole correction, beta_t (v_t - S_{t-1}^T k_t)",
    "beta_on_both": "beta_t is applied twice to the recalled value: the correction is beta_t (v_t - S_{t-1}^T k_t)",
    "papers_read": "you recalled S k_t, which reads the state as (D_v, D_k) (the DeltaNet papers' orientation); "
                   "with the state stored as (D_k, D_v), the value stored under k_t is k_t^T S = S^T k_t",
    "papers_output": "you read the output as S_t q_t, which reads the state as (D_v, D_k) (the DeltaNet papers' "
                     "orientation); with the state stored as (D_k, D_v), the output is q_t^T S_t = S_t^T q_t",
    "normalise": "you rescaled the keys (normalised them, or capped their length at 1): the function computes the "
                 "equations for the keys it is given (DeltaNet normalises them before calling it); here the keys have "
                 "length {key_length}",
}


def _delta_inputs(generator, B, H, L, Dk, Dv, dtype, key_length=1.0):
    q = torch.randn(B, H, L, Dk, generator=generator, dtype=torch.float64)
    k = F.normalize(torch.randn(B, H, L, Dk, generator=generator, dtype=torch.float64), dim=-1) * key_length
    v = torch.randn(B, H, L, Dv, generator=generator, dtype=torch.float64)
    # beta in (0.1, 0.9); for keys longer than 1 at most 0.5, so that 1 - beta |k|^2 stays in (0, 1): nothing blows up
    beta = torch.rand(B, H, L, generator=generator, dtype=torch.float64) * (0.8 if key_length <= 1 else 0.4) + 0.1
    return tuple(x.to(dtype) for x in (q, k, v, beta))


@exercise(
    "Exercise 1, the delta rule token by token",
    hint="start from a zero state of shape (B, H, D_k, D_v); for each token recall what the state holds for its key "
         "(the key times the state), move that towards the token's value by beta, write the correction along the key "
         "as an outer product, and read the output from the updated state with the query",
    forbid=("attn_course",),
)
def check_delta_rule_loop(delta_rule_loop) -> str:
    generator = rng(12)
    cases = [  # (B, H, L, D_k, D_v, dtype, key length)
        (1, 1, 5, 3, 3, torch.float64, 1.0),  # D_k == D_v: an orientation mistake runs, and is named
        (2, 2, 6, 4, 3, torch.float64, 1.0),  # D_k != D_v
        (2, 3, 7, 5, 2, torch.float64, 0.7),  # keys shorter than 1: normalising them changes the result
        (2, 2, 4, 4, 3, torch.float64, 1.3),  # keys longer than 1 (beta <= 0.5): capping their length changes it too
        (3, 1, 1, 2, 5, torch.float32, 1.0),  # one token, batch 3
        (1, 2, 9, 6, 4, torch.float32, 1.0),  # float32
    ]
    for B, H, L, Dk, Dv, dtype, key_length in cases:
        q, k, v, beta = _delta_inputs(generator, B, H, L, Dk, Dv, dtype, key_length)
        what = (f"delta_rule_loop(q, k, v, beta) for q, k of shape {(B, H, L, Dk)}, v {(B, H, L, Dv)}, beta {(B, H, L)} "
                f"({str(dtype).replace('torch.', '')}{f', keys of length {key_length}' if key_length != 1.0 else ''})")
        answer = _call_unchanged(delta_rule_loop, dict(q=q, k=k, v=v, beta=beta), what)
        output, state = expect_sequence(answer, what=what, names=("output", "state"))
        output = expect_tensor(output, what=f"the output of {what}", dtype="float")
        state = expect_tensor(state, what=f"the state of {what}", dtype="float")
        if Dk != Dv and tuple(state.shape) == (B, H, Dv, Dk):
            raise Mismatch(f"the state of {what} has shape {(B, H, Dv, Dk)}: this chapter stores it as (D_k, D_v), "
                           f"{(B, H, Dk, Dv)}, rows indexed by key features (the papers' d_v x d_k is its transpose)")
        expect_tensor(output, what=f"the output of {what}", shape=(B, H, L, Dv))
        expect_tensor(state, what=f"the state of {what}", shape=(B, H, Dk, Dv))
        want_output, want_state = _delta_reference(q, k, v, beta)
        got_output, got_state = output.detach().double(), state.detach().double()
        close = lambda a, b: bool(torch.allclose(a, b, atol=1e-5, rtol=1e-4))  # noqa: E731
        if Dk == Dv and close(got_output, want_output) and close(got_state.transpose(-2, -1), want_state) \
                and not close(got_state, want_state):
            raise Mismatch(f"{what}: your outputs are right but your state is transposed: this chapter stores it as "
                           "(D_k, D_v), rows indexed by key features (the papers' d_v x d_k is its transpose)")
        if not (close(got_output, want_output) and close(got_state, want_state)):
            for mistake, message in _DELTA_MISTAKES.items():
                if mistake in ("papers_read", "papers_output") and Dk != Dv:
                    continue
                if mistake == "normalise" and key_length == 1.0:
                    continue
                wrong_output, wrong_state = _delta_reference(q, k, v, beta, **{mistake: True})
                if close(got_output, wrong_output) or (mistake not in ("read_before", "papers_output")
                                                        and close(got_state, wrong_state)):
                    raise Mismatch(f"{what}: {message.replace('{key_length}', str(key_length))}")
        expect_close(output, want_output.to(dtype), what=f"the output of {what}")
        expect_close(state, want_state.to(dtype), what=f"the state of {what}")
    # Another device: the notebook's GPU, or the meta device (a state made without device= is named).
    device = other_device()
    q, k, v, beta = _delta_inputs(generator, 2, 2, 5, 4, 3, torch.float32)
    shown = f"delta_rule_loop(q, k, v, beta) with q, k, v and beta on the {device.type} device"
    result = _call_elsewhere(delta_rule_loop, *(x.to(device) for x in (q, k, v, beta)), device=device, what=shown,
                             cpu_args=(q.clone(), k.clone(), v.clone(), beta.clone()))
    if result is not None:
        output, state = expect_sequence(result, what=shown, names=("output", "state"))
        output = _on_device(output, device, f"the output of {shown}")
        state = _on_device(state, device, f"the state of {shown}")
        expect_tensor(output, what=f"the output of {shown}", shape=(2, 2, 5, 3))
        expect_tensor(state, what=f"the state of {shown}", shape=(2, 2, 4, 3))
        if device.type != "meta":
            want_output, want_state = _delta_reference(q, k, v, beta)
            expect_close(output, want_output.float().to(device), what=f"the output of {shown}")
            expect_close(state, want_state.float().to(device), what=f"the state of {shown}")
    return ("your loop is the delta rule: each token corrects what the state recalls for its key by beta_t, and the "
            "query reads the corrected state.")


# --------------------------------------------------------------------------------------------------
# Exercise 2: the decay matrix of gated linear attention


def _decay_reference(gate: torch.Tensor) -> torch.Tensor:
    """D[..., t, j] = gate[j+1] * ... * gate[t] for j <= t (1 on the diagonal), 0 above; in float64, by
    differences of cumulative sums of logs (no product is ever formed, so nothing underflows)."""
    log_gate = gate.detach().double().log()  # (..., L)
    cumulative = log_gate.cumsum(dim=-1)  # (..., L): log(gate[0] * ... * gate[t])
    L = gate.size(-1)
    lower = torch.ones(L, L, dtype=torch.bool).tril()
    difference = cumulative[..., :, None] - cumulative[..., None, :]  # (..., L, L): log of the product over j+1..t
    return difference.masked_fill(~lower, float("-inf")).exp()


def _decay_mistakes(gate: torch.Tensor) -> dict:
    """Plausible wrong matrices, each computed safely in float64, with what is wrong about it."""
    g = gate.detach().double()
    right = _decay_reference(g)
    L = g.size(-1)
    lower = torch.ones(L, L, dtype=torch.bool).tril()
    strictly_upper = ~lower
    cumulative = g.log().cumsum(dim=-1)
    return {
        "the diagonal must be 1: the product runs over the gates *after* key j (j+1 .. t), because key j is written "
        "after the state was decayed by gate j; your matrix includes gate j (D[t, t] = gate[t])":
            right * g[..., None, :],
        "your matrix includes one gate too few: D[t, j] multiplies the gates j+1 .. t, so that D[t, t-1] = gate[t] "
        "(you stopped at gate t-1)":
            right / g[..., :, None] * torch.eye(L, dtype=torch.float64).logical_not() + torch.eye(L, dtype=torch.float64),
        "these are the products from the start of the sequence (gate[0] ... gate[t]) in every column: D[t, j] is the "
        "product from j+1 to t only, the decay since key j was written":
            cumulative.exp()[..., :, None].expand(*g.shape, L).masked_fill(strictly_upper, 0.0),
        "your matrix is transposed: row t belongs to query t and column j to key j, with D[t, j] for j <= t below "
        "the diagonal":
            right.transpose(-2, -1),
        "the entries above the diagonal must be 0 (query t sees no key after it); yours hold the inverse products":
            (cumulative[..., :, None] - cumulative[..., None, :]).exp(),
        "the entries above the diagonal must be 0 (query t sees no key after it)":
            right + strictly_upper.to(torch.float64),
    }


def _floor_of(gate: torch.Tensor, got64: torch.Tensor, *, atol: float, rtol: float) -> float | None:
    """The floor m when ``got64`` is the decay matrix of ``gate.clamp(min=m)`` with m above the smallest gate (read
    off D[t, t-1] = gate[t] where the gate is smallest), else None."""
    g = gate.detach().double()
    if g.size(-1) < 2:
        return None
    gates = g[..., 1:].reshape(-1)  # gate[t] for t >= 1
    below = got64.diagonal(offset=-1, dim1=-2, dim2=-1).reshape(-1)  # D[t, t-1], which should be gate[t]
    smallest = int(gates.argmin())
    floor = float(below[smallest])
    if not (math.isfinite(floor) and floor > 2 * float(gates[smallest]) + atol):
        return None
    floored = _decay_reference(g.clamp(min=floor))
    return floor if bool(torch.allclose(got64, floored, atol=atol, rtol=rtol)) else None


@exercise(
    "Exercise 2, the decay matrix of gated linear attention",
    hint="unroll the recurrence: key j reaches query t multiplied by every gate after it, up to and including gate t "
         "(none on the diagonal); a product of many small gates underflows, so work with sums of logarithms and "
         "subtract, and put zeros above the diagonal",
    forbid=("attn_course",),
)
def check_decay_matrix(decay_matrix) -> str:
    generator = rng(13)
    cases = [  # (shape of gate, dtype, what makes it hard)
        ((2, 2, 6), torch.float64, "gates in (0.3, 1)"),
        ((5,), torch.float32, "a single sequence, gates in (0.3, 1)"),
        ((1, 1, 1), torch.float32, "one token"),
        ((3, 1, 4), torch.float64, "gates of exactly 1 (no decay)"),
        ((1, 1, 256), torch.float32, "256 tokens with gates of about 0.05: their product underflows even float64"),
        ((1, 64), torch.float32, "64 tokens with gates in (0.95, 1): keys far back still count"),
        ((2, 12), torch.float64, "gates of 1e-3, 1e-4 and 1e-30 among gates in (0.3, 1)"),
        ((1, 3, 10), torch.float32, "gates of 1e-3, 1e-4 and 1e-30 among gates in (0.3, 1)"),
    ]
    for shape, dtype, note in cases:
        if "exactly 1" in note:
            gate = torch.ones(*shape, dtype=dtype)
        elif "1e-30" in note:  # a gate may be as small as it likes: a floor on the gates (clamp(min=...)) is named
            gate = 0.3 + 0.7 * torch.rand(*shape, generator=generator, dtype=torch.float64)
            gate[..., 2], gate[..., 5], gate[..., 8] = 1e-3, 1e-4, 1e-30
            gate = gate.to(dtype)
        elif "0.95" in note:
            gate = (0.95 + 0.05 * torch.rand(*shape, generator=generator, dtype=torch.float64)).to(dtype)
        elif "0.05" in note:
            gate = (0.04 + 0.02 * torch.rand(*shape, generator=generator, dtype=torch.float64)).to(dtype)
        else:
            gate = (0.3 + 0.7 * torch.rand(*shape, generator=generator, dtype=torch.float64)).to(dtype)
        L = shape[-1]
        what = f"decay_matrix(gate) for gate of shape {shape} ({str(dtype).replace('torch.', '')}, {note})"
        got = expect_tensor(_call_unchanged(decay_matrix, dict(gate=gate), what), what=what, shape=(*shape, L),
                            dtype="float")
        want = _decay_reference(gate)
        got64 = got.detach().double()
        if bool(torch.isnan(got64).any()) or bool(torch.isinf(got64).any()):
            bad = "NaN" if bool(torch.isnan(got64).any()) else "inf"
            on_or_below = torch.ones(L, L, dtype=torch.bool).tril()  # (L, L): key j <= query t
            if not bool((~torch.isfinite(got64) & on_or_below).any()):  # finite wherever a key counts
                raise Mismatch(f"{what}: your matrix contains {bad} above the diagonal only. There the differences "
                               "of the cumulative logs are positive, and their exponential overflows to inf (256 gates "
                               "of 0.05 give about exp(+760)) before your mask is applied; a mask applied by "
                               "multiplication then gives inf * 0 = NaN. Make the entries above the diagonal 0 "
                               "without multiplying them: fill the logs with -inf before exponentiating, or select "
                               "with torch.where")
            if "1e-30" in note:  # the failing case is the gate of 1e-30, not a long run of small gates
                raise Mismatch(f"{what}: your matrix contains {bad} on or below the diagonal, in the case with a gate "
                               "of 1e-30. Its logarithm is finite (about -69.1), but a logarithm computed another way "
                               "may not be: log1p(gate - 1) rounds 1e-30 - 1 to -1 and gives -inf, and -inf - (-inf) "
                               "is NaN. Take the logarithm of the gates as they are (gate.log()), add the logarithms (a "
                               "cumulative sum) and exponentiate their differences, or multiply the gates of each range")
            raise Mismatch(f"{what}: your matrix contains {bad}. A running product of 256 gates of 0.05 is about "
                           "1e-333, which underflows to 0 even in float64, and a ratio of two such products is 0 / 0; "
                           "add logarithms (a cumulative sum) and exponentiate their differences, or multiply the gates "
                           "of each range")
        if not bool(torch.allclose(got64, want, atol=1e-6, rtol=1e-5)):
            for mistake, wrong in _decay_mistakes(gate).items():
                if bool(torch.allclose(got64, wrong, atol=1e-6, rtol=1e-5)):
                    raise Mismatch(f"{what}: {mistake}")
            distance = (torch.arange(L)[:, None] - torch.arange(L)[None, :]).expand_as(got64)  # (..., L, L): t - j
            cut = (got64 == 0) & (want > 1e-3) & (distance > 0)  # keys that still count, set to 0
            if bool(cut.any()):
                nearest = int(distance[cut].min())
                if bool((got64[distance >= nearest] == 0).all()):  # a band: every key that far back is dropped
                    raise Mismatch(f"{what}: your matrix is 0 for keys {nearest} or more tokens before the query, where "
                                   f"the gates' product is still as large as {float(want[cut].max()):.2f}: the decay "
                                   "multiplies every gate between key and query, and no key is ever cut off")
                raise Mismatch(f"{what}: your matrix is 0 at {int(cut.sum())} places where the decay is as large as "
                               f"{float(want[cut].max()):.2f}. A running product of many small gates underflows to 0 "
                               "(256 gates of 0.05 multiply to about 1e-333, below float64's smallest number), and a "
                               "ratio of two such products is 0 / 0; add logarithms (a cumulative sum) and exponentiate "
                               "their differences, or multiply the gates of each range")
        above = got64.triu(1)  # (..., L, L): query t, keys j > t
        if bool((above != 0).any()):
            raise Mismatch(f"{what}: the entries above the diagonal must be exactly 0 (query t sees no key after it); "
                           f"yours hold values up to {float(above.abs().max()):.1e}, so query t still reads later "
                           "keys a little: fill them with -inf before exponentiating, or with 0 after")
        try:
            expect_close(got, want.to(dtype), what=what)
        except Mismatch:
            atol, rtol = tolerance(got.dtype, dtype)
            if got.dtype in (torch.float16, torch.bfloat16) or bool(torch.allclose(got64, want, atol=atol, rtol=rtol)):
                raise
            for exponent in range(3, 13):  # a "safety" epsilon added to the gates before the logarithm
                shifted = _decay_reference(gate.double() + 10.0 ** -exponent)
                if bool(torch.allclose(got64, shifted, atol=atol, rtol=rtol)):
                    raise Mismatch(f"{what}: your matrix is that of the gates plus 1e-{exponent}: the gates lie in "
                                   "(0, 1], so their logarithm is finite without an epsilon, and one shifts every "
                                   "product (by more, the more gates it multiplies); take the log of the gates as "
                                   "they are") from None
            floor = _floor_of(gate, got64, atol=atol, rtol=rtol)
            if floor is not None:
                raise Mismatch(f"{what}: your matrix is that of the gates floored at {floor:.3g} (as with "
                               f"gate.clamp(min={floor:.3g})): the gates lie in (0, 1], and a gate of 1e-3 or 1e-30 is "
                               "a real one (it erases nearly all the state before it); its logarithm is finite, so "
                               "take the log of the gates as they are, without a floor") from None
            raise
        # A tiny floor or epsilon (gate.clamp(min=1e-8), log(gate + 1e-10)) moves no entry by more than the tolerance,
        # but the entries that should be below 1e-20 (behind a gate of 1e-30) come out as large as the floor.
        tiny = want < 1e-20
        if bool(tiny.any()) and bool((got64[tiny] > 1e-15).any()):
            largest = float(got64[tiny].max())
            floor = _floor_of(gate, got64, atol=1e-30, rtol=1e-3)  # D[t, t-1] where the gate is smallest: the floor
            shifted = None
            for exponent in range(3, 16):  # or an epsilon added to every gate (the same, here, up to 1e-3 relatively)
                if bool(torch.allclose(got64, _decay_reference(gate.double() + 10.0 ** -exponent), atol=1e-30, rtol=1e-3)):
                    shifted = 10.0 ** -exponent
                    break
            if floor is not None or shifted is not None:
                m = floor if floor is not None else shifted
                raise Mismatch(f"{what}: your matrix is that of the gates floored at {m:.3g}, or with {m:.3g} added to "
                               f"them (as with gate.clamp(min={m:.3g}) or log(gate + {m:.3g})): the gates lie in (0, 1], "
                               "and a gate of 1e-30 is a real one (it erases nearly all the state before it); its "
                               f"logarithm is finite, so take the log of the gates as they are. Your entries behind it "
                               f"are as large as {largest:.1e}, where they should be below 1e-20")
            raise Mismatch(f"{what}: entries that should be below 1e-20 (keys behind a gate of 1e-30, or behind "
                           f"hundreds of gates of 0.05) are as large as {largest:.1e} in your matrix: do not floor the "
                           "gates or add an epsilon to them; their logarithm is finite as they are")
    # The matrix does what it is for: ((Q K^T) * D) V equals the gated recurrence S_t = a_t S_{t-1} + k_t v_t^T.
    q, k, v = (torch.randn(1, 2, 7, n, generator=generator, dtype=torch.float64) for n in (3, 3, 4))
    gate = 0.3 + 0.7 * torch.rand(1, 2, 7, generator=generator, dtype=torch.float64)
    S = torch.zeros(1, 2, 3, 4, dtype=torch.float64)
    recurrent = []
    for t in range(7):
        S = gate[:, :, t, None, None] * S + k[:, :, t, :, None] * v[:, :, t, None, :]  # (1, 2, D_k, D_v)
        recurrent.append((q[:, :, t, None, :] @ S).squeeze(-2))
    what = "decay_matrix(gate) for gate of shape (1, 2, 7) (float64)"
    decay = expect_tensor(call(decay_matrix, gate), what=what, shape=(1, 2, 7, 7), dtype="float")
    # in the answer's dtype: a float32 matrix of float64 gates is compared with float32's tolerance
    parallel = ((q @ k.transpose(-2, -1)).to(decay.dtype) * decay.detach()) @ v.to(decay.dtype)  # (1, 2, 7, 4)
    expect_close(parallel, torch.stack(recurrent, dim=2), what="((Q K^T) * decay_matrix(gate)) V against the recurrence "
                 "S_t = gate_t S_{t-1} + k_t v_t^T")
    # Another device: the notebook's GPU, or the meta device (a mask made without device= is named).
    device = other_device()
    here = 0.3 + 0.7 * torch.rand(2, 5, generator=generator)
    gate = here.to(device)
    shown = f"decay_matrix(gate) with gate of shape (2, 5) on the {device.type} device"
    result = _call_elsewhere(decay_matrix, gate, device=device, what=shown, cpu_args=(here.clone(),))
    if result is not None:
        got = _on_device(result, device, shown)
        expect_tensor(got, what=shown, shape=(2, 5, 5))
        if device.type != "meta":
            expect_close(got, _decay_reference(gate.cpu()).float().to(device), what=shown)
    return ("with your decay matrix, ((Q K^T) * D) V equals the gated recurrence token by token, also where the "
            "gates' running product underflows even float64.")


# --------------------------------------------------------------------------------------------------
# Exercise 3: the memory a hybrid model keeps while decoding

QWEN3_NEXT = dict(  # Qwen3-Next-80B-A3B: the field names of Hugging Face's Qwen3NextConfig (and bytes_per_number)
    num_hidden_layers=48, full_attention_interval=4,  # layers 4, 8, ..., 48 are gated softmax attention: 12 x (3 + 1)
    num_key_value_heads=2, head_dim=256,  # gated attention: 16 query heads, 2 key/value heads of width 256
    linear_num_value_heads=32, linear_num_key_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,  # Gated DeltaNet
    bytes_per_number=2,  # bfloat16
)


def _memory_parts(config: dict, context_len: int) -> dict:
    softmax_layers = config["num_hidden_layers"] // config["full_attention_interval"]
    linear_layers = config["num_hidden_layers"] - softmax_layers
    b = config["bytes_per_number"]
    per_cache_layer = 2 * config["num_key_value_heads"] * config["head_dim"] * context_len * b  # keys and values
    per_state_layer = config["linear_num_value_heads"] * config["linear_key_head_dim"] * config["linear_value_head_dim"] * b
    return dict(softmax_layers=softmax_layers, linear_layers=linear_layers, per_cache_layer=per_cache_layer,
                per_state_layer=per_state_layer)


def reference_decoding_memory(config: dict, context_len: int) -> int:
    """Bytes one sequence keeps while decoding after ``context_len`` tokens: the softmax layers' keys and
    values and the linear layers' states (the short convolutions' few tokens left out)."""
    p = _memory_parts(config, context_len)
    return p["softmax_layers"] * p["per_cache_layer"] + p["linear_layers"] * p["per_state_layer"]


_MEMORY_CASES = [  # (config changes, context_len); Qwen3-Next's own sizes last, so that a first mismatch is a small config's
    (dict(num_hidden_layers=10, full_attention_interval=4, num_key_value_heads=4, head_dim=64, linear_num_value_heads=8,
          linear_num_key_heads=4, linear_key_head_dim=32, linear_value_head_dim=48, bytes_per_number=4),
     1_000),  # 10 layers: 2 softmax; D_k != D_v, and no two of the head-count mistakes coincide
    (dict(num_hidden_layers=6, full_attention_interval=1, bytes_per_number=4), 512),  # every layer softmax
    (dict(num_hidden_layers=8, full_attention_interval=9), 100_000),  # no softmax layer at all
    (dict(num_hidden_layers=24, full_attention_interval=3, linear_num_value_heads=8, linear_num_key_heads=8), 3_000),  # 2:1
    ({}, 0),  # before the first token: only the states
    ({}, 4_096),
    ({}, 262_144),  # Qwen3-Next at its native context
]


def _memory_mistakes(config: dict, context_len: int) -> dict:
    p = _memory_parts(config, context_len)
    right = reference_decoding_memory(config, context_len)
    cache = p["softmax_layers"] * p["per_cache_layer"]
    state = p["linear_layers"] * p["per_state_layer"]
    num_hidden_layers, every = config["num_hidden_layers"], config["full_attention_interval"]
    first_layer_softmax = math.ceil(num_hidden_layers / every)  # layers 1, 1 + every, ...: one too many when it does not divide
    mistakes = {
        "the cache holds keys *and* values: 2 numbers per key/value head, head width and token": cache // 2 + state,
        "you counted numbers, not bytes: multiply by bytes_per_number": right // config["bytes_per_number"],
        "the state does not grow with the context: it is D_k x D_v numbers per value head whatever the length":
            cache + state * context_len,
        "only every full_attention_interval-th layer keeps a cache; the other layers keep a state":
            num_hidden_layers * p["per_cache_layer"] + state,
        "only every full_attention_interval-th layer keeps a cache, and the other layers keep a state of their own "
        "(you counted a cache in every layer and no state)": num_hidden_layers * p["per_cache_layer"],
        "the layers with a cache keep no state: the linear layers are the other num_hidden_layers - num_hidden_layers // "
        "full_attention_interval": cache + num_hidden_layers * p["per_state_layer"],
        "each value head keeps its own D_k x D_v state (the key heads are shared by pairs of value heads, like "
        "grouped-query attention in reverse); you counted the key heads":
            cache + p["linear_layers"] * config["linear_num_key_heads"] * config["linear_key_head_dim"]
            * config["linear_value_head_dim"] * config["bytes_per_number"],
        "a state is linear_key_head_dim x linear_value_head_dim numbers (D_k x D_v: a key's width by a value's); "
        "you used the key width twice":
            cache + p["linear_layers"] * config["linear_num_value_heads"] * config["linear_key_head_dim"] ** 2
            * config["bytes_per_number"],
        "the softmax layers are the full_attention_interval-th, 2 full_attention_interval-th, ... (layers 4, 8, ..., 48 of "
        "Qwen3-Next): num_hidden_layers // full_attention_interval of them, not one more":
            first_layer_softmax * p["per_cache_layer"] + (num_hidden_layers - first_layer_softmax) * p["per_state_layer"],
    }
    return {message: value for message, value in mistakes.items() if value != right}


@exercise(
    "Exercise 3, the memory a hybrid model keeps while decoding",
    hint="count the softmax layers (every full_attention_interval-th) and the others; a softmax layer keeps keys and values "
         "for every token so far, a linear layer keeps one state per value head whose size does not depend on the "
         "number of tokens; multiply by the bytes per number",
)
def check_decoding_memory(decoding_memory) -> str:
    for changes, context_len in _MEMORY_CASES:
        config = dict(QWEN3_NEXT, **changes)
        shown = ", ".join(f"{key}={value}" for key, value in changes.items()) or "Qwen3-Next's sizes"
        what = f"decoding_memory(config, context_len={context_len:,}) with {shown}"
        answer = call(decoding_memory, dict(config), context_len)
        expected = reference_decoding_memory(config, context_len)
        number = expect_number(answer, what=what)
        for unit, size in (("KiB", 2**10), ("MiB", 2**20), ("GiB", 2**30)):
            if expected and math.isclose(number, expected / size, rel_tol=1e-9):
                raise Mismatch(f"{what} = {number:,}: that is the answer in {unit}; return it in bytes")
        got = expect_int(answer, what=what)
        if got != expected:
            for message, wrong in _memory_mistakes(config, context_len).items():
                if got == wrong:
                    raise Mismatch(f"{what} = {got:,}: {message}")
        if not changes:  # Qwen3-Next's own sizes: the expected total is what the exercise asks to predict, not shown
            expect(got == expected, f"{what}: your {got:,} bytes are not the right total (not shown here: the exercise "
                   "asks you to predict it); the smaller configs before it passed, so look at what only Qwen3-Next's "
                   "sizes bring in")
        expect(got == expected, f"{what}: expected {expected:,} bytes, got {got:,}")
    # The prediction's numbers are not printed (the solution cell's output would show them before the reader
    # predicts): the collapsed answer after the exercise has them.
    return ("right: the softmax layers' keys and values grow with the context, the Gated DeltaNet layers' states do not. "
            "Compare your prediction with the collapsed answer below.")
