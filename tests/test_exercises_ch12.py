"""The exercise checks of chapter 12: for each exercise, right answers written several ways and a table of the
wrong answers students plausibly write, each rejected with a message that names the mistake."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attn_course as ac
from attn_course.exercises.ch12 import QWEN3_NEXT, check_decay_matrix, check_decoding_memory, check_delta_rule_loop

CHECKS = [check_delta_rule_loop, check_decay_matrix, check_decoding_memory]


def scaffold(*args):
    ...  # the cell as handed out


def crashes(*args):
    raise RuntimeError("shapes do not match")


# --- Exercise 1: the delta rule, token by token ---------------------------------------------------

def delta_loop(q, k, v, beta, *, mistake=None):
    B, H, L, D_k = k.shape
    if mistake == "normalise":
        k = F.normalize(k, dim=-1)
    state = k.new_zeros(B, H, D_k, v.size(-1))
    outputs = []
    for t in range(L):
        k_t, v_t, q_t = k[:, :, t], v[:, :, t], q[:, :, t]
        b_t = beta[:, :, t, None]
        if mistake == "no beta":
            b_t = torch.ones_like(b_t)
        if mistake == "read before":
            outputs.append((q_t[..., None, :] @ state).squeeze(-2))
        if mistake == "S k":
            recalled = (state @ k_t[..., :, None]).squeeze(-1)
        else:
            recalled = (k_t[..., None, :] @ state).squeeze(-2)
        if mistake == "additive":
            write = b_t * v_t
        elif mistake == "sign":
            write = b_t * (recalled - v_t)
        elif mistake == "beta on v":
            write = b_t * v_t - recalled
        elif mistake == "beta twice":
            write = b_t * (v_t - b_t * recalled)
        else:
            write = b_t * (v_t - recalled)
        state = state + k_t[..., :, None] * write[..., None, :]
        if mistake == "S q":
            outputs.append((state @ q_t[..., :, None]).squeeze(-1))
        elif mistake != "read before":
            outputs.append((q_t[..., None, :] @ state).squeeze(-2))
    output = torch.stack(outputs, dim=2)
    if mistake == "transposed state":
        state = state.transpose(-2, -1)
    if mistake == "float64 inputs only":
        output = output.double()
    return output, state


def delta_householder(q, k, v, beta):
    """Another right answer: the (I - beta k k^T) S + beta k v^T form, with einsum."""
    B, H, L, D_k = k.shape
    state = torch.zeros(B, H, D_k, v.size(-1), dtype=q.dtype, device=q.device)
    eye = torch.eye(D_k, dtype=q.dtype, device=q.device)
    outputs = []
    for t in range(L):
        k_t = k[:, :, t]
        b = beta[:, :, t][..., None, None]
        projector = eye - b * torch.einsum("bhi,bhj->bhij", k_t, k_t)
        state = projector @ state + b * torch.einsum("bhi,bhj->bhij", k_t, v[:, :, t])
        outputs.append(torch.einsum("bhi,bhij->bhj", q[:, :, t], state))
    return torch.stack(outputs, dim=2), state


def delta_as_list(q, k, v, beta):
    out, state = delta_loop(q, k, v, beta)
    return [out, state]


def delta_package(q, k, v, beta):
    return ac.delta_rule(q, k, v, beta, return_state=True)


def delta_package_step(q, k, v, beta):
    state, outputs = None, []
    for t in range(q.size(2)):
        o, state = ac.delta_rule_step(q[:, :, t], k[:, :, t], v[:, :, t], beta[:, :, t], state)
        outputs.append(o)
    return torch.stack(outputs, dim=2), state


def delta_in_place(q, k, v, beta):
    k.div_(k.norm(dim=-1, keepdim=True))  # normalises the caller's keys
    return delta_loop(q, k, v, beta)


def delta_only_output(q, k, v, beta):
    return delta_loop(q, k, v, beta)[0]


def delta_capped_keys(q, k, v, beta):  # "safety" after reading section 4's blow-up: keys no longer than 1
    return delta_loop(q, k / k.norm(dim=-1, keepdim=True).clamp_min(1.0), v, beta)


def delta_state_on_cpu(q, k, v, beta):  # the state made without device=: fails on a GPU
    B, H, L, D_k = k.shape
    state = torch.zeros(B, H, D_k, v.size(-1), dtype=q.dtype)
    outputs = []
    for t in range(L):
        k_t = k[:, :, t]
        recalled = (k_t[..., None, :] @ state).squeeze(-2)
        state = state + k_t[..., :, None] * (beta[:, :, t, None] * (v[:, :, t] - recalled))[..., None, :]
        outputs.append((q[:, :, t, None, :] @ state).squeeze(-2))
    return torch.stack(outputs, dim=2), state


def delta_in_float64(q, k, v, beta):  # a float64 result of float32 inputs: the course's dtype policy lets it pass
    return delta_loop(q.double(), k.double(), v.double(), beta.double())


def delta_in_float32(q, k, v, beta):  # a float32 result of float64 inputs: passes with float32's tolerance
    return delta_loop(q.float(), k.float(), v.float(), beta.float())


def delta_check_reference(q, k, v, beta):
    from attn_course.exercises import ch12

    output, state = ch12._delta_reference(q, k, v, beta)
    return output.to(q.dtype), state.to(q.dtype)


def delta_float16(q, k, v, beta):
    out, state = delta_loop(q.half().float(), k.half().float(), v.half().float(), beta.half().float())
    return out.to(q.dtype), state.to(q.dtype)


# --- Exercise 2: the decay matrix --------------------------------------------------------------------

def decay_logs(gate):
    L = gate.size(-1)
    log_cumulative = gate.log().cumsum(-1)
    difference = log_cumulative[..., :, None] - log_cumulative[..., None, :]
    return difference.masked_fill(~torch.ones(L, L, dtype=torch.bool, device=gate.device).tril(), float("-inf")).exp()


def decay_exp_then_tril(gate):
    """Another right answer: exponentiate everything, then keep the lower triangle (the overflowed entries above the
    diagonal are dropped)."""
    log_cumulative = gate.log().cumsum(-1)
    return (log_cumulative[..., :, None] - log_cumulative[..., None, :]).exp().tril()


def decay_numpy(gate):
    """Another right answer, in numpy."""
    log_cumulative = np.cumsum(np.log(gate.detach().cpu().numpy()), axis=-1)
    difference = log_cumulative[..., :, None] - log_cumulative[..., None, :]
    with np.errstate(over="ignore"):
        out = np.tril(np.exp(difference))
    return torch.from_numpy(out).to(gate.device)


def decay_in_float32(gate):  # a float32 result of float64 gates: the course's dtype policy lets it pass
    return decay_logs(gate.float())


def decay_in_float64(gate):  # a float64 result of float32 gates
    return decay_logs(gate.double())


def decay_finite_fill(gate):  # -20 instead of -inf above the diagonal: exp(-20) = 2e-9, not 0
    L = gate.size(-1)
    log_cumulative = gate.log().cumsum(-1)
    difference = log_cumulative[..., :, None] - log_cumulative[..., None, :]
    return difference.masked_fill(~torch.ones(L, L, dtype=torch.bool, device=gate.device).tril(), -20.0).exp()


def decay_tiny_above(gate):
    L = gate.size(-1)
    return decay_logs(gate).masked_fill(torch.ones(L, L, dtype=torch.bool, device=gate.device).triu(1), 1e-8)


def decay_band(gate, width=16):  # keys more than `width` tokens back cut off
    L = gate.size(-1)
    i = torch.arange(L, device=gate.device)
    return decay_logs(gate) * ((i[:, None] - i[None, :]) < width)


def decay_mask_on_cpu(gate):  # the mask made without device=
    L = gate.size(-1)
    log_cumulative = gate.log().cumsum(-1)
    difference = log_cumulative[..., :, None] - log_cumulative[..., None, :]
    return difference.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf")).exp()


def decay_check_reference(gate):
    from attn_course.exercises import ch12

    return ch12._decay_reference(gate).to(gate.dtype)


def decay_loops(gate):
    """Another right answer: a product over each range (never a ratio), written with loops."""
    L = gate.size(-1)
    out = torch.zeros(*gate.shape, L, dtype=gate.dtype, device=gate.device)
    for t in range(L):
        for j in range(t + 1):
            out[..., t, j] = gate[..., j + 1:t + 1].prod(dim=-1)
    return out


def decay_segsum(gate):
    """Another right answer: Mamba-2's segment sum, written with a masked cumulative sum of logs."""
    L = gate.size(-1)
    log_gate = gate.log()[..., None, :].expand(*gate.shape[:-1], L, L)  # (..., t, i)
    strictly_lower = torch.ones(L, L, dtype=torch.bool, device=gate.device).tril(-1)
    segment = log_gate.masked_fill(~strictly_lower.T, 0.0)  # keep i > j as the columns of row j
    sums = segment.cumsum(dim=-1)  # (..., j, t): sum over i in (j, t]
    out = sums.transpose(-2, -1).exp()
    return out.masked_fill(~torch.ones(L, L, dtype=torch.bool, device=gate.device).tril(), 0.0)


