"""Watching an answer's devices on the CPU, where the meta device cannot run it.

The checks try each answer once more with its inputs on :func:`other_device`: a GPU where there is one,
else PyTorch's meta device, whose tensors have shapes but no values. An answer that reads a value
(``.item()``, ``float(t)``, ``if t.any():``) cannot run on meta, so a tensor it makes without ``device=``
would go unseen on a CPU-only machine. :class:`DeviceWatch` runs such an answer on the CPU instead and
keeps track of which tensors would be on the device: the inputs (and a module's parameters and buffers),
whatever is computed from them, and whatever is made with ``device=`` or moved with ``.to``. It records
the first operation that mixes a tensor of one or more dimensions made elsewhere with one on the device
(which fails on a GPU; a 0-dimensional one is allowed there), the first read of a value on the host,
and whether the result is on the device.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

# Operations that CUDA runs with a CPU tensor among CUDA ones (indices, copies, moves, shapes only): not mixing.
CROSS_DEVICE_OK = frozenset({"__getitem__", "__setitem__", "index_put", "index_put_", "copy_", "to", "type_as",
                             "expand_as", "view_as", "reshape_as", "__get__", "size", "dim", "numel"})
# Operations that bring a value (or all the data) from the device to the host.
READS = frozenset({"item", "__bool__", "__float__", "__int__", "__index__", "__complex__", "tolist", "numpy", "cpu"})


def _on_device(device) -> bool:
    """Whether ``device=`` puts a new tensor on the inputs' device: any torch.device (``x.device`` is the CPU in the
    watched run) or a string naming an accelerator; not None, and not the string "cpu" written into the code."""
    if device is None:
        return False
    if isinstance(device, str):
        return not device.startswith("cpu")
    return True


def _tensors(value) -> list:
    if isinstance(value, torch.nn.Module):
        return list(value.parameters()) + list(value.buffers())
    return [leaf for leaf in tree_leaves(value) if isinstance(leaf, torch.Tensor)]


class DeviceWatch(TorchFunctionMode):
    """Run code under ``with DeviceWatch(*inputs) as watch:``; then :attr:`mixed` names the first operation
    that mixed a tensor made without ``device=`` with one on the device (None if none), :attr:`read` the
    first read of a device value on the host, and :meth:`off_device` the result's tensors that are not on
    the device."""

    def __init__(self, *on_device) -> None:
        super().__init__()
        self.placed = WeakIdKeyDictionary()
        self.mixed: str | None = None
        self.read: str | None = None
        self.host_devices: list = []  # torch.device objects read off tensors that are not on the device
        for value in on_device:
            for tensor in _tensors(value):
                self.placed[tensor] = True

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", str(func))
        if isinstance(out, torch.device):  # x.device: a fresh object at every read
            if args and isinstance(args[0], torch.Tensor) and args[0] not in self.placed:
                self.host_devices.append(out)  # on a GPU, that of a CPU tensor is the CPU
            return out
        leaves = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        placed = any(x in self.placed for x in leaves)
        if name in READS:  # data leaves the device: what comes back is on the host
            if placed and self.read is None:
                self.read = name
            if name == "cpu" and isinstance(out, torch.Tensor) and out in self.placed:
                out = out.view_as(out)  # .cpu() of a CPU tensor is the tensor itself: from a GPU it is a new one
            return out
        loose = [x for x in leaves if x not in self.placed and x.dim() > 0]
        if placed and loose and self.mixed is None and name not in CROSS_DEVICE_OK:
            self.mixed = name
        if name == "__iter__" and placed:  # iterating over a tensor: its rows are on its device
            out = list(out)
            for row in out:
                self.placed[row] = True
            return iter(out)
        if name in ("to", "type_as", "cuda") and args and isinstance(args[0], torch.Tensor):
            source = args[0]
            there = self._move_target(name, args, kwargs)
            there = (source in self.placed) if there is None else there  # a dtype change stays where it was
            if out is source and there != (source in self.placed):
                out = out.view_as(out)  # on a GPU the move makes a new tensor: the original stays where it was
            if there:
                self.placed[out] = True
            return out
        if placed or self._on_device(kwargs.get("device")):
            for tensor in tree_leaves(out):
                if isinstance(tensor, torch.Tensor):
                    self.placed[tensor] = True
        return out

    def _on_device(self, device) -> bool:
        """Whether ``device=`` puts a tensor on the inputs' device: not the ``.device`` of a tensor that is not on
        it (``scores.device`` of CPU scores), not the string "cpu"; any other torch.device (``x.device`` is the
        CPU in the watched run) or an accelerator's name."""
        if any(device is host for host in self.host_devices):
            return False
        return _on_device(device)

    def _move_target(self, name: str, args: tuple, kwargs: dict) -> bool | None:
        """Where ``.to``, ``.type_as`` or ``.cuda`` sends a tensor: the device (True), the host (False), or where it
        was (None: a dtype change only). On the CPU an input's ``.device`` is the CPU too, so a device given as a
        ``torch.device`` counts as the inputs' device; the string "cpu" is the host."""
        if name == "cuda":
            return True
        if name == "type_as":
            return len(args) > 1 and args[1] in self.placed
        for value in (*args[1:], kwargs.get("device"), kwargs.get("other")):
            if isinstance(value, torch.Tensor):
                return value in self.placed
            if isinstance(value, (str, torch.device)):
                return self._on_device(value)
        return None

    def off_device(self, result) -> int:
        """How many tensors of ``result`` (a tensor, or tensors in tuples, lists and dicts) are not on the device."""
        return sum(1 for tensor in _tensors(result) if tensor not in self.placed)
