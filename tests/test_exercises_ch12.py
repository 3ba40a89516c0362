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
        if mistake != "read before":
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
    state = torch.zeros(B, H, D_k, v.size(-1), dtype=q.dtype)
    eye = torch.eye(D_k, dtype=q.dtype)
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


def delta_float16(q, k, v, beta):
    out, state = delta_loop(q.half().float(), k.half().float(), v.half().float(), beta.half().float())
    return out.to(q.dtype), state.to(q.dtype)


# --- Exercise 2: the decay matrix --------------------------------------------------------------------

def decay_logs(gate):
    L = gate.size(-1)
    log_cumulative = gate.log().cumsum(-1)
    difference = log_cumulative[..., :, None] - log_cumulative[..., None, :]
    return difference.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf")).exp()


def decay_loops(gate):
    """Another right answer: a product over each range (never a ratio), written with loops."""
    L = gate.size(-1)
    out = torch.zeros(*gate.shape, L, dtype=gate.dtype)
    for t in range(L):
        for j in range(t + 1):
            out[..., t, j] = gate[..., j + 1:t + 1].prod(dim=-1)
    return out


def decay_segsum(gate):
    """Another right answer: Mamba-2's segment sum, written with a masked cumulative sum of logs."""
    L = gate.size(-1)
    log_gate = gate.log()[..., None, :].expand(*gate.shape[:-1], L, L)  # (..., t, i)
    strictly_lower = torch.ones(L, L, dtype=torch.bool).tril(-1)
    segment = log_gate.masked_fill(~strictly_lower.T, 0.0)  # keep i > j as the columns of row j
    sums = segment.cumsum(dim=-1)  # (..., j, t): sum over i in (j, t]
    out = sums.transpose(-2, -1).exp()
    return out.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), 0.0)


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


def decay_package(gate):
    L = gate.size(-1)
    shape = gate.shape[:-1]
    q = torch.eye(L, dtype=gate.dtype).expand(*shape, L, L).reshape(-1, 1, L, L)
    v = torch.eye(L, dtype=gate.dtype).expand(*shape, L, L).reshape(-1, 1, L, L)
    out = ac.linear_attention(q, q, v, feature_map="identity", normalize=False)
    return out.reshape(*shape, L, L)


# --- Exercise 3: decoding memory ---------------------------------------------------------------------

def memory(config, context_len, *, mistake=None):
    every = config["full_attention_every"]
    softmax_layers = config["num_layers"] // every
    if mistake == "ceil":
        softmax_layers = math.ceil(config["num_layers"] / every)
    linear_layers = config["num_layers"] - softmax_layers
    if mistake == "all layers linear":
        linear_layers = config["num_layers"]
    if mistake == "all layers cache":
        softmax_layers = config["num_layers"]
    cache = (1 if mistake == "no values" else 2) * config["num_kv_heads"] * config["head_dim"] * context_len
    heads = config["linear_num_key_heads"] if mistake == "key heads" else config["linear_num_value_heads"]
    state = heads * config["linear_key_dim"] * config["linear_value_dim"]
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
    layers = np.arange(1, config["num_layers"] + 1)
    softmax = layers % config["full_attention_every"] == 0
    per_cache = np.int64(2 * config["num_kv_heads"] * config["head_dim"] * context_len)
    per_state = np.int64(config["linear_num_value_heads"] * config["linear_key_dim"] * config["linear_value_dim"])
    return np.where(softmax, per_cache, per_state).sum() * config["bytes_per_number"]


def memory_tensor(config, context_len):
    return torch.tensor(memory(config, context_len))


# --- the tables --------------------------------------------------------------------------------------

RIGHT = [
    (check_delta_rule_loop, delta_loop),
    (check_delta_rule_loop, delta_householder),
    (check_delta_rule_loop, delta_as_list),
    (check_decay_matrix, decay_logs),
    (check_decay_matrix, decay_loops),
    (check_decay_matrix, decay_segsum),
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
    (check_delta_rule_loop, _wrong(delta_loop, mistake="S k"), "papers' orientation"),
    (check_delta_rule_loop, _wrong(delta_loop, mistake="normalise"), "you normalised the keys"),
    (check_delta_rule_loop, _wrong(delta_loop, mistake="transposed state"), r"stores it as \(D_k, D_v\)"),
    (check_delta_rule_loop, delta_package, "you called attn_course"),
    (check_delta_rule_loop, delta_package_step, "you called attn_course"),
    (check_delta_rule_loop, delta_in_place, "changed its input `k` in place"),
    (check_delta_rule_loop, delta_only_output, r"return \(output, state\)"),
    (check_delta_rule_loop, delta_float16, "values differ"),
    # Exercise 2
    (check_decay_matrix, decay_cumprod_ratio, "contains NaN"),
    (check_decay_matrix, decay_cumprod_ratio_float64, "underflows to 0 even in float64"),
    (check_decay_matrix, decay_with_own_gate, "the diagonal must be 1"),
    (check_decay_matrix, decay_one_too_few, "one gate too few"),
    (check_decay_matrix, decay_from_start, "products from the start"),
    (check_decay_matrix, decay_transposed, "transposed"),
    (check_decay_matrix, decay_no_mask, "above the diagonal must be 0"),
    (check_decay_matrix, decay_ones_above, "above the diagonal must be 0"),
    (check_decay_matrix, decay_float16, "values differ"),
    (check_decay_matrix, decay_in_place, "changed its input `gate` in place"),
    (check_decay_matrix, decay_package, "you called attn_course"),
    # Exercise 3
    (check_decoding_memory, _wrong(memory, mistake="no values"), r"keys \*and\* values"),
    (check_decoding_memory, _wrong(memory, mistake="state grows"), "does not grow with the context"),
    (check_decoding_memory, _wrong(memory, mistake="all layers cache"), "only every full_attention_every-th layer"),
    (check_decoding_memory, _wrong(memory, mistake="all layers linear"), "keep no state"),
    (check_decoding_memory, _wrong(memory, mistake="key heads"), "you counted the key heads"),
    (check_decoding_memory, _wrong(memory, mistake="ceil"), "not one more"),
    (check_decoding_memory, _wrong(memory, mistake="MiB"), "answer in MiB; return it in bytes"),
    (check_decoding_memory, _wrong(memory, mistake="float"), "return an integer"),
    (check_decoding_memory, _wrong(memory, mistake="no bytes"), "expected"),
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
    assert QWEN3_NEXT["num_layers"] // QWEN3_NEXT["full_attention_every"] == 12  # 12 gated attention layers
    assert QWEN3_NEXT["num_layers"] - 12 == 36  # 36 Gated DeltaNet layers


def test_checks_leave_the_global_generator_alone():
    state = torch.get_rng_state()
    for check, answer in RIGHT:
        check(answer)
    assert torch.equal(torch.get_rng_state(), state)