def decay_cumprod_ratio(gate):  # underflows: 0 / 0
    cumulative = gate.cumprod(-1)
    L = gate.size(-1)
    return (cumulative[..., :, None] / cumulative[..., None, :]) * torch.ones(L, L).tril()


def decay_cumprod_ratio_float64(gate):  # finite for 80 gates of 0.05, 0 / 0 for 256
    return decay_cumprod_ratio(gate.double()).to(gate.dtype)


def decay_with_own_gate(gate):
    return decay_logs(gate) * gate[..., None, :]


def decay_one_too_few(gate):
    L = gate.size(-1)
    eye = torch.eye(L, dtype=gate.dtype)
    return decay_logs(gate) / gate[..., :, None] * (1 - eye) + eye


def decay_from_start(gate):
    L = gate.size(-1)
    return gate.cumprod(-1)[..., :, None].expand(*gate.shape, L) * torch.ones(L, L, dtype=gate.dtype).tril()


def decay_transposed(gate):
    return decay_logs(gate).transpose(-2, -1)


def decay_no_mask(gate):
    log_cumulative = gate.log().cumsum(-1)
    return (log_cumulative[..., :, None] - log_cumulative[..., None, :]).exp()


def decay_ones_above(gate):
    L = gate.size(-1)
    return decay_logs(gate) + torch.ones(L, L, dtype=gate.dtype).triu(1)


