"""Checks for the exercises of chapter 03, scaled dot-product attention.

Each check tries the answer on the notebook's sizes and then on sizes unlike them (``other_sizes``:
batch 1 and 3, one token, odd widths) and on scores near 100, names the usual mistakes (no scale, the
wrong width under the root, the softmax over the wrong axis, ``K Qᵀ``, one layer shared by W_Q and W_K, a
variance where a standard deviation is asked, σ_Q = σ_K assumed) before comparing values, and uses
the shared mechanism of ``attn_course.exercises``: torch's and the package's attention forbidden in
exercise 1, the softmax, autograd (backward and forward mode) and the exponential and logarithm that
finite differences need in exercise 2 (which also runs once on a p with one tiny probability, where a finite
difference's change is lost to rounding, by whatever route it computes the exponential; a complex-step
derivative in numpy is exact to rounding and is not caught, and the notebook says so), inputs watched for
changes in place (exercises 1, 2 and 3 also name an in-place operation on an input that leaves its values as
they were, x.mul_(1.0)), results' dtype and device. Exercises 1, 2 and 3 run once more on another device (the GPU,
or PyTorch's meta device): a tensor made on the CPU is named, and so, in exercise 3, is a scale kept as a plain
tensor attribute of the module, which module.to(device) leaves behind. ``keys.T`` on a batch fails with PyTorch's own error, and
exercise 3's hint names the fix. The table of wrong answers is in tests/test_exercises_ch03.py.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..scaled import scaled_dot_product_attention
from . import (Mismatch, NotAttempted, call, call_elsewhere, exercise, expect, expect_close, expect_number,
               expect_on_device, expect_sequence, expect_tensor, forbidden, other_device, other_sizes, randn, rng)

__all__ = ["check_self_attention_by_hand", "check_softmax_jacobian", "check_self_attention_module", "check_score_std"]


def _close(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-5) -> bool:
    return a.shape == b.shape and torch.allclose(a.detach().double().cpu(), b.detach().double().cpu(), atol=atol, rtol=1e-4)


def _pair(result, what: str):
    return expect_sequence(result, what=what, names=("context", "weights"))


def _diagnose_weights(weights: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor, d_v: int, what: str,
                      d_in: int | None = None, notebook_d_k: int | None = None) -> None:
    """Name the usual mistakes in attention weights before comparing them value by value."""
    d_k = queries.size(-1)
    n_keys = keys.size(-2)
    scores = queries @ keys.transpose(-2, -1)  # (..., L, d_k) @ (..., d_k, S) -> (..., L, S)
    guesses = [
        (torch.softmax(scores, dim=-1), f"your weights are softmax(Q Kᵀ): you forgot to divide the scores by sqrt(d_k) = {math.sqrt(d_k):.2f}"),
        (torch.softmax(scores / d_k, dim=-1), f"you divided the scores by d_k = {d_k}; divide by its square root, sqrt(d_k) = {math.sqrt(d_k):.2f}"),
        (torch.softmax(scores, dim=-1) / math.sqrt(d_k), "you divided the weights after the softmax: the scale must act on the "
         "scores, before the softmax (the weights of a row must still sum to one)"),
    ]
    if d_v != d_k:
        guesses.append((torch.softmax(scores / math.sqrt(d_v), dim=-1),
                        f"you divided by sqrt({d_v}), the width of the values; the scale comes from the width of queries and "
                        f"keys, sqrt(d_k) = sqrt({d_k})"))
    if n_keys not in (d_k, d_v, 1):
        guesses.append((torch.softmax(scores / math.sqrt(n_keys), dim=-1),
                        f"you divided by sqrt({n_keys}), the number of keys (tokens); the scale comes from the width of "
                        f"queries and keys, sqrt(d_k) = sqrt({d_k})"))
    n_queries = queries.size(-2)
    if n_queries not in (d_k, d_v, n_keys, 1):
        guesses.append((torch.softmax(scores / math.sqrt(n_queries), dim=-1),
                        f"you divided by sqrt({n_queries}), the number of queries; the scale comes from the width of "
                        f"queries and keys, sqrt(d_k) = sqrt({d_k})"))
    if notebook_d_k is not None and notebook_d_k != d_k:
        guesses.append((torch.softmax(scores / math.sqrt(notebook_d_k), dim=-1),
                        f"you divided by sqrt({notebook_d_k}), the exercise's d_k, but here d_k = {d_k}: take d_k from the "
                        "width of the keys, not a fixed number"))
    if d_in is not None and d_in not in (d_k, d_v, n_keys, 1):
        guesses.append((torch.softmax(scores / math.sqrt(d_in), dim=-1),
                        f"you divided by sqrt({d_in}), the width of the input tokens; the scale comes from the width of "
                        f"queries and keys after projection, sqrt(d_k) = sqrt({d_k})"))
    if scores.size(-1) > 1:
        guesses.append((torch.softmax(scores / math.sqrt(d_k), dim=-2),
                        "your weights' columns sum to one, not their rows: take the softmax over the keys, the last axis"))
    if scores.size(-1) == scores.size(-2):
        guesses.append((torch.softmax(scores.transpose(-2, -1) / math.sqrt(d_k), dim=-1),
                        "your weights are transposed: row i must hold query i's weights, so compute Q Kᵀ, not K Qᵀ"))
    if queries.shape == keys.shape and n_keys > 1:
        guesses.append((torch.softmax(queries @ queries.transpose(-2, -1) / math.sqrt(d_k), dim=-1),
                        "your keys equal your queries (did you project the keys with W_query?): the scores q_i·q_j are "
                        "then symmetric; the keys come from W_key"))
    if scores.dim() >= 3 and scores.size(0) > 1:
        guesses.append((torch.softmax(scores / math.sqrt(d_k), dim=0),
                        "your softmax runs over the batch (the first axis), so the sequences share one distribution; take "
                        "it over the keys, the last axis"))
    right = torch.softmax(scores / math.sqrt(d_k), dim=-1)
    for guess, message in guesses:
        if not _close(guess, right):  # a mistake that gives the right numbers here (one key, say) cannot be named
            expect(not _close(weights, guess), f"{what}: {message}")


def _weights_and_context(result, queries, keys, values, what: str, d_in: int | None = None,
                         notebook_d_k: int | None = None) -> None:
    """Check a (context, weights) pair against scaled dot-product attention of queries, keys, values."""
    L, S, d_v = queries.size(-2), keys.size(-2), values.size(-1)
    lead = tuple(queries.shape[:-2])
    context, weights = _pair(result, what)
    weights = expect_tensor(weights, what=f"weights for {what}", dtype="float", device=queries)
    if not bool(torch.isfinite(weights).all()):
        large = bool((queries @ keys.transpose(-2, -1)).abs().max() / math.sqrt(queries.size(-1)) > 80)
        raise Mismatch(f"weights for {what}: your weights contain inf or NaN" + (
            ": exp of a score near 100 overflows float32. Subtract each row's maximum before exponentiating, or use "
            "the library's softmax, which does" if large else ""))
    if tuple(weights.shape) == lead + (S, L) and S != L:
        raise Mismatch(f"weights for {what}: your weights have shape {tuple(weights.shape)}, one row per key; row i must "
                       f"hold query i's weights over the {S} keys, shape {lead + (L, S)}: compute Q Kᵀ, not K Qᵀ")
    expect_tensor(weights, what=f"weights for {what}", shape=lead + (L, S))
    _diagnose_weights(weights, queries, keys, d_v, f"weights for {what}", d_in=d_in, notebook_d_k=notebook_d_k)
    expected_context, expected_weights = scaled_dot_product_attention(queries, keys, values)
    expect_close(weights, expected_weights, what=f"weights for {what}")
    context = expect_tensor(context, what=f"context for {what}", dtype="float", device=queries)
    if S > 1 and context.shape == values.shape and _close(context, values):
        raise Mismatch(f"context for {what}: your context is the values themselves; multiply them by the weights")
    expect_tensor(context, what=f"context for {what}", shape=lead + (L, d_v))
    expect_close(context, expected_context, what=f"context for {what}")


@exercise(
    "Exercise 1, self-attention from three projection matrices",
    hint="project x with each of the three matrices; the scores are the queries times the transposed keys, divided "
         "by the square root of the keys' width d_k (not of the values or of x); softmax over the keys, the last "
         "axis; the context is the weights times the values",
    forbid=("sdpa",),
)
def check_self_attention_by_hand(self_attention_by_hand) -> str:
    generator = rng(31)
    # The notebook's exercise: T = 5 tokens of width 4, d_k = 16 != d_v = 6, and then other sizes, and
    # inputs large enough that a softmax without its maximum shift overflows float32.
    cases = [(5, 4, 16, 6, 1.0)] + [(s.T, s.E, s.E + 3, max(1, s.E - 2), 1.0) for s in other_sizes(same_length=True)]
    cases.append((6, 5, 8, 3, 6.0))  # scores near +-100
    for T, d_in, d_k, d_v, scale in cases:
        x = randn(T, d_in, generator=generator, scale=scale)
        W_query, W_key, W_value = (randn(d_in, d, generator=generator) for d in (d_k, d_k, d_v))
        what = f"x of shape (T={T}, d_in={d_in}), d_k={d_k}, d_v={d_v}" + (" (scores near ±100)" if scale > 1 else "")
        inputs = {"x": x, "W_query": W_query, "W_key": W_key, "W_value": W_value}
        versions = {name: tensor._version for name, tensor in inputs.items()}
        result = call(self_attention_by_hand, x, W_query, W_key, W_value)
        for name, tensor in inputs.items():  # as in exercise 3: x.mul_(1.0) leaves the values, not the version
            _expect_untouched(tensor, versions[name], what, name=name, who="your function")
        queries, keys, values = x @ W_query, x @ W_key, x @ W_value  # (T, d_in) @ (d_in, d) -> (T, d)
        _weights_and_context(result, queries, keys, values, what, d_in=d_in, notebook_d_k=16)
    # Once more at the notebook's sizes on another device (a GPU, or the meta device standing in for one): a
    # scale made as a CPU tensor (torch.tensor([16.0]).sqrt()) fails there, as it would on a GPU.
    device = other_device()
    x, W_query, W_key, W_value = (randn(*shape, generator=generator).to(device) for shape in ((5, 4), (4, 16), (4, 16), (4, 6)))
    shown = f"x of shape (T=5, d_in=4), d_k=16, d_v=6, on the {device.type} device"
    result = call_elsewhere(self_attention_by_hand, x, W_query, W_key, W_value, device=device, what=shown,
                            made_by="torch.tensor, torch.zeros, torch.ones ...", copy_out_is_a_mistake=False)
    if result is not None:
        context, weights = _pair(result, shown)
        expect_on_device(weights, device, f"weights for {shown}", dtype="float")
        expect_on_device(context, device, f"context for {shown}", dtype="float")
        if device.type != "meta":  # meta tensors have no values to compare
            _weights_and_context(result, x @ W_query, x @ W_key, x @ W_value, shown, d_in=4, notebook_d_k=16)
        else:
            expect_tensor(weights, what=f"weights for {shown}", shape=(5, 5))
            expect_tensor(context, what=f"context for {shown}", shape=(5, 6))
    return "your weights and context vectors match attn_course.scaled_dot_product_attention, at every size tried."


_DERIVE = "this exercise asks you to derive the Jacobian by hand, not to let autograd compute it"
_AUTOGRAD_ROUTES = (torch.autograd.functional.jacobian, torch.autograd.functional.hessian, torch.autograd.functional.jvp,
                    torch.autograd.functional.vjp, torch.autograd.functional.hvp, torch.autograd.functional.vhp,
                    torch.autograd.grad, torch.autograd.backward, torch.Tensor.backward,
                    torch.autograd.forward_ad.make_dual, torch.autograd.forward_ad.unpack_dual,  # forward mode
                    torch.func.jacrev, torch.func.jacfwd, torch.func.hessian, torch.func.grad, torch.func.grad_and_value,
                    torch.func.vjp, torch.func.jvp, torch.func.linearize)
# Finite differences (and any other route that runs the softmax again) need the scores back from p and their
# exponential; the formula needs neither. The guards do not see numpy's exp and log, an exponential written as a
# power of e or as sigmoid(h) / (1 - sigmoid(h)): the case with one tiny probability catches those by value (a
# finite difference loses a change of about 1e-23 in p_1 to rounding; the formula gets it to float precision).
# A complex-step derivative (numpy, ω_j + i·h with h = 1e-30) loses nothing to rounding and is not caught: the
# notebook's statement says so rather than promising every numerical route.
_FROM_P = ("the Jacobian is built from p alone: recomputing the softmax from scores (finite differences, say) "
           "is not a derivation, and the formula needs no logarithm and no exponential")
_TINY = "a p with one tiny probability (scores [0.5, 0, -40])"
_RECOMPUTE_ROUTES = (torch.exp, torch.Tensor.exp, torch.exp2, torch.Tensor.exp2, torch.expm1, torch.Tensor.expm1,
                     torch.log, torch.Tensor.log, torch.log2, torch.Tensor.log2, torch.log10, torch.Tensor.log10,
                     torch.log1p, torch.Tensor.log1p, math.exp, math.expm1, math.log, math.log2, math.log10, math.log1p)


@exercise(
    "Exercise 2, the Jacobian of the softmax",
    hint="write α_i as the exponential of ω_i divided by the sum of the exponentials of all scores, and differentiate "
         "that quotient with respect to ω_j, once for j equal to i and once for j different from i; then write every "
         "exponential divided by the sum as the α it equals, so that p alone appears",
)
def check_softmax_jacobian(softmax_jacobian) -> str:
    # torch._check (in torch.diag_embed, say) imports sympy and mpmath on first use, and mpmath's import calls
    # math.log: import them now, outside the guards, or a right answer is blamed for that math.log.
    import torch.fx.experimental.symbolic_shapes  # noqa: F401
    generator = rng(32)
    cases = {
        "p = softmax of 5 random scores": torch.softmax(randn(5, generator=generator, dtype=torch.float64), dim=0),
        "a nearly one-hot p (scores [12, 0, 1, -2])": torch.softmax(torch.tensor([12.0, 0.0, 1.0, -2.0], dtype=torch.float64), dim=0),
        "p of one entry, [1.0]": torch.ones(1, dtype=torch.float64),
        "p = softmax of 9 random scores (float32)": torch.softmax(randn(9, generator=generator, scale=2.0), dim=0),
        _TINY: torch.softmax(torch.tensor([0.5, 0.0, -40.0], dtype=torch.float64), dim=0),
    }
    norms = []
    for what, p in cases.items():
        expected = torch.autograd.functional.jacobian(lambda s: torch.softmax(s, dim=0), torch.log(p))  # (S, S)
        version = p._version
        with forbidden("softmax", *_AUTOGRAD_ROUTES, reason=_DERIVE), forbidden(*_RECOMPUTE_ROUTES, reason=_FROM_P):
            answer = call(softmax_jacobian, p)
        # as in exercises 1 and 3: p.mul_(1.0) leaves the values as they were, not the version
        _expect_untouched(p, version, what, name="p", who="your function")
        got = expect_tensor(answer, what=what, shape=(p.numel(), p.numel()), dtype="float", convert=True)
        if p.numel() > 1:
            tolerance = 1e-6 if p.dtype == torch.float64 else 1e-5
            eye = torch.eye(p.numel(), dtype=p.dtype)
            named = [
                (torch.diag(p), "your matrix is diagonal: raising one score also lowers every other probability, so the "
                 "entries off the diagonal (i ≠ j) cannot be zero"),
                (-torch.outer(p, p), "your entries on the diagonal (i = j) miss a term: there ω_i is also in the numerator "
                 "e^(ω_i), whose derivative adds one more term"),
                (torch.outer(p, p) - torch.diag(p), "your signs are flipped: raising score i raises α_i, so the diagonal "
                 "must be positive, and it lowers every other α, so the rest must be negative"),
                (torch.diag(p * (1 - p)), "only your diagonal is right; the entries off the diagonal are missing (raising "
                 "score j lowers every other probability)"),
                (torch.diag(p * (1 - p)) - torch.outer(p, p), "your diagonal counts the product p_i p_i twice: the entries "
                 "off the diagonal are right, but on the diagonal the quotient rule gives the -p_i² term once"),
                (torch.diag(p) - (p @ p), "p @ p is a number (a dot product), the same for every entry; the term you need "
                 "differs from pair to pair (i, j)"),
                (eye - torch.outer(p, p), "your diagonal starts from 1, not from p_i: the derivative of e^(ω_i) is e^(ω_i) "
                 "itself, which becomes α_i after dividing by the sum"),
                (eye - p[None, :].expand(p.numel(), -1), "that is the Jacobian of the log-softmax, δ_ij - p_j; the "
                 "softmax's has one more factor"),
            ]
            for guess, message in named:
                expect(not _close(got, guess, atol=tolerance), f"{what}: {message}")
        # Float64 p: an answer within float32's rounding passes (atol 1e-6); one off by more does not.
        atol, rtol = (1e-6, 1e-5) if p.dtype == torch.float64 else (1e-5, 1e-4)
        try:
            expect_close(got, expected, what=what, atol=atol, rtol=rtol)
        except Mismatch as wrong:
            if "values differ" not in str(wrong):
                raise
            off_by = float((got.detach().cpu().double() - expected).abs().max())
            if p.numel() > 1 and off_by <= 1e-3 * float(expected.abs().max()):
                raise Mismatch(f"{what}: close to the Jacobian, but off by up to {off_by:.1e}: did you clamp p, or "
                               "compute in lower precision? The check wants the exact formula") from None
            off = ~torch.isclose(got.detach().cpu().double(), expected, atol=atol, rtol=rtol)
            index = tuple(int(i) for i in off.nonzero()[0])  # three significant digits: the entries can be tiny
            raise Mismatch(f"{what}: {int(off.sum())} of {off.numel()} values differ; first at index {index}: expected "
                           f"{float(expected[index]):.3g}, got {float(got[index]):.3g}") from None
        if what == _TINY:  # every entry to three significant digits, the tiny ones (about -2.6e-18) included
            got = got.detach().cpu().double()
            off = ~torch.isclose(got, expected, rtol=1e-3, atol=0.0)
            if bool(off.any()):
                index = tuple(int(i) for i in off.nonzero()[0])
                raise Mismatch(
                    f"{what}: the entries of the tiny probability p_3 = {float(p[2]):.2g} are off; first at index {index}: "
                    f"expected {float(expected[index]):.3g}, got {float(got[index]):.3g}. The formula gets them to float "
                    "precision. A finite difference cannot: nudging ω_3 by h changes p_1 by about h·1e-18, which is lost "
                    "to rounding next to p_1 ≈ 0.6 (a finite difference is not a derivation); and a "
                    "clamped p changes them")
        norms.append(float(expected.norm()))
    # Once more with p on another device (a GPU, or the meta device standing in for one): the Jacobian must be
    # made there too. An answer that copies p to numpy or to a list cannot be judged on meta: the cases above did.
    device = other_device()
    p = next(iter(cases.values()))
    shown = f"p = softmax of 5 random scores, on the {device.type} device"
    with forbidden("softmax", *_AUTOGRAD_ROUTES, reason=_DERIVE), forbidden(*_RECOMPUTE_ROUTES, reason=_FROM_P):
        result = call_elsewhere(softmax_jacobian, p.to(device), device=device, what=shown,
                                made_by="torch.eye, torch.zeros, torch.tensor ...", copy_out_is_a_mistake=False)
    if isinstance(result, torch.Tensor):
        expect_on_device(result, device, shown)
    return (
        f"your Jacobian matches autograd's. Its norm is {norms[0]:.3f} for the spread-out p and {norms[1]:.1e} for the nearly "
        "one-hot p: a saturated softmax passes almost no gradient back to its scores."
    )


def _expect_untouched(x: torch.Tensor, version: int, what: str, name: str = "x", who: str = "your forward") -> None:
    """Name an in-place change of the caller's x, even one that leaves its values as they were (x.div_(1.0))."""
    expect(x._version == version, f"{what}: {who} changed {name} in place (an operation ending in _, such as div_, "
           f"mul_ or clamp_, or {name} /= ...), even if its values came out the same. That breaks backward through an "
           f"earlier output that used {name}, and changes the caller's tensor: leave {name} alone and use the "
           f"out-of-place operation ({name} / 2, not {name} /= 2)")


