"""The size and work watch of chapter 11's exercise 2 (``attn_course.exercises.ch11``).

It lives outside the check module on purpose: its ``__torch_dispatch__`` runs while the student's answer
runs, and the check mechanism forbids an answer to enter a check module's code (``chNN``)."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry  # PyTorch's FLOP formulas: mm, bmm, addmm, convolution, ...

# Products that PyTorch's registry does not count (it counts two FLOPs per multiply-add for the rest).
_PRODUCTS = {"mm", "bmm", "addmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot"}
# What ``*``, ``torch.mul``, ``outer`` come down to, and division, which multiplies by a reciprocal (``a / (1 / b)``
# is ``a * b``): each counts one multiply-add per element of its output when two of its operands are tensors (of any
# size, one element included) and the output has more than one element.
_ELEMENTWISE_PRODUCTS = {"mul", "mul_", "addcmul", "addcmul_", "div", "div_", "addcdiv", "addcdiv_"}
_OUTER_PRODUCTS = {"addr", "addr_"}  # addr(input, u, v) = input + outer(u, v): len(u) x len(v) multiply-adds


# Reshapes that ``matmul`` and ``reshape`` use internally: they return the same numbers under another shape.
_VIEWS = {"_unsafe_view", "alias", "detach", "lift_fresh"}


def _is_view(func) -> bool:
    """An operation whose every output aliases an input without writing to it (``view``, ``expand``, ``transpose``,
    ``select``, ...): it produces no new number. In-place and ``out=`` operations write numbers, and count."""
    name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
    if name in _VIEWS:
        return True
    schema = getattr(func, "_schema", None)
    if schema is None or not schema.returns:
        return False
    infos = [r.alias_info for r in schema.returns]
    return all(info is not None and not info.is_write for info in infos)


class _LargestTensor(TorchDispatchMode):
    """Records, while active, the largest tensor any operation makes (views included) and the
    multiply-adds: those of every operation that ``torch.utils.flop_counter`` has a formula for (the matrix
    products ``mm``, ``bmm``, ``addmm``, ``baddbmm``, which ``@``, ``matmul``, ``einsum`` and
    ``nn.functional.linear`` come down to, and the convolutions of ``conv1d`` and its kin), of the products
    it has none for (``addbmm``, ``mv``, ``addmv``, ``dot``, ``vdot``, and the outer products of ``addr``), and
    one per element of the output of every elementwise product or quotient of two tensors, a one-element tensor
    included (``*`` followed by ``.sum()`` is a product too, and so is ``/`` by a reciprocal).

    It also adds up the numbers that the operations produce (``produced``: the size of every output of every
    operation but views, which only read numbers already there), a count that does not depend on how the products
    are written: rebuilding a head's keys, by ``@``, ``prod``, ``pow`` or any other route, produces every one of
    their numbers."""

    def __init__(self) -> None:
        super().__init__()
        self.numel, self.shape, self.multiply_adds, self.produced = 0, (), 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
        packet = getattr(func, "overloadpacket", None)
        counted = False
        if packet is not None and packet in flop_registry:
            try:
                self.multiply_adds += int(flop_registry[packet](*args, **(kwargs or {}), out_val=out)) // 2
                counted = True
            except Exception:  # a formula that does not fit this overload: fall back to the shapes below
                counted = False
        if counted:
            pass
        elif name in _PRODUCTS:
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            first, second = tensors[-2], tensors[-1]  # addmm(bias, a, b), baddbmm(bias, a, b): the last two
            batch = first.shape[0] if first.dim() == 3 else 1
            inner = first.shape[-1]
            self.multiply_adds += batch * inner * (first.shape[-2] if first.dim() >= 2 else 1) * (
                second.shape[-1] if second.dim() >= 2 else 1)
        elif name in _OUTER_PRODUCTS:
            first, second = args[1], args[2]
            self.multiply_adds += first.numel() * second.numel()
        elif name in _ELEMENTWISE_PRODUCTS and sum(isinstance(a, torch.Tensor) for a in args) >= 2:
            # Counted by the size of the output, so that a one-element operand hides nothing: a scalar times a column
            # of W_UK, token by token and coordinate by coordinate, rebuilds the keys as surely as a matrix product.
            # (A Python number, as in ``scores / math.sqrt(d)``, reaches here as a number, not a tensor.)
            produced = max((t.numel() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)), default=0)
            if produced > 1:
                self.multiply_adds += produced
        if not _is_view(func):
            self.produced += sum(t.numel() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor) and tensor.numel() > self.numel:
                self.numel, self.shape = tensor.numel(), tuple(tensor.shape)
        return out