def decay_float16(gate):
    return decay_logs(gate.double()).half().to(gate.dtype)


def decay_in_place(gate):
    gate.log_()
    log_cumulative = gate.cumsum(-1)
    L = gate.size(-1)
    difference = log_cumulative[..., :, None] - log_cumulative[..., None, :]
    return difference.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf")).exp()


def decay_mask_by_multiplication(gate):  # exp overflows to inf above the diagonal, and inf * 0 = NaN
    L = gate.size(-1)
    log_cumulative = gate.log().cumsum(-1)
    lower = torch.ones(L, L, dtype=gate.dtype, device=gate.device).tril()
    return (log_cumulative[..., :, None] - log_cumulative[..., None, :]).exp() * lower


def decay_log1p(gate):  # the seventh review's: log1p(gate - 1) rounds 1e-30 - 1 to -1, so log of 1e-30 is -inf
    L = gate.size(-1)
    log_cumulative = torch.log1p(gate - 1).cumsum(-1)
    causal = torch.ones(L, L, dtype=torch.bool, device=gate.device).tril()
    return (log_cumulative[..., :, None] - log_cumulative[..., None, :]).masked_fill(~causal, float("-inf")).exp()


def decay_epsilon(gate, epsilon=1e-6):  # a "safety" epsilon inside the logarithm
    return decay_logs(gate + epsilon)


def decay_floored(gate, floor=0.03):  # the fourth review's: a floor on the gates "to keep the log finite"
    return decay_logs(gate.clamp(min=floor))


def decay_package(gate):
    L = gate.size(-1)
    shape = gate.shape[:-1]
    q = torch.eye(L, dtype=gate.dtype).expand(*shape, L, L).reshape(-1, 1, L, L)
    v = torch.eye(L, dtype=gate.dtype).expand(*shape, L, L).reshape(-1, 1, L, L)
    out = ac.linear_attention(q, q, v, feature_map="identity", normalize=False)
    return out.reshape(*shape, L, L)


# --- Exercise 3: decoding memory ---------------------------------------------------------------------

