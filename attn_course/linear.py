"""Chapter 12: linear attention, attention as a recurrent network, and the delta rule.

Softmax attention compares each query with every key: ``O(L^2)`` work for ``L`` tokens, and a
cache that grows with every generated token (chapter 08). **Linear attention** (Katharopoulos et
al., 2020, "Transformers are RNNs", arXiv 2006.16236) replaces ``exp(q . k)`` by a product of
feature maps ``phi(q) . phi(k)``. Matrix products then re-associate::

    softmax:  (Q K^T) V                   an (L, S) matrix of scores
    linear:   phi(Q) (phi(K)^T V)          a (D_k, D_v) matrix, whatever the length

and the causal sum over the past becomes a running **state**, updated once per token::

    S_t = S_{t-1} + phi(k_t) v_t^T          (D_k, D_v)
    z_t = z_{t-1} + phi(k_t)                (D_k,)     the normaliser
    o_t = phi(q_t)^T S_t / (phi(q_t)^T z_t)

so decoding costs the same memory and time per token at token 10 as at token 10,000: attention
becomes a recurrent network again. What is lost: the state holds ``D_k x D_v`` numbers, and once
more key/value pairs are written into it than it has room for, they blur together.

The **delta rule** (Schlag et al., 2021, "Linear Transformers Are Secretly Fast Weight
Programmers", arXiv 2102.11174) writes into the state like a learning rule instead of only adding:
it first reads what the state already returns for the key ``k_t`` and stores only the correction
towards ``v_t``, with a learning rate ``beta_t``. Yang et al. (2024, "Parallelizing Linear
Transformers with the Delta Rule over Sequence Length", arXiv 2406.06484) made it trainable in
parallel (the chunkwise form below, :func:`delta_rule` with ``chunk_size``), and Gated DeltaNet
(Yang, Kautz and Hatamizadeh, 2025, "Gated Delta Networks", arXiv 2412.06464) added a decay
``alpha_t`` that can erase the state quickly. Hybrids that put one softmax layer after every
three such layers are among 2025's large models: Qwen3-Next (Gated DeltaNet) and Kimi Linear (a
refinement of it, Kimi Delta Attention, with latent attention as the softmax layers).

Orientation of the state. Everything here stores the state as ``(D_k, D_v)``: rows indexed by key
features, columns by value features, as Katharopoulos et al. write ``S = sum_j phi(k_j) v_j^T``,
and the output is the row vector ``q_t^T S_t``. The DeltaNet papers write the transpose,
``S_t in R^{d_v x d_k}`` with ``o_t = S_t q_t``; the numbers are the same. In this orientation the
delta rule reads::

    S_t = S_{t-1} - beta_t k_t (k_t^T S_{t-1} - v_t^T)                 (DeltaNet)
    S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T      (Gated DeltaNet)
    o_t = S_t^T q_t

Shapes: ``B`` batch, ``H`` heads, ``L`` query length, ``S`` key length (the state is also called
``S``, as in the papers; the context tells them apart), ``D_k`` key width, ``D_v`` value width,
``E`` model width.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import check_bool, check_positive_int, check_same_device_and_dtype, check_tensor, describe

__all__ = [
    "FEATURE_MAPS",
    "LinearAttentionState",
    "linear_attention",
    "linear_attention_step",
    "delta_rule",
    "delta_rule_step",
    "LinearAttention",
    "DeltaNetAttention",
    "associative_recall",
]

FEATURE_MAPS = ("elu+1", "relu", "identity")
FeatureMap = Union[str, Callable[[torch.Tensor], torch.Tensor]]


class LinearAttentionState(NamedTuple):
    """The running state of causal linear attention after ``t`` tokens.

    Attributes:
        S: ``sum_j phi(k_j) v_j^T``, shape ``(B, H, D_k, D_v)`` (``D_k`` is the feature map's width).
        z: ``sum_j phi(k_j)``, the normaliser, shape ``(B, H, D_k)``.

    Its size does not depend on ``t``: this is all a decoder needs to remember of the past.
    """

    S: torch.Tensor
    z: torch.Tensor


# -- argument checks ---------------------------------------------------------------------------------
def _resolve_feature_map(feature_map: FeatureMap) -> Callable[[torch.Tensor], torch.Tensor]:
    if callable(feature_map):
        return feature_map
    if not isinstance(feature_map, str):
        raise TypeError(f"feature_map must be one of {FEATURE_MAPS} or a callable, got {describe(feature_map)}")
    if feature_map == "elu+1":
        return lambda x: F.elu(x) + 1.0  # positive everywhere: the map of Katharopoulos et al. (2020)
    if feature_map == "relu":
        return F.relu
    if feature_map == "identity":
        return lambda x: x
    raise ValueError(f"feature_map must be one of {FEATURE_MAPS} or a callable, got {feature_map!r}")


def _resolve_normalize(normalize, feature_map: FeatureMap) -> bool:
    if normalize is None:
        return not (isinstance(feature_map, str) and feature_map == "identity")
    check_bool("normalize", normalize)
    if normalize and isinstance(feature_map, str) and feature_map == "identity":
        raise ValueError(
            "normalize=True needs non-negative features, but feature_map='identity' gives scores q . k of "
            "either sign, whose sum can be zero; use normalize=False with 'identity' (or a positive map)"
        )
    return normalize


def _check_eps(eps) -> None:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps must be a float, got {describe(eps)}")
    if not (eps >= 0 and math.isfinite(eps)):
        raise ValueError(f"eps must be a finite number >= 0, got {eps}")


def _check_qkv(q, k, v, *, causal: bool) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, x, floating=True)
        if x.dim() != 4:
            raise ValueError(f"{name} must have shape (B, H, length, width), got {describe(x)}")
    check_same_device_and_dtype(q=q, k=k, v=v)
    if q.shape[:2] != k.shape[:2] or q.shape[:2] != v.shape[:2]:
        raise ValueError(f"q, k and v must share B and H (the first two dimensions), got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)} and v {tuple(v.shape)}")
    if q.size(-1) != k.size(-1):
        raise ValueError(f"q and k must have the same width D_k (last dimension), got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if k.size(2) != v.size(2):
        raise ValueError(f"k and v must have the same length S (dimension 2), got k {tuple(k.shape)} and v {tuple(v.shape)}")
    if causal and q.size(2) != k.size(2):
        raise ValueError(f"causal attention needs as many queries as keys (self-attention), got q {tuple(q.shape)} "
                         f"and k {tuple(k.shape)}; pass causal=False for L != S")


def _check_state_tensor(name: str, state, shape: tuple, like: torch.Tensor, like_name: str = "q") -> None:
    check_tensor(name, state, floating=True)
    if tuple(state.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(state.shape)}")
    check_same_device_and_dtype(**{like_name: like, name: state})


def _check_linear_state(state, B: int, H: int, Dk: int, Dv: int, like: torch.Tensor, like_name: str = "q") -> None:
    if not isinstance(state, LinearAttentionState):
        raise TypeError(f"state must be a LinearAttentionState (S, z) or None, got {describe(state)}")
    _check_state_tensor("state.S", state.S, (B, H, Dk, Dv), like, like_name)
    _check_state_tensor("state.z", state.z, (B, H, Dk), like, like_name)


def _apply_feature_map(phi, name: str, x: torch.Tensor) -> torch.Tensor:
    features = phi(x)
    if not isinstance(features, torch.Tensor) or features.shape[:-1] != x.shape[:-1]:
        raise ValueError(f"feature_map must map a tensor of shape (..., D_k) to one of shape (..., C) with the same "
                         f"leading dimensions; for {name} {tuple(x.shape)} it returned {describe(features)}")
    return features


# -- linear attention --------------------------------------------------------------------------------
def linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    feature_map: FeatureMap = "elu+1",
    causal: bool = True,
    normalize: bool | None = None,
    eps: float = 1e-6,
    method: str = "parallel",
    initial_state: LinearAttentionState | None = None,
    return_state: bool = False,
):
    """Linear attention (Katharopoulos et al., 2020): a feature map instead of the softmax.

    Non-causal, every query sees every key::

        output = phi(Q) (phi(K)^T V) / (phi(Q) (phi(K)^T 1) + eps)          # (L, D_v)

    Causal, query ``t`` sees keys ``0..t``; two ways to compute the same numbers:

    - ``method="parallel"``: the masked parallel form, like softmax attention with another kernel:
      ``A = (phi(Q) phi(K)^T) * M`` with ``M`` the lower-triangular causal mask, then
      ``output = A V / (A 1 + eps)``: ``O(L^2)`` work, good for training on short sequences.
    - ``method="recurrent"``: the running state of :func:`linear_attention_step`, one token at a
      time: ``S_t = S_{t-1} + phi(k_t) v_t^T``, ``z_t = z_{t-1} + phi(k_t)``,
      ``o_t = phi(q_t)^T S_t / (phi(q_t)^T z_t + eps)``: ``O(L)`` work and constant memory per token.

    Without normalisation (``normalize=False``) the denominators are left out. That is the only
    sensible choice for ``feature_map="identity"``, whose scores ``q . k`` can be negative and sum
    to zero; with it, causal linear attention is exactly ``((Q K^T) * M) V``.

    Args:
        q: queries.
        k: keys.
        v: values; their width ``D_v`` may differ from the keys' ``D_k``.
        feature_map: ``phi``, applied to queries and keys: ``"elu+1"`` (``elu(x) + 1``, the paper's,
            positive everywhere), ``"relu"``, ``"identity"``, or a callable mapping ``(..., D_k)`` to
            ``(..., C)`` (the state is then ``(C, D_v)``; for normalisation it must not be negative).
        causal: query ``t`` sees only keys ``0..t`` (needs ``L == S``).
        normalize: divide by ``phi(q) . sum phi(k)``; None means True for every map but
            ``"identity"``, where only False is allowed.
        eps: added to the denominators (a query whose features are all zero, as ReLU can give,
            returns zeros instead of NaN).
        method: ``"parallel"`` or ``"recurrent"`` for the causal form (the non-causal form has only one).
        initial_state: a state to continue from (causal only): the sums over earlier tokens, as
            returned with ``return_state=True``. None starts from zeros.
        return_state: also return the state after the last key.

    Returns:
        ``output``, or ``(output, state)`` with ``return_state=True``, ``state`` a
        :class:`LinearAttentionState`.

    Shape:
        - q: ``(B, H, L, D_k)``, k: ``(B, H, S, D_k)``, v: ``(B, H, S, D_v)``
        - output: ``(B, H, L, D_v)``
        - state: ``S`` ``(B, H, C, D_v)`` and ``z`` ``(B, H, C)``, ``C = D_k`` for the named maps
    """
    check_bool("causal", causal)
    check_bool("return_state", return_state)
    _check_qkv(q, k, v, causal=causal)
    phi = _resolve_feature_map(feature_map)
    normalize = _resolve_normalize(normalize, feature_map)
    _check_eps(eps)
    if method not in ("parallel", "recurrent"):
        raise ValueError(f"method must be 'parallel' or 'recurrent', got {method!r}")
    if not causal and method != "parallel":
        raise ValueError(f"method={method!r} is the causal running state; causal=False has only method='parallel'")
    if not causal and initial_state is not None:
        raise ValueError("initial_state continues a causal sequence; it cannot be given with causal=False")

    phi_q = _apply_feature_map(phi, "q", q)  # (B, H, L, C)
    phi_k = _apply_feature_map(phi, "k", k)  # (B, H, S, C)
    if phi_q.size(-1) != phi_k.size(-1):
        raise ValueError(f"feature_map gave queries and keys of different widths: {tuple(phi_q.shape)} and {tuple(phi_k.shape)}")
    B, H, L, C = phi_q.shape
    Dv = v.size(-1)
    if initial_state is not None:
        _check_linear_state(initial_state, B, H, C, Dv, q)

    if causal and method == "recurrent":
        state = initial_state if initial_state is not None else _zero_linear_state(B, H, C, Dv, q)
        outputs = []
        for t in range(L):
            o_t, state = _linear_step(phi_q[:, :, t], phi_k[:, :, t], v[:, :, t], state, normalize, eps)  # (B, H, D_v)
            outputs.append(o_t)
        output = torch.stack(outputs, dim=2) if outputs else v.new_zeros(B, H, 0, Dv)  # (B, H, L, D_v)
        return (output, state) if return_state else output

    if causal:
        # The masked parallel form: scores phi(q_t) . phi(k_j) for j <= t, zero above the diagonal.
        scores = phi_q @ phi_k.transpose(-2, -1)  # (B, H, L, C) @ (B, H, C, L) -> (B, H, L, L)
        allowed = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()  # (L, L), True = may attend
        scores = scores.masked_fill(~allowed, 0.0)
        numerator = scores @ v  # (B, H, L, L) @ (B, H, L, D_v) -> (B, H, L, D_v)
        denominator = scores.sum(dim=-1, keepdim=True)  # (B, H, L, 1)
        if initial_state is not None:  # the earlier tokens, summed in the state
            numerator = numerator + phi_q @ initial_state.S  # (B, H, L, C) @ (B, H, C, D_v)
            denominator = denominator + (phi_q @ initial_state.z[..., None])  # (B, H, L, C) @ (B, H, C, 1)
    else:
        # Re-associated: phi(K)^T V first, a (C, D_v) matrix whatever the length.
        kv = phi_k.transpose(-2, -1) @ v  # (B, H, C, S) @ (B, H, S, D_v) -> (B, H, C, D_v)
        numerator = phi_q @ kv  # (B, H, L, C) @ (B, H, C, D_v) -> (B, H, L, D_v)
        denominator = phi_q @ phi_k.sum(dim=2)[..., None]  # (B, H, L, C) @ (B, H, C, 1) -> (B, H, L, 1)
    output = numerator / (denominator + eps) if normalize else numerator  # (B, H, L, D_v)
    if not return_state:
        return output
    state = LinearAttentionState(phi_k.transpose(-2, -1) @ v, phi_k.sum(dim=2))  # (B, H, C, D_v), (B, H, C)
    if initial_state is not None:
        state = LinearAttentionState(initial_state.S + state.S, initial_state.z + state.z)
    return output, state


def _zero_linear_state(B: int, H: int, C: int, Dv: int, like: torch.Tensor) -> LinearAttentionState:
    return LinearAttentionState(like.new_zeros(B, H, C, Dv), like.new_zeros(B, H, C))


def _linear_step(phi_q, phi_k, v, state: LinearAttentionState, normalize: bool, eps: float):
    """One token, features already applied: phi_q, phi_k ``(B, H, C)``, v ``(B, H, D_v)``."""
    S = state.S + phi_k[..., :, None] * v[..., None, :]  # (B, H, C, D_v) + outer product (B, H, C, 1) * (B, H, 1, D_v)
    z = state.z + phi_k  # (B, H, C)
    numerator = (phi_q[..., None, :] @ S).squeeze(-2)  # (B, H, 1, C) @ (B, H, C, D_v) -> (B, H, D_v)
    if normalize:
        denominator = (phi_q * z).sum(dim=-1, keepdim=True)  # (B, H, 1)
        numerator = numerator / (denominator + eps)
    return numerator, LinearAttentionState(S, z)


def linear_attention_step(
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    state: LinearAttentionState | None = None,
    *,
    feature_map: FeatureMap = "elu+1",
    normalize: bool | None = None,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, LinearAttentionState]:
    """One token of causal linear attention as a recurrent network (Katharopoulos et al., 2020, eq. 18-20).

    ::

        S_t = S_{t-1} + phi(k_t) v_t^T
        z_t = z_{t-1} + phi(k_t)
        o_t = phi(q_t)^T S_t / (phi(q_t)^T z_t + eps)     (without the division if normalize=False)

    The state has the same size after 10 tokens as after 10,000: decoding needs constant memory
    and time per token. Running it over ``t = 0, 1, ...`` gives :func:`linear_attention` with
    ``causal=True``.

    Args:
        q_t: the query of token ``t``.
        k_t: its key.
        v_t: its value.
        state: the state after tokens ``0..t-1`` (None: no earlier token, zeros).
        feature_map, normalize, eps: as in :func:`linear_attention`.

    Returns:
        ``(o_t, new_state)``: the output of token ``t`` and a new :class:`LinearAttentionState`
        (the old one is not modified).

    Shape:
        - q_t, k_t: ``(B, H, D_k)``, v_t: ``(B, H, D_v)`` -> o_t: ``(B, H, D_v)``
        - state: ``S`` ``(B, H, C, D_v)``, ``z`` ``(B, H, C)`` (``C = D_k`` for the named maps)
    """
    for name, x in (("q_t", q_t), ("k_t", k_t), ("v_t", v_t)):
        check_tensor(name, x, floating=True)
        if x.dim() != 3:
            raise ValueError(f"{name} must have shape (B, H, width) (one token), got {describe(x)}")
    check_same_device_and_dtype(q_t=q_t, k_t=k_t, v_t=v_t)
    if q_t.shape[:2] != k_t.shape[:2] or q_t.shape[:2] != v_t.shape[:2] or q_t.size(-1) != k_t.size(-1):
        raise ValueError(f"q_t and k_t must have shape (B, H, D_k) and v_t (B, H, D_v), got q_t {tuple(q_t.shape)}, "
                         f"k_t {tuple(k_t.shape)} and v_t {tuple(v_t.shape)}")
    phi = _resolve_feature_map(feature_map)
    normalize = _resolve_normalize(normalize, feature_map)
    _check_eps(eps)
    phi_q, phi_k = _apply_feature_map(phi, "q_t", q_t), _apply_feature_map(phi, "k_t", k_t)  # (B, H, C) each
    B, H, C = phi_k.shape
    if state is None:
        state = _zero_linear_state(B, H, C, v_t.size(-1), q_t)
    else:
        _check_linear_state(state, B, H, C, v_t.size(-1), q_t, "q_t")
    return _linear_step(phi_q, phi_k, v_t, state, normalize, eps)


# -- the delta rule ----------------------------------------------------------------------------------
def _per_token(name: str, x, shape: tuple, layout: str, like: torch.Tensor, like_name: str = "q") -> torch.Tensor:
    """beta or gate: a float for every token, or a tensor that broadcasts to ``shape``; returned expanded."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return torch.full(shape, float(x), dtype=like.dtype, device=like.device)
    check_tensor(name, x, floating=True)
    check_same_device_and_dtype(**{like_name: like, name: x})
    try:
        if x.dim() > len(shape):
            raise RuntimeError
        return x.expand(shape)
    except RuntimeError:
        raise ValueError(f"{name} must have shape {layout} = {shape} (one number per head and token) or "
                         f"broadcast to it, got {tuple(x.shape)}") from None


def _delta_step(q_t, k_t, v_t, beta_t, alpha_t, S):
    """One token of the (gated) delta rule, no checks: q_t, k_t ``(B, H, D_k)``, v_t ``(B, H, D_v)``,
    beta_t and alpha_t ``(B, H)`` (alpha_t None: no gate), S ``(B, H, D_k, D_v)``."""
    if alpha_t is not None:
        S = alpha_t[..., None, None] * S  # decay the whole state first: alpha_t S_{t-1}
    retrieved = (k_t[..., None, :] @ S).squeeze(-2)  # what the state returns for k_t: k_t^T S, (B, H, D_v)
    correction = beta_t[..., None] * (v_t - retrieved)  # move it a step beta_t towards v_t, (B, H, D_v)
    S = S + k_t[..., :, None] * correction[..., None, :]  # + k_t (correction)^T, (B, H, D_k, D_v)
    o_t = (q_t[..., None, :] @ S).squeeze(-2)  # q_t^T S_t, (B, H, D_v)
    return o_t, S


def _delta_chunkwise(q, k, v, beta, gate, S, chunk_size: int):
    """The chunkwise parallel form (Yang et al., 2024, section 3; with the gate of Yang et al., 2025).

    Within a chunk of ``c`` tokens that starts from the state ``S_0``, unroll the recurrence with
    ``u_t = beta_t (v_t - alpha_t S_{t-1}^T k_t)``, the value actually written at ``t``::

        S_t = gamma_t S_0 + sum_{j <= t} (gamma_t / gamma_j) k_j u_j^T,     gamma_t = alpha_1 ... alpha_t

    Substituting ``S_{t-1}`` into ``u_t`` gives a lower-triangular linear system for all ``u`` at once::

        (I + tril_{-1}(diag(beta) (K K^T * Gamma))) U = diag(beta) V - diag(beta gamma) K S_0

    with ``Gamma[t, j] = gamma_t / gamma_j``. Solving it once for both right-hand sides (``U~`` for
    ``diag(beta) V`` and ``W`` for ``diag(beta gamma) K``, the "UT transform" of the WY
    representation) gives ``U = U~ - W S_0``; then every output of the chunk and the state at its
    end are matrix products::

        O = diag(gamma) Q S_0 + ((Q K^T) * Gamma * M) U
        S_c = gamma_c S_0 + (K * gamma_c / gamma)^T U
    """
    B, H, L, Dk = k.shape
    outputs = []
    log_alpha = None
    if gate is not None:  # logs, so that products of many gates become sums that cannot underflow
        log_alpha = torch.log(gate.clamp_min(torch.finfo(gate.dtype).tiny))  # (B, H, L)
    for start in range(0, L, chunk_size):
        chunk = slice(start, start + chunk_size)
        q_c, k_c, v_c, beta_c = q[:, :, chunk], k[:, :, chunk], v[:, :, chunk], beta[:, :, chunk]  # (B, H, c, ...)
        c = k_c.size(2)
        lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()  # (c, c), True on and below the diagonal
        if log_alpha is None:
            decay = lower.to(q.dtype)  # Gamma * M: all ones below the diagonal without a gate, (c, c)
            gamma = torch.ones(B, H, c, dtype=q.dtype, device=q.device)  # (B, H, c)
            to_end = gamma  # gamma_c / gamma_j, (B, H, c)
        else:
            log_gamma = torch.cumsum(log_alpha[:, :, chunk], dim=-1)  # (B, H, c): log(alpha_1 ... alpha_t)
            log_ratio = log_gamma[..., :, None] - log_gamma[..., None, :]  # (B, H, c, c): log(gamma_t / gamma_j)
            decay = log_ratio.masked_fill(~lower, float("-inf")).exp()  # zero above the diagonal, before exp overflows
            gamma = log_gamma.exp()  # (B, H, c)
            to_end = (log_gamma[..., -1:] - log_gamma).exp()  # gamma_c / gamma_j as a difference of logs: no 0 / 0
        # The triangular system, unit diagonal: I + strictly lower part of diag(beta) (K K^T * Gamma).
        system = (beta_c[..., None] * (k_c @ k_c.transpose(-2, -1)) * decay).tril(-1)  # (B, H, c, c)
        system = system + torch.eye(c, dtype=q.dtype, device=q.device)
        rhs = torch.cat([beta_c[..., None] * v_c, (beta_c * gamma)[..., None] * k_c], dim=-1)  # (B, H, c, D_v + D_k)
        solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)  # (B, H, c, D_v + D_k)
        u_tilde, w = solved[..., : v.size(-1)], solved[..., v.size(-1):]  # (B, H, c, D_v), (B, H, c, D_k)
        u = u_tilde - w @ S  # the values written, (B, H, c, D_v)
        scores = (q_c @ k_c.transpose(-2, -1)) * decay  # (B, H, c, c), causal and decayed
        outputs.append(gamma[..., None] * (q_c @ S) + scores @ u)  # (B, H, c, D_v)
        S = gamma[..., -1, None, None] * S + (k_c * to_end[..., None]).transpose(-2, -1) @ u  # (B, H, D_k, D_v)
    output = torch.cat(outputs, dim=2) if outputs else v.new_zeros(B, H, 0, v.size(-1))
    return output, S


def delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta,
    *,
    gate: torch.Tensor | None = None,
    chunk_size: int | None = None,
    initial_state: torch.Tensor | None = None,
    return_state: bool = False,
):
    """The delta rule (DeltaNet), causal, optionally gated (Gated DeltaNet); state ``(D_k, D_v)``.

    Token by token, with the state stored as ``(D_k, D_v)`` (the transpose of the DeltaNet papers'
    ``S_t in R^{d_v x d_k}``; see the module docstring)::

        S_t = S_{t-1} - beta_t k_t (k_t^T S_{t-1} - v_t^T)                 without a gate
        S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T      with gate alpha_t
        o_t = S_t^T q_t

    ``k_t^T S_{t-1}`` is what the state returns for ``k_t`` before the write; the rule moves it a
    step ``beta_t`` towards ``v_t`` (one step of gradient descent on ``|S^T k_t - v_t|^2 / 2``
    with learning rate ``beta_t``, for unit keys). With ``beta_t = 1`` and a unit key the state
    afterwards returns exactly ``v_t`` for ``k_t``; plain linear attention would return the sum of
    everything stored along ``k_t``.

    Normalisation is the caller's job: the function computes the equations above for the keys it
    is given. The recurrence is stable for keys of unit length and ``0 <= beta_t <= 2``
    (``I - beta_t k_t k_t^T`` then shrinks nothing by more than a factor of one), so DeltaNet
    L2-normalises queries and keys (:class:`DeltaNetAttention` does); with longer keys the state
    can grow without bound. No scale is applied to the queries (flash-linear-attention's kernels
    multiply them by ``D_k ** -0.5`` by default).

    Args:
        q: queries.
        k: keys (unit length for stability; see above).
        v: values.
        beta: the writing strength ``beta_t``, a float for all tokens or a tensor (DeltaNet's is
            ``sigmoid`` of a projection, in ``(0, 1)``).
        gate: the decay ``alpha_t`` in ``(0, 1]`` of Gated DeltaNet (1 keeps everything, near 0
            erases the state); None for DeltaNet without a gate.
        chunk_size: None runs the recurrence token by token (``L`` sequential steps); an int runs
            the chunkwise parallel form of Yang et al. (2024): within each chunk of ``chunk_size``
            tokens one triangular solve and a few matrix products, between chunks the state is
            carried. Both give the same numbers; ``chunk_size`` need not divide ``L``.
        initial_state: the state to start from (after earlier tokens); None for zeros.
        return_state: also return the state after the last token.

    Returns:
        ``output``, or ``(output, state)`` with ``return_state=True``.

    Shape:
        - q, k: ``(B, H, L, D_k)``, v: ``(B, H, L, D_v)``
        - beta, gate: ``(B, H, L)`` (or anything that broadcasts to it)
        - initial_state and state: ``(B, H, D_k, D_v)``, whatever ``L``
        - output: ``(B, H, L, D_v)``
    """
    _check_qkv(q, k, v, causal=True)
    B, H, L, Dk = k.shape
    Dv = v.size(-1)
    beta = _per_token("beta", beta, (B, H, L), "(B, H, L)", q)
    if gate is not None:
        gate = _per_token("gate", gate, (B, H, L), "(B, H, L)", q)
    if chunk_size is not None:
        check_positive_int("chunk_size", chunk_size)
    check_bool("return_state", return_state)
    if initial_state is None:
        state = q.new_zeros(B, H, Dk, Dv)
    else:
        _check_state_tensor("initial_state", initial_state, (B, H, Dk, Dv), q)
        state = initial_state

    if chunk_size is None:
        outputs = []
        for t in range(L):
            o_t, state = _delta_step(q[:, :, t], k[:, :, t], v[:, :, t], beta[:, :, t],
                                     None if gate is None else gate[:, :, t], state)  # (B, H, D_v), (B, H, D_k, D_v)
            outputs.append(o_t)
        output = torch.stack(outputs, dim=2) if outputs else v.new_zeros(B, H, 0, Dv)  # (B, H, L, D_v)
    else:
        output, state = _delta_chunkwise(q, k, v, beta, gate, state, chunk_size)
    return (output, state) if return_state else output