def _expect_x_untouched(x: torch.Tensor, version: int, what: str) -> None:
    _expect_untouched(x, version, what)


def _check_module(module_class, d_in: int, d_k: int, d_v: int, x: torch.Tensor, note: str = "") -> tuple:
    B, T = x.shape[:2]
    module = call(module_class, d_in, d_k, d_v)
    expect(isinstance(module, nn.Module), f"{getattr(module_class, '__name__', module_class)} must be a subclass of torch.nn.Module")
    if not any(hasattr(module, name) for name in ("W_query", "W_key", "W_value")):
        call(module, x)  # the untouched scaffold returns None: "not attempted"
    names = ("W_query", "W_key", "W_value")
    for name, d_out in zip(names, (d_k, d_k, d_v)):
        layer = getattr(module, name, None)
        expect(isinstance(layer, nn.Linear), f"the module needs an attribute {name} that is an nn.Linear; got {type(layer).__name__}")
        expect(
            (layer.in_features, layer.out_features) == (d_in, d_out),
            f"{name} must map d_in={d_in} to {d_out} (d_k={d_k}, d_v={d_v}); got nn.Linear({layer.in_features}, {layer.out_features})",
        )
        expect(layer.bias is None, f"{name} must have no bias (bias=False), as in attn_course.SelfAttention")
    for i, first in enumerate(names):
        for second in names[i + 1:]:
            a, b = getattr(module, first), getattr(module, second)
            shared = a is b or a.weight is b.weight or a.weight.data_ptr() == b.weight.data_ptr()
            expect(not shared, f"{first} and {second} are one layer (one weight) under two names"
                   + (": the scores x_i W Wᵀ x_j are then symmetric, and bank looks for river exactly as much as river "
                      "looks for bank (section 8, why three projections)" if {first, second} == {"W_query", "W_key"} else "")
                   + ". Create three separate nn.Linear layers in __init__")
    layers = [getattr(module, name) for name in names]
    what = f"x of shape (B={B}, T={T}, d_in={d_in}), d_k={d_k}, d_v={d_v}{note}"
    version = x._version
    result = call(module, x)
    _expect_x_untouched(x, version, what)
    replaced = [name for name, layer in zip(names, layers) if getattr(module, name) is not layer]
    expect(not replaced, f"your forward replaced {', '.join(replaced)} with a new layer: create the layers once, in "
           "__init__, so that they are the module's parameters, which training updates; forward only uses them")
    with torch.no_grad():
        queries, keys, values = module.W_query(x), module.W_key(x), module.W_value(x)  # (B, T, d)
    _weights_and_context(result, queries, keys, values, what, d_in=d_in, notebook_d_k=8)
    version = x._version
    again = _pair(call(module, x), what)[0]
    _expect_x_untouched(x, version, what)
    if isinstance(again, torch.Tensor) and again.shape == result[0].shape:
        expect(torch.equal(again.detach(), result[0].detach()), f"{what}: two calls of your module on the same x give "
               "different outputs: does forward draw new weights? Create the layers once, in __init__")
    return module, result[0]


