"""Argument checks shared by the package: every failure names the argument, what was expected and
what was received, so that a student sees at once which call is wrong."""

from __future__ import annotations

import torch

__all__ = [
    "check_tensor",
    "check_same_device_and_dtype",
    "check_positive_int",
    "check_probability",
    "check_bool",
    "describe",
]


def describe(x) -> str:
    """A short description of ``x`` for error messages: shape, dtype and device for tensors."""
    if isinstance(x, torch.Tensor):
        return f"tensor of shape {tuple(x.shape)}, dtype {x.dtype}, on {x.device}"
    return f"{type(x).__name__} {x!r}"


def check_tensor(name: str, x, *, min_dim: int = 0, floating: bool = False) -> None:
    """Raise ``TypeError``/``ValueError`` unless ``x`` is a tensor with at least ``min_dim`` axes."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {describe(x)}")
    if x.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dimensions, got shape {tuple(x.shape)}")
    if floating and not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")


def check_same_device_and_dtype(**tensors: torch.Tensor) -> None:
    """Raise ``ValueError`` unless all named tensors share one device and one dtype."""
    items = list(tensors.items())
    first_name, first = items[0]
    for name, x in items[1:]:
        if x.device != first.device:
            raise ValueError(f"{name} is on {x.device} but {first_name} is on {first.device}; move both to one device")
        if x.dtype != first.dtype:
            raise TypeError(f"{name} has dtype {x.dtype} but {first_name} has dtype {first.dtype}; use one dtype")


def check_positive_int(name: str, value, *, allow_zero: bool = False) -> None:
    """Raise unless ``value`` is an ``int`` (not a bool) that is positive (or zero if allowed)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {describe(value)}")
    if value < 0 or (value == 0 and not allow_zero):
        expected = "non-negative" if allow_zero else "positive"
        raise ValueError(f"{name} must be a {expected} int, got {value}")


def check_probability(name: str, value) -> None:
    """Raise unless ``0 <= value < 1``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float in [0, 1), got {describe(value)}")
    if not 0.0 <= float(value) < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value}")


def check_bool(name: str, value) -> None:
    """Raise ``TypeError`` unless ``value`` is a bool."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {describe(value)}")
