"""Noticing an answer that changed its inputs in place (used by :func:`attn_course.exercises.call`).

Before the student's function runs, every tensor it receives is copied: tensors passed directly, tensors
inside lists, tuples and dicts (to a depth of four), the parameters and buffers of ``nn.Module``
arguments, and numpy arrays; lists and dicts themselves are copied shallowly (so sorting or appending
shows). After the call each is compared with its copy, exactly (NaN equals NaN), and with its version
counter (an in-place write that leaves the values as they were, ``x.mul_(1.0)``, still counts), and the first
change is named by the argument's name in the student's signature: ``scores``, ``state[1]``,
``layer.norm1.weight``. An argument wrapped in :func:`mutable` is neither copied nor compared: for an
exercise whose point is to change it in place (a cache buffer).
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from ._core import mutable

__all__ = ["mutable", "snapshot", "first_change", "describe_arguments"]

_MAX_DEPTH = 4


@dataclass
class _Saved:
    path: str
    obj: Any
    copy: Any
    kind: str  # "tensor", "array", "list", "dict"
    version: int | None = None  # a tensor's version counter: every in-place write adds one


def _unwrap(value: Any) -> tuple[Any, bool]:
    return (value.value, True) if isinstance(value, mutable) else (value, False)


def unwrap(args: tuple, kwargs: dict) -> tuple[tuple, dict, set]:
    """Remove the :class:`mutable` markers; return the plain arguments and the ids of the marked ones."""
    marked: set = set()
    plain_args = []
    for value in args:
        value, is_marked = _unwrap(value)
        plain_args.append(value)
        if is_marked:
            marked.add(id(value))
    plain_kwargs = {}
    for name, value in kwargs.items():
        value, is_marked = _unwrap(value)
        plain_kwargs[name] = value
        if is_marked:
            marked.add(id(value))
    return tuple(plain_args), plain_kwargs, marked


def _argument_names(fn: Callable, args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    """(name, value) for every argument, named as the student's signature names them (a module's by its forward)."""
    if isinstance(fn, nn.Module):
        fn = fn.forward
    try:
        bound = inspect.signature(fn).bind_partial(*args, **kwargs)
    except (TypeError, ValueError):
        return [(f"argument {i + 1}", value) for i, value in enumerate(args)] + list(kwargs.items())
    named = []
    parameters = inspect.signature(fn).parameters
    for name, value in bound.arguments.items():
        kind = parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            named.extend((f"{name}[{i}]", item) for i, item in enumerate(value))
        elif kind is inspect.Parameter.VAR_KEYWORD:
            named.extend(value.items())
        else:
            named.append((name, value))
    return named


def _walk(value: Any, path: str, out: list, depth: int, seen: set, marked: set) -> None:
    if id(value) in seen or id(value) in marked:
        return
    if isinstance(value, torch.Tensor):
        seen.add(id(value))
        if value.layout == torch.strided and value.device.type != "meta":
            out.append(_Saved(path, value, value.detach().clone(), "tensor", value._version))
    elif isinstance(value, nn.Module):
        seen.add(id(value))
        for name, tensor in list(value.named_parameters()) + list(value.named_buffers()):
            if tensor is not None and id(tensor) not in seen and id(tensor) not in marked:
                seen.add(id(tensor))
                out.append(_Saved(f"{path}.{name}", tensor, tensor.detach().clone(), "tensor", tensor._version))
    elif "numpy" in sys.modules and isinstance(value, sys.modules["numpy"].ndarray):
        seen.add(id(value))
        out.append(_Saved(path, value, value.copy(), "array"))
    elif depth < _MAX_DEPTH and isinstance(value, (list, dict, tuple)):
        seen.add(id(value))
        if isinstance(value, list):
            out.append(_Saved(path, value, list(value), "list"))
        elif isinstance(value, dict):
            out.append(_Saved(path, value, dict(value), "dict"))
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            _walk(item, f"{path}[{key!r}]", out, depth + 1, seen, marked)


def snapshot(fn: Callable, args: tuple, kwargs: dict, marked: set) -> list[_Saved]:
    """Copies of everything the student's function receives, to compare after the call."""
    out: list[_Saved] = []
    seen: set = set()
    for name, value in _argument_names(fn, args, kwargs):
        _walk(value, name, out, 0, seen, marked)
    return out


def _tensor_change(tensor: torch.Tensor, copy: torch.Tensor) -> str | None:
    if tensor.shape != copy.shape:
        return f"its shape changed from {tuple(copy.shape)} to {tuple(tensor.shape)}"
    if tensor.dtype != copy.dtype:
        return f"its dtype changed from {copy.dtype} to {tensor.dtype}"
    now = tensor.detach()
    if now.device != copy.device:
        return f"it moved from {copy.device} to {now.device}"
    if torch.equal(now, copy):
        return None
    same = now == copy
    if now.is_floating_point() or now.is_complex():
        same = same | (torch.isnan(now) & torch.isnan(copy))
    differ = int((~same).sum())
    if differ == 0:
        return None
    return f"{differ} of {same.numel()} values are not what they were"


def first_change(saved: list[_Saved]) -> tuple[str, str] | None:
    """(path, what changed) for the first argument that is not as it was, or None."""
    for item in saved:
        change = None
        if item.kind == "tensor":
            change = _tensor_change(item.obj, item.copy)
            if change is None and item.version is not None and item.obj._version != item.version:
                change = ("You wrote in place into it: an operation ending in _, such as mul_ or clamp_, x[...] = ..., "
                          "or x /= ..., even though its values came out the same")
        elif item.kind == "array":
            numpy = sys.modules["numpy"]
            if item.obj.shape != item.copy.shape or not numpy.array_equal(item.obj, item.copy, equal_nan=item.obj.dtype.kind in "fc"):
                change = "its values are not what they were"
        elif item.kind == "list":
            if len(item.obj) != len(item.copy) or any(a is not b for a, b in zip(item.obj, item.copy)):
                change = "items were added, removed, replaced or reordered"
        elif item.kind == "dict":
            if item.obj.keys() != item.copy.keys() or any(item.obj[k] is not item.copy[k] for k in item.copy):
                change = "entries were added, removed or replaced"
        if change is not None:
            return item.path, change
    return None


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"of shape {tuple(value.shape)}"
    if isinstance(value, bool) or value is None:
        return f"= {value}"
    if isinstance(value, (int, float)):
        return f"= {value:g}" if isinstance(value, float) else f"= {value}"
    if isinstance(value, str):
        return f"= {value!r}" if len(value) < 30 else "(a string)"
    if isinstance(value, (list, tuple)) and len(value) <= 8 and all(isinstance(v, (int, float)) for v in value):
        return f"= {list(value)}"
    return f"(a {type(value).__name__})"


def describe_arguments(fn: Callable, args: tuple, kwargs: dict) -> str:
    """``x of shape (1, 3, 6), temperature = 2``: the inputs, for the message of a crash."""
    parts = [f"{name} {_describe(value)}" for name, value in _argument_names(fn, args, kwargs)]
    text = ", ".join(parts)
    return text if len(text) <= 200 else text[:197] + "..."