def memory(config, context_len, *, mistake=None):
    every = config["full_attention_interval"]
    softmax_layers = config["num_hidden_layers"] // every
    if mistake == "ceil":
        softmax_layers = math.ceil(config["num_hidden_layers"] / every)
    linear_layers = config["num_hidden_layers"] - softmax_layers
    if mistake == "all layers linear":
        linear_layers = config["num_hidden_layers"]
    if mistake == "all layers cache":
        softmax_layers = config["num_hidden_layers"]
    cache = (1 if mistake == "no values" else 2) * config["num_key_value_heads"] * config["head_dim"] * context_len
    heads = config["linear_num_key_heads"] if mistake == "key heads" else config["linear_num_value_heads"]
    state = heads * config["linear_key_head_dim"] * config["linear_value_head_dim"]
    if mistake == "D_k x D_k":
        state = heads * config["linear_key_head_dim"] ** 2
    if mistake == "state grows":
        state *= context_len
    total = (softmax_layers * cache + linear_layers * state) * config["bytes_per_number"]
    if mistake == "MiB":
        return total / 2**20
    if mistake == "no bytes":
        return total // config["bytes_per_number"]
    if mistake == "float":
        return float(total)
    return total


def memory_numpy(config, context_len):
    layers = np.arange(1, config["num_hidden_layers"] + 1)
    softmax = layers % config["full_attention_interval"] == 0
    per_cache = np.int64(2 * config["num_key_value_heads"] * config["head_dim"] * context_len)
    per_state = np.int64(config["linear_num_value_heads"] * config["linear_key_head_dim"] * config["linear_value_head_dim"])
    return np.where(softmax, per_cache, per_state).sum() * config["bytes_per_number"]


def memory_tensor(config, context_len):
    return torch.tensor(memory(config, context_len))


def memory_answer_key(config, context_len):  # the check's own reference
    from attn_course.exercises import ch12

    return ch12.reference_decoding_memory(config, context_len)


# --- answers that read a value (an input check), so that the meta device cannot run them: the device case runs them
# on the CPU under the shared device watch (sixth review) -----------------------------------------------------------

def delta_validating(q, k, v, beta):  # right: checks beta's range, makes the state on the inputs' device
    assert ((beta >= 0) & (beta <= 1)).all(), "beta must lie in [0, 1]"
    return delta_loop(q, k, v, beta)


def delta_validating_state_on_cpu(q, k, v, beta):  # the state made without device=, behind a check that reads values
    assert ((beta >= 0) & (beta <= 1)).all(), "beta must lie in [0, 1]"
    return delta_state_on_cpu(q, k, v, beta)


def delta_results_on_cpu(q, k, v, beta):  # results copied to the CPU and left there
    output, state = delta_loop(q, k, v, beta)
    return output.cpu(), state.cpu()


def delta_clamps_beta_in_place(q, k, v, beta):  # "safety": the values stay the same, the caller's tensor is written
    beta.clamp_(0, 1)
    return delta_loop(q, k, v, beta)


def decay_validating(gate):  # right: checks the gates' range, makes the mask on the inputs' device
    if (gate <= 0).any() or (gate > 1).any():
        raise ValueError("gates must lie in (0, 1]")
    return decay_logs(gate)


def decay_validating_mask_on_cpu(gate):  # the mask made without device=, behind a check that reads values
    if (gate <= 0).any() or (gate > 1).any():
        raise ValueError("gates must lie in (0, 1]")
    return decay_mask_on_cpu(gate)


def decay_result_on_cpu(gate):
    return decay_logs(gate).cpu()


def decay_floored_below_the_named(gate):  # a floor of 1e-16 moves no entry by more than 1e-15: passes, as stated
    return decay_floored(gate, floor=1e-16)


def decay_clamps_gate_in_place(gate):  # the values stay the same, the caller's tensor is written
    gate.clamp_(max=1.0)
    return decay_logs(gate)


# --- the tables --------------------------------------------------------------------------------------

