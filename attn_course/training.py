"""A small, generic training loop with a progress bar, for the chapters' toy models.

:func:`fit` runs ``steps`` optimizer steps: it takes a batch, asks ``loss_fn(model, batch)`` for a
scalar loss, backpropagates, clips the gradient norm and steps Adam. The progress bar is
``tqdm.auto``'s: a widget in Jupyter, a line of text in a terminal.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from ._checks import check_bool, check_positive_int, describe

__all__ = ["History", "fit", "move_to"]


@dataclass
class History:
    """What :func:`fit` saw: the loss of every step, in order."""

    losses: list[float] = field(default_factory=list)

    def mean_loss(self, last: int = 20) -> float:
        """The mean of the last ``last`` losses (a less noisy "final loss")."""
        check_positive_int("last", last)
        if not self.losses:
            raise ValueError("the history is empty: no training step was run")
        tail = self.losses[-last:]
        return sum(tail) / len(tail)


def move_to(batch: Any, device: torch.device) -> Any:
    """Move every tensor in a (nested) tuple, list or dict to ``device``; leave the rest as it is."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, Mapping):
        return {key: move_to(value, device) for key, value in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(move_to(value, device) for value in batch)
    return batch


def _batch_source(batches) -> Callable[[int], Any]:
    """Turn ``make_batch(step)`` or an iterable (a DataLoader, a list) into one ``step -> batch`` function."""
    if callable(batches):
        return batches
    if isinstance(batches, Iterable):
        iterator = iter(())

        def next_batch(step: int) -> Any:
            nonlocal iterator
            for _ in range(2):  # at most one restart: an empty iterable must not loop forever
                try:
                    return next(iterator)
                except StopIteration:
                    iterator = iter(batches)  # cycle: start another epoch
            raise ValueError("batches is an empty iterable: it yielded no batch")

        return next_batch
    raise TypeError(f"batches must be a function make_batch(step) or an iterable of batches, got {describe(batches)}")


def fit(
    model: nn.Module,
    batches,
    loss_fn: Callable[[nn.Module, Any], torch.Tensor],
    *,
    steps: int,
    lr: float = 1e-3,
    device: torch.device | str | None = None,
    max_grad_norm: float | None = 1.0,
    schedule: str = "constant",
    progress: bool = True,
    description: str = "training",
) -> History:
    """Train ``model`` for ``steps`` steps of Adam and return the loss of every step.

    Args:
        model: any ``nn.Module``; it is moved to ``device`` and left in training mode.
        batches: ``make_batch(step) -> batch`` (called with ``0 .. steps - 1``), or an iterable of
            batches such as a ``DataLoader`` (cycled when it runs out). Every tensor in a batch
            (also inside tuples, lists and dicts) is moved to ``device``.
        loss_fn: ``loss_fn(model, batch) -> loss``, a scalar tensor to minimise.
        steps: number of optimizer steps.
        lr: Adam's learning rate.
        device: where to train (default: where the model's parameters are).
        max_grad_norm: clip the gradients' total norm to this value (None: no clipping).
        schedule: ``"constant"`` keeps ``lr``; ``"linear"`` lowers it in a straight line from ``lr``
            at the first step to ``lr / steps`` at the last.
        progress: show a progress bar with the running loss.
        description: the progress bar's label.

    Returns:
        A :class:`History` with one loss per step.

    Raises:
        ValueError: when the loss is not a finite scalar (the message names the step).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {describe(model)}")
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be a function loss_fn(model, batch) -> scalar tensor, got {describe(loss_fn)}")
    check_positive_int("steps", steps)
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not (lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr must be a positive finite number, got {lr!r}")
    if max_grad_norm is not None and (isinstance(max_grad_norm, bool) or not isinstance(max_grad_norm, (int, float))
                                      or not max_grad_norm > 0):
        raise ValueError(f"max_grad_norm must be a positive number or None, got {max_grad_norm!r}")
    if schedule not in ("constant", "linear"):
        raise ValueError(f"schedule must be 'constant' or 'linear', got {schedule!r}")
    check_bool("progress", progress)
    next_batch = _batch_source(batches)
    parameters = [p for p in model.parameters() if p.requires_grad]
    if not parameters:
        raise ValueError("model has no trainable parameters: there is nothing to fit")
    device = torch.device(device) if device is not None else parameters[0].device
    model.to(device)
    model.train()
    optimizer = torch.optim.Adam(parameters, lr=lr)

    from tqdm.auto import tqdm  # a Jupyter widget in notebooks, text in a terminal

    history = History()
    bar = tqdm(total=steps, desc=description, disable=not progress, leave=True)
    try:
        for step in range(steps):
            batch = move_to(next_batch(step), device)
            loss = loss_fn(model, batch)
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise ValueError(f"loss_fn must return a scalar tensor, got {describe(loss)} at step {step}")
            if not torch.isfinite(loss.detach()).all():
                raise ValueError(f"the loss became {float(loss.detach()):.4g} at step {step}: try a smaller lr "
                                 f"(now {lr}) or check loss_fn")
            if schedule == "linear":
                for group in optimizer.param_groups:
                    group["lr"] = lr * (steps - step) / steps
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if max_grad_norm is not None:
                nn.utils.clip_grad_norm_(parameters, max_grad_norm)
            optimizer.step()
            history.losses.append(float(loss.detach()))
            bar.update(1)
            if step % 10 == 0 or step == steps - 1:
                bar.set_postfix(loss=f"{history.mean_loss(10):.3f}", refresh=False)
    finally:
        bar.close()
    return history

