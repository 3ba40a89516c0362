"""Whether an answer can be trained through: the gradients of its result against the reference's.

A layer's values can be right while no gradient reaches its inputs or weights (a result computed under
``torch.no_grad()``, ``.detach()``-ed, rebuilt from numpy or ``.item()``), while one use of an input is
detached (the gradient reaches it by another path, but a different one), or while ``backward()`` raises
(a tensor autograd saved was written in place: ``weights[...] = 0``, ``masked_fill_``). Checks run their
cases under ``torch.no_grad()`` where they compare values; :func:`expect_gradients` runs one case with
autograd on and names each of these.
"""

from __future__ import annotations

import copy
from typing import Callable

import torch
from torch.utils._pytree import tree_leaves

from ._cases import randn, rng
from ._core import Mismatch


def _leaves(args: tuple, names: tuple) -> tuple[tuple, list, list]:
    """Fresh copies of ``args``: floating tensors become leaves that require grad (passed on as non-leaf clones,
    as a layer inside a model receives them), modules deep copies whose floating parameters require grad.
    Returns (the arguments to pass, the leaves, their names)."""
    passed, leaves, leaf_names = [], [], []
    for name, value in zip(names, args):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            leaf = value.detach().clone().requires_grad_(True)
            leaves.append(leaf)
            leaf_names.append(name)
            passed.append(leaf.clone())
        elif isinstance(value, torch.nn.Module):
            module = copy.deepcopy(value)
            for parameter_name, parameter in module.named_parameters():
                if parameter.is_floating_point():
                    parameter.requires_grad_(True)
                    leaves.append(parameter)
                    leaf_names.append(f"{name}.{parameter_name}")
            passed.append(module)
        else:
            passed.append(value)
    return tuple(passed), leaves, leaf_names


def expect_gradients(fn: Callable, args: tuple, reference: Callable, *, what: str, names: tuple | None = None,
                     call: Callable | None = None) -> None:
    """Call ``fn(*args)`` with autograd on (on fresh copies: floating tensors that require grad, modules whose
    parameters do) and compare, along one random direction, the gradient of each floating tensor it returns
    with respect to every input and parameter with what ``reference(*args)`` gives. :class:`Mismatch` names a
    result that does not require grad, a ``backward()`` that raises (an in-place write into a saved tensor),
    an input or parameter no gradient reaches, and a gradient that differs (one use of an input detached).
    ``names`` name the arguments in messages (default x0, x1, ...); ``call`` is the check's caller
    (:func:`attn_course.exercises.call`, passed in to keep the forbid guards and input watches)."""
    names = names or tuple(f"x{i}" for i in range(len(args)))
    with torch.enable_grad():
        passed, leaves, leaf_names = _leaves(args, names)
        result = call(fn, *passed) if call is not None else fn(*passed)
        got = [t for t in tree_leaves(result) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        ref_passed, ref_leaves, _ = _leaves(args, names)
        wanted = [t for t in tree_leaves(reference(*ref_passed))
                  if isinstance(t, torch.Tensor) and t.is_floating_point()]
        if len(got) != len(wanted):
            raise Mismatch(f"{what}: expected {len(wanted)} floating-point result(s), got {len(got)}")
        generator = rng(99)
        for index, (tensor, want) in enumerate(zip(got, wanted)):
            shown = what if len(got) == 1 else f"result {index} of {what}"
            if not tensor.requires_grad:
                raise Mismatch(f"{shown}: right values, but your result carries no gradient: it was computed under "
                               "torch.no_grad() (or inference_mode), or cut from autograd (.detach(), .data, numpy, "
                               ".item(), torch.tensor(...) of a result). A layer is trained through it: leave "
                               "autograd on (the notebook's demonstration cells use no_grad because they train "
                               "nothing)")
            direction = randn(*tensor.shape, generator=generator, dtype=torch.float64).to(tensor.device)
            try:
                grads = torch.autograd.grad((tensor * direction.to(tensor.dtype)).sum(), leaves, allow_unused=True)
            except RuntimeError as error:
                first = str(error).splitlines()[0][:160]
                raise Mismatch(f"{shown}: right values, but backpropagating through them raised RuntimeError: {first}. "
                               + ("You wrote in place (w[...] = 0, masked_fill_, unsqueeze_ ...) into a tensor that "
                                  "autograd saved for the backward pass (the softmax's output, or an input): build a "
                                  "new tensor instead (masked_fill, torch.where)" if "inplace" in first else
                                  "A layer must be trained through")) from None
            expected = torch.autograd.grad((want * direction.to(want.dtype)).sum(), ref_leaves, allow_unused=True)
            for name, grad, ref in zip(leaf_names, grads, expected):
                ref_zero = ref is None or not bool(ref.abs().sum() > 0)
                if ref_zero:
                    continue  # the reference's result does not depend on it either
                if grad is None or not bool(grad.nan_to_num().abs().sum() > 0):
                    raise Mismatch(f"{shown}: right values, but no gradient reaches {name} through them: part of your "
                                   "computation ran under torch.no_grad() or was detached (.detach(), .data, .item(), "
                                   "numpy), so it cannot be trained")
                scale = float(ref.abs().max())
                gap = float((grad.detach().double().cpu() - ref.detach().double().cpu()).abs().max())
                tol = 1e-4 if torch.float32 in (grad.dtype, ref.dtype) or torch.float16 in (grad.dtype, ref.dtype) else 1e-8
                if gap > tol * max(1.0, scale) * 10:
                    raise Mismatch(f"{shown}: right values, but the gradient that reaches {name} through them differs "
                                   f"from the reference's (by up to {gap:.3g}, largest entry {scale:.3g}): one use of "
                                   f"{name} (or of a value computed from it) was detached (.detach(), .data, or a value "
                                   "rebuilt from it), so training would follow a different gradient")