def _left_behind(module: nn.Module, device: torch.device) -> list[tuple[str, torch.Tensor]]:
    """The plain tensor attributes (neither parameters nor buffers) that module.to(device) left elsewhere."""
    return [(f"{prefix}.{name}" if prefix else name, value) for prefix, sub in module.named_modules()
            for name, value in vars(sub).items()
            if isinstance(value, torch.Tensor) and not name.startswith("_") and value.device.type != device.type]


def _module_elsewhere(module_class, x: torch.Tensor) -> None:
    """The notebook's sizes once more, with the student's module moved to another device (a GPU, or the meta device
    standing in for one) by .to(device): a scale kept as a plain tensor attribute does not follow it and is named."""
    device = other_device()
    module = call(module_class, 5, 8, 3).to(device)  # .to returns the module itself
    left = _left_behind(module, device)
    shown = f"x of shape (B=2, T=6, d_in=5), d_k=8, d_v=3, with x and your module moved to the {device.type} device"
    try:
        result = call_elsewhere(module, x.to(device), device=device, what=shown,
                                made_by="torch.tensor, torch.zeros, torch.ones ...", copy_out_is_a_mistake=False)
    except Mismatch:
        if not left:
            raise
        name, tensor = left[0]
        raise Mismatch(
            f"{shown}: your forward failed there, because your module keeps `{name}` as a plain tensor attribute, and "
            f"module.to(device) moves only parameters and buffers: `{name}` stayed on {tensor.device}, and it fails "
            f"next to tensors on the {device.type} device" + (" (the meta device stands for a GPU here)" if
                                                              device.type == "meta" else "") +
            f". Keep the scale a Python float (d_k ** -0.5), or register it as a buffer "
            f"(self.register_buffer(\"{name.split('.')[-1]}\", ...)) so that it follows the module") from None
    if result is None:  # the meta device could not judge it (it needed values); the CPU cases did
        return
    context, weights = _pair(result, shown)
    expect_on_device(weights, device, f"weights for {shown}", dtype="float")
    expect_on_device(context, device, f"context for {shown}", dtype="float")
    if device.type == "meta":  # meta tensors have no values to compare
        expect_tensor(weights, what=f"weights for {shown}", shape=(2, 6, 6))
        expect_tensor(context, what=f"context for {shown}", shape=(2, 6, 3))
        return
    with torch.no_grad():
        x = x.to(device)
        queries, keys, values = module.W_query(x), module.W_key(x), module.W_value(x)  # (B, T, d)
    _weights_and_context(result, queries, keys, values, shown, d_in=5, notebook_d_k=8)