def delta_rule_step(
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    beta_t,
    state: torch.Tensor | None = None,
    *,
    gate_t: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the (gated) delta rule, for decoding: see :func:`delta_rule` for the equations.

    Args:
        q_t, k_t, v_t: the token's query, key (unit length for stability) and value.
        beta_t: its writing strength, a float or a ``(B, H)`` tensor.
        state: the state after the earlier tokens (None: zeros).
        gate_t: its decay ``alpha_t`` (a ``(B, H)`` tensor), or None for no gate.

    Returns:
        ``(o_t, new_state)``; the old state is not modified.

    Shape:
        - q_t, k_t: ``(B, H, D_k)``, v_t: ``(B, H, D_v)`` -> o_t: ``(B, H, D_v)``
        - beta_t, gate_t: ``(B, H)``; state: ``(B, H, D_k, D_v)``
    """
    for name, x in (("q_t", q_t), ("k_t", k_t), ("v_t", v_t)):
        check_tensor(name, x, floating=True)
        if x.dim() != 3:
            raise ValueError(f"{name} must have shape (B, H, width) (one token), got {describe(x)}")
    check_same_device_and_dtype(q_t=q_t, k_t=k_t, v_t=v_t)
    if q_t.shape != k_t.shape or q_t.shape[:2] != v_t.shape[:2]:
        raise ValueError(f"q_t and k_t must have shape (B, H, D_k) and v_t (B, H, D_v), got q_t {tuple(q_t.shape)}, "
                         f"k_t {tuple(k_t.shape)} and v_t {tuple(v_t.shape)}")
    B, H, Dk = k_t.shape
    beta_t = _per_token("beta_t", beta_t, (B, H), "(B, H)", q_t, "q_t")
    if gate_t is not None:
        gate_t = _per_token("gate_t", gate_t, (B, H), "(B, H)", q_t, "q_t")
    if state is None:
        state = q_t.new_zeros(B, H, Dk, v_t.size(-1))
    else:
        _check_state_tensor("state", state, (B, H, Dk, v_t.size(-1)), q_t, "q_t")
    return _delta_step(q_t, k_t, v_t, beta_t, gate_t, state)


# -- modules -----------------------------------------------------------------------------------------
def _check_module_input(module: nn.Module, x) -> None:
    E = module.embed_dim
    check_tensor("x", x, floating=True)
    if x.dim() != 3 or x.size(-1) != E:
        raise ValueError(f"x must have shape (B, L, E={E}), got {tuple(x.shape)}")
    weight = module.q_proj.weight
    if x.dtype != weight.dtype or x.device != weight.device:
        raise TypeError(f"x is {x.dtype} on {x.device} but the module's weights are {weight.dtype} on {weight.device}; "
                        f"call module.to(...) or move the input")


def _check_heads(embed_dim, num_heads, qk_head_dim, bias) -> None:
    check_positive_int("embed_dim", embed_dim)
    check_positive_int("num_heads", num_heads)
    if embed_dim % num_heads != 0:
        raise ValueError(f"num_heads must divide embed_dim, got embed_dim={embed_dim} and num_heads={num_heads} "
                         f"(remainder {embed_dim % num_heads})")
    if qk_head_dim is not None:
        check_positive_int("qk_head_dim", qk_head_dim)
    check_bool("bias", bias)


class LinearAttention(nn.Module):
    """Multi-head linear self-attention (Katharopoulos et al., 2020), with a recurrent cached path.

    The projections of :class:`~attn_course.MultiHeadAttention`, with :func:`linear_attention` in
    place of the softmax. :meth:`forward` uses the parallel form; :meth:`forward_cached` continues
    from a :class:`LinearAttentionState` (``(B, H, D_k, D_v)`` and ``(B, H, D_k)``, however many
    tokens came before), so decoding takes constant memory and time per token.

    Args:
        embed_dim: model width ``E``.
        num_heads: heads ``H``; must divide ``embed_dim``. Values have width ``D = E / H``.
        feature_map: ``"elu+1"`` (the paper's), ``"relu"``, ``"identity"`` or a callable (see
            :func:`linear_attention`).
        normalize: divide by ``phi(q) . sum phi(k)`` (None: True except for ``"identity"``).
        causal: query ``t`` sees only tokens ``0..t`` (a decoder); False for an encoder.
        qk_head_dim: width ``D_k`` of each head's queries and keys (default ``D``); the state is
            ``(D_k, D)`` per head, so ``D_k`` sets how much it can hold.
        bias: add biases to the four projections.
        eps: added to the denominators.

    Shape:
        - x: ``(B, L, E)`` -> output: ``(B, L, E)``
    """

    def __init__(self, embed_dim: int, num_heads: int, feature_map: FeatureMap = "elu+1", normalize: bool | None = None,
                 causal: bool = True, qk_head_dim: int | None = None, bias: bool = True, eps: float = 1e-6) -> None:
        super().__init__()
        _check_heads(embed_dim, num_heads, qk_head_dim, bias)
        _resolve_feature_map(feature_map)
        self.normalize = _resolve_normalize(normalize, feature_map)
        check_bool("causal", causal)
        _check_eps(eps)
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.qk_head_dim = self.head_dim if qk_head_dim is None else qk_head_dim
        self.feature_map, self.causal, self.eps = feature_map, causal, float(eps)
        self.q_proj = nn.Linear(embed_dim, num_heads * self.qk_head_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, num_heads * self.qk_head_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    def extra_repr(self) -> str:
        name = self.feature_map if isinstance(self.feature_map, str) else getattr(self.feature_map, "__name__", "callable")
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, feature_map={name!r}, "
                f"normalize={self.normalize}, causal={self.causal}, qk_head_dim={self.qk_head_dim}")

    def _heads(self, x: torch.Tensor):
        B, L, _ = x.shape
        H, Dk, D = self.num_heads, self.qk_head_dim, self.head_dim
        q = self.q_proj(x).view(B, L, H, Dk).transpose(1, 2)  # (B, L, H * D_k) -> (B, H, L, D_k)
        k = self.k_proj(x).view(B, L, H, Dk).transpose(1, 2)  # (B, H, L, D_k)
        v = self.v_proj(x).view(B, L, H, D).transpose(1, 2)  # (B, L, E) -> (B, H, L, D)
        return q, k, v

    def _merge(self, context: torch.Tensor) -> torch.Tensor:
        B, H, L, D = context.shape
        return self.out_proj(context.transpose(1, 2).reshape(B, L, H * D))  # (B, H, L, D) -> (B, L, E)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Self-attention over all of ``x`` (causal if the module is), the parallel form."""
        _check_module_input(self, x)
        q, k, v = self._heads(x)
        context = linear_attention(q, k, v, feature_map=self.feature_map, causal=self.causal,
                                   normalize=self.normalize, eps=self.eps)  # (B, H, L, D)
        return self._merge(context)

    def new_state(self, batch_size: int) -> LinearAttentionState:
        """The state before any token: zeros, on the module's device and in its dtype.

        Shape:
            ``S``: ``(B, H, C, D)``, ``z``: ``(B, H, C)`` with ``C`` the feature width (``D_k`` for the named maps).
        """
        check_positive_int("batch_size", batch_size)
        return _zero_linear_state(batch_size, self.num_heads, self._feature_width(), self.head_dim, self.q_proj.weight)

    def _feature_width(self) -> int:
        """``C``, the width of ``phi(q)``: ``D_k`` for the named maps, whatever a callable returns."""
        weight = self.q_proj.weight
        probe = torch.zeros(1, 1, 1, self.qk_head_dim, device=weight.device, dtype=weight.dtype)
        return _apply_feature_map(_resolve_feature_map(self.feature_map), "q", probe).size(-1)

    def forward_cached(self, x: torch.Tensor, state: LinearAttentionState) -> tuple[torch.Tensor, LinearAttentionState]:
        """New tokens that follow the tokens summed in ``state``; returns their output and the new state.

        The same as ``self(x_all)`` at the new positions (``x_all`` every token so far), computed
        from the state alone. One token: one :func:`linear_attention_step` per head; several (a
        prompt): the parallel form continued from the state.

        Shape:
            x: ``(B, T_new, E)`` -> output ``(B, T_new, E)``; the state keeps its shape.
        """
        if not self.causal:
            raise ValueError("forward_cached needs a causal module (causal=True): a non-causal query sees later tokens")
        _check_module_input(self, x)
        if not isinstance(state, LinearAttentionState):
            raise TypeError(f"state must be a LinearAttentionState (module.new_state(batch_size)), got {describe(state)}")
        _check_linear_state(state, x.size(0), self.num_heads, self._feature_width(), self.head_dim, x, "x")
        q, k, v = self._heads(x)
        context, state = linear_attention(q, k, v, feature_map=self.feature_map, causal=True, normalize=self.normalize,
                                          eps=self.eps, initial_state=state, return_state=True)  # (B, H, T_new, D)
        return self._merge(context), state


def _inverse_softplus(x: torch.Tensor) -> torch.Tensor:
    return x + torch.log(-torch.expm1(-x))  # softplus(inverse_softplus(x)) == x for x > 0


class DeltaNetAttention(nn.Module):
    """Multi-head DeltaNet self-attention (Yang et al., 2024), optionally gated (Gated DeltaNet, 2025).

    Per head and token, from the input ``x_t``::

        q_t = l2norm(silu(W_q x_t)),  k_t = l2norm(silu(W_k x_t)),  v_t = W_v x_t
        beta_t = sigmoid(w_beta . x_t)                                     in (0, 1)
        alpha_t = exp(-exp(A_log) * softplus(w_alpha . x_t + dt_bias))     in (0, 1), use_gate=True only

    then :func:`delta_rule` and an output projection. The queries and keys are L2-normalised, as in
    DeltaNet, so that the recurrence stays stable. The gate follows Gated DeltaNet's
    parametrisation (Yang, Kautz and Hatamizadeh, 2025, after Mamba-2): a per-head rate
    ``exp(A_log) > 0`` times a positive, input-dependent step ``softplus(...)``, so ``log alpha_t``
    is negative and the decay of a whole chunk is a sum of logs. ``A`` starts uniform in
    ``[1, 16]`` and ``softplus(dt_bias)`` log-uniform in ``[0.001, 0.1]``, as in Mamba-2.
    Left out of the published layers, to keep the attention itself in view: the short
    convolutions on ``q``, ``k``, ``v`` and the gated output norm.

    Args:
        embed_dim: model width ``E``.
        num_heads: heads ``H``; must divide ``embed_dim``. Values have width ``D = E / H``.
        use_gate: Gated DeltaNet's decay ``alpha_t`` (False: DeltaNet).
        chunk_size: None: the recurrence token by token; an int: the chunkwise parallel form (the
            same numbers, fewer sequential steps).
        qk_head_dim: width ``D_k`` of queries and keys (default ``D``); the state is ``(D_k, D)``
            per head, so ``D_k`` sets how many orthogonal keys it can hold.
        bias: add biases to the query, key, value and output projections.

    Shape:
        - x: ``(B, L, E)`` -> output: ``(B, L, E)``; state: ``(B, H, D_k, D)``, whatever ``L``.
    """

    def __init__(self, embed_dim: int, num_heads: int, use_gate: bool = False, chunk_size: int | None = 64,
                 qk_head_dim: int | None = None, bias: bool = True) -> None:
        super().__init__()
        _check_heads(embed_dim, num_heads, qk_head_dim, bias)
        check_bool("use_gate", use_gate)
        if chunk_size is not None:
            check_positive_int("chunk_size", chunk_size)
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.qk_head_dim = self.head_dim if qk_head_dim is None else qk_head_dim
        self.use_gate, self.chunk_size = use_gate, chunk_size
        self.q_proj = nn.Linear(embed_dim, num_heads * self.qk_head_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, num_heads * self.qk_head_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.beta_proj = nn.Linear(embed_dim, num_heads)  # one writing strength per head and token
        if use_gate:
            self.gate_proj = nn.Linear(embed_dim, num_heads)  # one decay per head and token
            self.A_log = nn.Parameter(torch.empty(num_heads).uniform_(1.0, 16.0).log())  # (H,)
            step = torch.empty(num_heads).uniform_(math.log(1e-3), math.log(1e-1)).exp()  # (H,), log-uniform
            self.dt_bias = nn.Parameter(_inverse_softplus(step))  # softplus(dt_bias) == step
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, use_gate={self.use_gate}, "
                f"chunk_size={self.chunk_size}, qk_head_dim={self.qk_head_dim}")

    def _inputs(self, x: torch.Tensor):
        """Queries, keys, values, beta and the gate (or None) of every token of ``x``."""
        B, L, _ = x.shape
        H, Dk, D = self.num_heads, self.qk_head_dim, self.head_dim
        q = F.normalize(F.silu(self.q_proj(x)).view(B, L, H, Dk), dim=-1).transpose(1, 2)  # (B, H, L, D_k), unit rows
        k = F.normalize(F.silu(self.k_proj(x)).view(B, L, H, Dk), dim=-1).transpose(1, 2)  # (B, H, L, D_k), unit rows
        v = self.v_proj(x).view(B, L, H, D).transpose(1, 2)  # (B, L, E) -> (B, H, L, D)
        beta = torch.sigmoid(self.beta_proj(x)).transpose(1, 2)  # (B, L, H) -> (B, H, L)
        gate = None
        if self.use_gate:
            log_alpha = -self.A_log.exp() * F.softplus(self.gate_proj(x) + self.dt_bias)  # (B, L, H), negative
            gate = log_alpha.exp().transpose(1, 2)  # (B, H, L), in (0, 1)
        return q, k, v, beta, gate

    def _merge(self, context: torch.Tensor) -> torch.Tensor:
        B, H, L, D = context.shape
        return self.out_proj(context.transpose(1, 2).reshape(B, L, H * D))  # (B, H, L, D) -> (B, L, E)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Causal self-attention over all of ``x`` (recurrent or chunkwise, as ``chunk_size`` says)."""
        _check_module_input(self, x)
        q, k, v, beta, gate = self._inputs(x)
        return self._merge(delta_rule(q, k, v, beta, gate=gate, chunk_size=self.chunk_size))

    def new_state(self, batch_size: int) -> torch.Tensor:
        """The state before any token: zeros ``(B, H, D_k, D)`` on the module's device and in its dtype."""
        check_positive_int("batch_size", batch_size)
        weight = self.q_proj.weight
        return weight.new_zeros(batch_size, self.num_heads, self.qk_head_dim, self.head_dim)

    def forward_cached(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """New tokens that follow the tokens written into ``state``; returns their output and the new state.

        The same as ``self(x_all)`` at the new positions, where ``x_all`` is every token so far.

        Shape:
            x: ``(B, T_new, E)`` -> output ``(B, T_new, E)``; state ``(B, H, D_k, D)`` before and after.
        """
        _check_module_input(self, x)
        B = x.size(0)
        if not isinstance(state, torch.Tensor):
            raise TypeError(f"state must be a tensor (module.new_state(batch_size)), got {describe(state)}")
        _check_state_tensor("state", state, (B, self.num_heads, self.qk_head_dim, self.head_dim), x, "x")
        q, k, v, beta, gate = self._inputs(x)
        context, state = delta_rule(q, k, v, beta, gate=gate, chunk_size=self.chunk_size, initial_state=state,
                                    return_state=True)  # (B, H, T_new, D), (B, H, D_k, D)
        return self._merge(context), state


# -- the recall task ---------------------------------------------------------------------------------
def associative_recall(batch_size: int, num_pairs: int, *, num_keys: int = 64, num_values: int = 64,
                       generator: torch.Generator | None = None, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of multi-query associative recall (MQAR, Arora et al., 2023, "Zoology", arXiv 2312.04927).

    Each sequence lists ``num_pairs`` key-value pairs, then asks for every key again, in another
    order; at each query the model must predict the value stored with that key::

        k_1 v_1 k_2 v_2 ... k_N v_N   k_3 k_1 ... k_2
                                      v_3 v_1 ... v_2   <- the targets at the query positions

    The keys of one sequence are distinct; the values are drawn independently (two keys may
    share a value). Softmax attention can look the key up however many pairs there are; a
    recurrent state of fixed size has to hold all ``N`` pairs at once.

    Args:
        batch_size: sequences ``B``.
        num_pairs: pairs ``N`` per sequence (at most ``num_keys``).
        num_keys: key tokens, ids ``0 .. num_keys - 1``.
        num_values: value tokens, ids ``num_keys .. num_keys + num_values - 1`` (the vocabulary has
            ``num_keys + num_values`` tokens).
        generator: a ``torch.Generator`` for reproducible batches (default: the global one).
        device: where the tensors go (default: the CPU).

    Returns:
        ``(tokens, targets)``, both ``(B, 3 N)`` int64: ``targets`` holds the value at each query
        position and ``-100`` (``F.cross_entropy``'s ``ignore_index``) everywhere else.
    """
    check_positive_int("batch_size", batch_size)
    check_positive_int("num_pairs", num_pairs)
    check_positive_int("num_keys", num_keys)
    check_positive_int("num_values", num_values)
    if num_pairs > num_keys:
        raise ValueError(f"num_pairs must be at most num_keys (the keys of a sequence are distinct), got "
                         f"num_pairs={num_pairs} and num_keys={num_keys}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {describe(generator)}")
    B, N = batch_size, num_pairs
    keys = torch.rand(B, num_keys, generator=generator).argsort(dim=1)[:, :N]  # (B, N), distinct per row
    values = torch.randint(num_keys, num_keys + num_values, (B, N), generator=generator)  # (B, N)
    order = torch.rand(B, N, generator=generator).argsort(dim=1)  # (B, N): the order of the queries
    pairs = torch.stack([keys, values], dim=2).reshape(B, 2 * N)  # (B, N, 2) -> (B, 2N): k_1 v_1 k_2 v_2 ...
    tokens = torch.cat([pairs, keys.gather(1, order)], dim=1)  # (B, 3N)
    targets = torch.full_like(tokens, -100)
    targets[:, 2 * N:] = values.gather(1, order)  # the value of each queried key
    return tokens.to(device), targets.to(device)
