"""Device choice and seeding, the two lines every chapter starts with."""

from __future__ import annotations

import random

import torch

__all__ = ["get_device", "set_seed"]


def get_device() -> torch.device:
    """Pick the best available device: CUDA, then Apple MPS, then the CPU.

    Returns:
        A ``torch.device``; chapters move their tensors and models to it.
    """
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def set_seed(seed: int) -> None:
    """Seed Python's ``random``, NumPy (when installed) and torch on every device.

    Args:
        seed: a non-negative int.
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__} {seed!r}")
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    random.seed(seed)
    try:
        import numpy as np
    except ImportError:  # NumPy is optional for the package itself
        pass
    else:
        np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # seeds CPU, CUDA and MPS generators