@exercise(
    "Exercise 3, a self-attention module with d_k ≠ d_v",
    hint="three separate linear layers without bias, created in __init__ and named as the exercise says: queries and "
         "keys of width d_k, values of width d_v; in forward, divide the scores by the square root of d_k, and swap "
         "only the last two axes of the keys (a batch has three)",
)
def check_self_attention_module(module_class) -> str:
    if module_class is ... or module_class is None:
        raise NotAttempted
    generator = rng(34)
    torch.manual_seed(33)  # the module's own initialisation (the global generator is restored after the check)
    module, context = _check_module(module_class, 5, 8, 3, randn(2, 6, 5, generator=generator))
    expect(context.requires_grad, "your context does not require grad: compute it from the layers' outputs, without .detach() or torch.no_grad()")
    context.sum().backward()
    for name in ("W_query", "W_key", "W_value"):
        grad = getattr(module, name).weight.grad
        if grad is None or not bool(grad.abs().sum() > 0):
            zeros = [other for other in ("W_query", "W_key", "W_value")
                     if not bool(getattr(module, other).weight.detach().abs().sum() > 0)]
            if grad is not None and zeros:  # all-zero queries or keys: constant scores, no gradient for the other
                raise Mismatch(f"no gradient reaches {name}.weight, because {', '.join(zeros)}.weight is all zeros: "
                               "keep nn.Linear's own random initialisation")
            raise Mismatch(f"no gradient reaches {name}.weight: compute the output from the layers' outputs, without .detach() or torch.no_grad()")
    # Other batches, lengths and widths: batch 1 and 3, one token, d_k < d_v, odd widths.
    for size in other_sizes(same_length=True):
        d_in, d_k, d_v = size.E, size.E + 1, max(1, size.E // 2 + 2)
        _check_module(module_class, d_in, d_k, d_v, randn(size.B, size.T, d_in, generator=generator))
    # Inputs large enough that the scaled scores reach about ±100, where exp without its maximum shift overflows.
    _check_module(module_class, 5, 8, 3, randn(2, 6, 5, generator=generator, scale=15.0), note=" (scores near ±100)")
    _module_elsewhere(module_class, randn(2, 6, 5, generator=generator))
    return "the module gives contexts of shape (B, T, d_v), scaled by sqrt(d_k), at every size tried, and trains all three projections."


def _score_std_mistakes(d_model: int, d_k: int, std_query: float, std_key: float) -> list[tuple[float, str]]:
    """Plausible wrong formulas for the standard deviation of q·k, each with what it gets wrong."""
    q, k = std_query, std_key
    return [
        (d_k * d_model ** 2 * q ** 2 * k ** 2, "that is the variance of q·k; the exercise asks for its standard deviation, "
         "the square root of the variance"),
        (math.sqrt(d_k) * q * k, "you used std_query and std_key as the spread of the entries of q and k themselves; but "
         "q = x W_Q, so each entry of q sums d_model products x_i W_ie, and its variance is d_model times that of one "
         "product (the same for k)"),
        (math.sqrt(d_k * d_model) * q * k, "each entry of q gets a variance d_model σ_Q², and each entry of k a variance "
         "d_model σ_K²: their product carries d_model twice, so the standard deviation has a factor d_model, not "
         "√d_model"),
        (d_k * d_model * q * k, "the d_k products q_e k_e add their variances: a factor d_k in the variance, so √d_k in "
         "the standard deviation"),
        (math.sqrt(d_k) * d_model * q ** 2 * k ** 2, "std_query and std_key are standard deviations: a variance is their "
         "square, but the standard deviation of the score has them to the first power"),
        (math.sqrt(d_model) * d_k * q * k, "you swapped d_model and d_k: d_model is the width of the tokens (summed inside "
         "each entry of q and k), d_k the width of q and k (summed in the dot product)"),
        (d_model * q * k, "that is the standard deviation after the division by √d_k; the exercise asks for the unscaled "
         "score q·k"),
        (math.sqrt(d_k) * d_model * q ** 2, "you used std_query for both factors, as if σ_K = σ_Q; the keys have their own "
         "spread, std_key (T5 gives them different ones)"),
        (math.sqrt(d_k) * d_model * k ** 2, "you used std_key for both factors, as if σ_Q = σ_K; the queries have their own "
         "spread, std_query (T5 gives them different ones)"),
        (math.sqrt(d_k) * d_model * (q ** 2 + k ** 2) ** 0.5, "the variances of two independent factors multiply, they "
         "do not add: Var(q_e k_e) = Var(q_e) Var(k_e) for independent q_e, k_e of mean 0"),
        (math.sqrt(d_k) * d_model * (q + k), "the standard deviations of two independent factors multiply, they do not "
         "add: Var(q_e k_e) = Var(q_e) Var(k_e) for independent q_e, k_e of mean 0"),
    ]


@exercise(
    "Exercise 4, the size of the scores at initialisation",
    hint="go in three steps, as in section 5.1: the variance of one entry q_e (a sum of d_model products x_i W_ie), "
         "the variance of one product q_e k_e (independent factors of mean 0: the variances multiply), and the "
         "variance of the sum of d_k such products; the standard deviation is the square root of the last",
)
def check_score_std(score_std) -> str:
    # The notebook's nn.Linear-like case, then widths and scales unlike it (std != its square, d_model != d_k),
    # one of width 1, and T5's initialisation.
    cases = [(512, 64, 1 / math.sqrt(3 * 512), 1 / math.sqrt(3 * 512)), (64, 16, 0.5, 2.0), (10, 7, 0.2, 0.3),
             (1, 1, 1.5, 0.5), (3, 200, 0.7, 0.05), (3000, 128, (3000 * 128) ** -0.5, 3000 ** -0.5)]
    failed = []  # (what, got, right, the indices of the mistakes that give got there)
    for d_model, d_k, std_query, std_key in cases:
        what = f"score_std(d_model={d_model}, d_k={d_k}, std_query={std_query:.4g}, std_key={std_key:.4g})"
        got = expect_number(call(score_std, d_model, d_k, std_query, std_key), what=what)
        right = math.sqrt(d_k) * d_model * std_query * std_key
        if math.isclose(got, right, rel_tol=1e-6):
            continue
        matching = {i for i, (guess, _) in enumerate(_score_std_mistakes(d_model, d_k, std_query, std_key))
                    if math.isclose(got, guess, rel_tol=1e-6)}
        failed.append((what, got, right, matching, (d_model, d_k, std_query, std_key)))
    if failed:
        # Name a mistake only if it gives the answer's number in every case that failed: two formulas can agree
        # on one case (σ_Q = σ_K assumed and the scaled score both give 64 at d_model=64, σ_Q=0.5, σ_K=2).
        common = set.intersection(*(matching for *_, matching, _ in failed))
        if common:
            index = min(common)
            what, _, _, _, sizes = next(case for case in failed if index in case[3])
            raise Mismatch(f"{what}: {_score_std_mistakes(*sizes)[index][1]}")
        what, got, right, _, _ = failed[0]
        if math.isclose(got, right, rel_tol=0.1):
            raise Mismatch(f"{what}: you returned {got:.4g}, within 10% of the exact value but not equal to it. A "
                           "measurement only estimates it: derive the exact formula, as section 5.1 did")
        raise Mismatch(f"{what}: you returned {got:.4g}, which is not the standard deviation of q·k")
    return ("your formula gives the exact standard deviation of q·k for every width and scale tried; run the next cell "
            "to compare it with a measurement.")