RIGHT = [
    (check_delta_rule_loop, delta_loop),
    (check_delta_rule_loop, delta_householder),
    (check_delta_rule_loop, delta_as_list),
    (check_delta_rule_loop, delta_in_float64),
    (check_delta_rule_loop, delta_in_float32),
    (check_decay_matrix, decay_logs),
    (check_decay_matrix, decay_loops),
    (check_decay_matrix, decay_segsum),
    (check_decay_matrix, decay_exp_then_tril),
    (check_decay_matrix, decay_numpy),
    (check_decay_matrix, decay_in_float32),
    (check_decay_matrix, decay_in_float64),
    (check_delta_rule_loop, delta_validating),
    (check_decay_matrix, decay_validating),
    (check_decay_matrix, decay_floored_below_the_named),
    (check_decoding_memory, memory),
    (check_decoding_memory, memory_numpy),
    (check_decoding_memory, memory_tensor),
]


@pytest.mark.parametrize("check, answer", RIGHT, ids=lambda x: getattr(x, "__name__", ""))
def test_right_answers_pass(check, answer):
    feedback = check(answer)
    assert feedback.status == "correct", str(feedback)
    assert bool(feedback)


def _wrong(fn, **kwargs):
    return lambda *args: fn(*args, **kwargs)


WRONG = [
    # Exercise 1
    (check_delta_rule_loop, _wrong(delta_loop, mistake="read before"), "before writing token t"),
    (check_delta_rule_loop, _wrong(delta_loop, mistake="additive"), "that is linear attention"),
    (check_delta_rule_loop, _wrong(delta_loop, mistake="no beta"), "left out beta_t"),
    (check_delta_rule_loop, _wrong(delta_loop, mistake="sign"), "wrong sign"),
    (check_delta_rule_loop, _wrong(delta_loop, mistake="beta on v"), "multiplies only v_t"),
    (check_delta_rule_loop, _wrong(delta_loop, mistake="beta twice"), "applied twice"),
    (check_delta_rule_loop, _wrong(delta_loop, mistake="S k"), "you recalled S k_t"),
    (check_delta_rule_loop, _wrong(delta_loop, mistake="S q"), "you read the output as S_t q_t"),
    (check_delta_rule_loop, _wrong(delta_loop, mistake="normalise"), "normalised them, or capped"),
    (check_delta_rule_loop, delta_capped_keys, r"capped their length at 1\).*length 1.3"),
    (check_delta_rule_loop, delta_state_on_cpu, "made without device="),
    (check_delta_rule_loop, delta_check_reference, "the check's own code"),
    (check_delta_rule_loop, _wrong(delta_loop, mistake="transposed state"), r"stores it as \(D_k, D_v\)"),
    (check_delta_rule_loop, delta_package, "you called attn_course"),
    (check_delta_rule_loop, delta_package_step, "you called attn_course"),
    (check_delta_rule_loop, delta_in_place, "changed its input `k` in place"),
    (check_delta_rule_loop, delta_only_output, r"return \(output, state\)"),
    (check_delta_rule_loop, delta_float16, "values differ"),
    (check_delta_rule_loop, delta_validating_state_on_cpu, r"reads a tensor's value.*made without device="),
    (check_delta_rule_loop, delta_results_on_cpu, "your result is made without device="),
    (check_delta_rule_loop, delta_clamps_beta_in_place, r"changed its input `beta` in place.*values came out the same"),
    # Exercise 2
    (check_decay_matrix, decay_cumprod_ratio, "contains NaN"),
    (check_decay_matrix, decay_cumprod_ratio_float64, "underflows to 0|0 / 0"),
    (check_decay_matrix, decay_with_own_gate, "the diagonal must be 1"),
    (check_decay_matrix, decay_one_too_few, "one gate too few"),
    (check_decay_matrix, decay_from_start, "products from the start"),
    (check_decay_matrix, decay_transposed, "transposed"),
    (check_decay_matrix, decay_no_mask, "above the diagonal must be 0"),
    (check_decay_matrix, decay_ones_above, "above the diagonal must be 0"),
    (check_decay_matrix, decay_float16, "values differ"),
    (check_decay_matrix, decay_in_place, "changed its input `gate` in place"),
    (check_decay_matrix, decay_package, "you called attn_course"),
    (check_decay_matrix, decay_finite_fill, "must be exactly 0"),
    (check_decay_matrix, decay_tiny_above, "must be exactly 0"),
    (check_decay_matrix, decay_band, "no key is ever cut off"),
    (check_decay_matrix, _wrong(decay_band, width=32), "no key is ever cut off"),
    (check_decay_matrix, decay_mask_on_cpu, "made without device="),
    (check_decay_matrix, decay_check_reference, "the check's own code"),
    (check_decay_matrix, decay_mask_by_multiplication, r"NaN above the diagonal only.*overflows to inf.*inf \* 0"),
    (check_decay_matrix, decay_log1p, r"NaN on or below the diagonal, in the case with a gate of 1e-30.*log1p"),
    (check_decay_matrix, decay_epsilon, "the gates plus 1e-6"),
    (check_decay_matrix, _wrong(decay_epsilon, epsilon=1e-4), "the gates plus 1e-4"),
    (check_decay_matrix, decay_floored, r"floored at 0\.03 \(as with gate\.clamp\(min=0\.03\)\)"),
    (check_decay_matrix, _wrong(decay_floored, floor=1e-2), r"floored at 0\.01"),
    (check_decay_matrix, _wrong(decay_floored, floor=1e-4), r"floored at 0\.0001"),
    (check_decay_matrix, _wrong(decay_floored, floor=1e-8), r"floored at 1e-08.*gate\.clamp\(min=1e-08\)"),
    (check_decay_matrix, _wrong(decay_floored, floor=1e-12), r"floored at 1e-12"),
    (check_decay_matrix, _wrong(decay_epsilon, epsilon=1e-8), r"with 1e-08 added to them.*log\(gate \+ 1e-08\)"),
    (check_decay_matrix, _wrong(decay_epsilon, epsilon=1e-10), r"with 1e-10 added to them"),
    (check_decay_matrix, decay_validating_mask_on_cpu, r"reads a tensor's value.*made without device="),
    (check_decay_matrix, decay_result_on_cpu, "your result is made without device="),
    (check_decay_matrix, decay_clamps_gate_in_place, r"changed its input `gate` in place.*values came out the same"),
    # Exercise 3
    (check_decoding_memory, _wrong(memory, mistake="no values"), r"keys \*and\* values"),
    (check_decoding_memory, _wrong(memory, mistake="state grows"), "does not grow with the context"),
    (check_decoding_memory, _wrong(memory, mistake="all layers cache"), "only every full_attention_interval-th layer"),
    (check_decoding_memory, _wrong(memory, mistake="all layers linear"), "keep no state"),
    (check_decoding_memory, _wrong(memory, mistake="key heads"), "you counted the key heads"),
    (check_decoding_memory, _wrong(memory, mistake="D_k x D_k"), "key width twice"),
    (check_decoding_memory, memory_answer_key, "the check's own code"),
    (check_decoding_memory, _wrong(memory, mistake="ceil"), "not one more"),
    (check_decoding_memory, _wrong(memory, mistake="MiB"), "answer in MiB; return it in bytes"),
    (check_decoding_memory, _wrong(memory, mistake="float"), "return an integer"),
    (check_decoding_memory, _wrong(memory, mistake="no bytes"), "numbers, not bytes"),
]


@pytest.mark.parametrize("check, answer, message", WRONG, ids=lambda x: x if isinstance(x, str) else "")
def test_wrong_answers_are_named(check, answer, message):
    feedback = check(answer)
    assert feedback.status == "incorrect", str(feedback)
    assert not bool(feedback)
    import re

    assert re.search(message, str(feedback)), str(feedback)


@pytest.mark.parametrize("check", CHECKS)
def test_scaffold_is_not_attempted_and_a_crash_is_an_error(check):
    assert check(scaffold).status == "not attempted"
    crashed = check(crashes)
    assert crashed.status == "error" and "shapes do not match" in str(crashed)


def test_the_notebook_config_is_qwen3_next():
    assert QWEN3_NEXT["num_hidden_layers"] // QWEN3_NEXT["full_attention_interval"] == 12  # 12 gated attention layers
    assert QWEN3_NEXT["num_hidden_layers"] - 12 == 36  # 36 Gated DeltaNet layers


def test_checks_leave_the_global_generator_alone():
    state = torch.get_rng_state()
    for check, answer in RIGHT:
        check(answer)
    assert torch.equal(torch.get_rng_state(), state)
