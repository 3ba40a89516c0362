"""A small, generic training loop with a progress bar, for the chapters' toy models, and the toy
language-modelling task of chapters 09 to 11.

:func:`fit` runs ``steps`` optimizer steps: it takes a batch, asks ``loss_fn(model, batch)`` for a
scalar loss, backpropagates, clips the gradient norm and steps Adam. The progress bar is
``tqdm.auto``'s: a widget in Jupyter, a line of text in a terminal.

:func:`markov_task` draws sequences from a random second-order Markov chain (:class:`MarkovTask`):
chapter 09 trains on short sequences and tests on long ones, chapter 10 (and chapter 11 after it)
compares attention variants on it with :func:`quality_vs_cache`, several seeds each, so that the
tables of the two chapters can be read together.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import nn

from ._checks import check_bool, check_positive_int, describe

__all__ = ["History", "fit", "move_to", "MarkovTask", "markov_task", "markov_sequences", "QualityResult",
           "quality_vs_cache"]


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



# ---------------------------------------------------------------------------------------------------
# Chapters 09 to 11: a toy language-modelling task, and attention variants compared on it


def markov_sequences(transition: torch.Tensor, count: int, length: int, seed: int) -> torch.Tensor:
    """Draw ``count`` sequences of ``length`` tokens from a second-order Markov chain.

    The first two tokens of each sequence are uniform; token ``t`` is drawn from
    ``transition[token[t - 2], token[t - 1]]``. A generator seeded with ``seed`` draws them, so the
    global random state is left alone.

    Args:
        transition: ``p(next | two before)``, each row a distribution over the ``V`` symbols.
        count, length: how many sequences, and their length (at least 2).
        seed: the generator's seed.

    Shape:
        transition: ``(V, V, V)`` -> tokens: ``(count, length)``, dtype ``torch.long``
    """
    if not (isinstance(transition, torch.Tensor) and transition.dim() == 3
            and transition.size(0) == transition.size(1) == transition.size(2)):
        raise ValueError(f"transition must be a (V, V, V) tensor, got {describe(transition)}")
    check_positive_int("count", count)
    check_positive_int("length", length)
    if length < 2:
        raise ValueError(f"length must be at least 2 (the two tokens every prediction depends on), got {length}")
    check_positive_int("seed", seed, allow_zero=True)
    vocab_size = transition.size(0)
    generator = torch.Generator().manual_seed(seed)
    transition = transition.detach().cpu()
    tokens = torch.empty(count, length, dtype=torch.long)
    tokens[:, :2] = torch.randint(0, vocab_size, (count, 2), generator=generator)
    for t in range(2, length):
        rows = transition[tokens[:, t - 2], tokens[:, t - 1]]  # (count, V)
        tokens[:, t] = torch.multinomial(rows, 1, generator=generator)[:, 0]
    return tokens


def _lm_loss(model: nn.Module, batch: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy: ``model(batch[:, :-1])`` predicts ``batch[:, 1:]``."""
    logits = model(batch[:, :-1])  # (B, T, V)
    return nn.functional.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction=reduction)  # (B, T) or ()


@dataclass(frozen=True)
class MarkovTask:
    """Next-token prediction on sequences of a random second-order Markov chain (chapters 09 to 11).

    Each token depends on the two before it only, at every position: a model that learned the rule at
    positions 0 to 31 knows it at every position, which is what chapter 09's "train short, test long"
    experiment needs, and a model needs only the last two tokens, which chapter 10's key/value heads
    can carry. Made by :func:`markov_task`.

    Attributes:
        transition: ``p(next | two before)``, ``(V, V, V)``.
        train_tokens: ``(N, T_train + 1)``: inputs and their next tokens.
        test_tokens: ``(M, T_test + 1)``, drawn with another seed.
    """

    transition: torch.Tensor
    train_tokens: torch.Tensor
    test_tokens: torch.Tensor

    @property
    def vocab_size(self) -> int:
        return self.transition.size(0)

    def best_loss_per_position(self, tokens: torch.Tensor | None = None) -> torch.Tensor:
        """The chain's own loss at each position of ``tokens`` (default: the test set), averaged over
        the sequences: what a model that knew the table exactly would score, the floor of any model.

        Position ``t`` predicts token ``t + 1``: at ``t = 0`` that token is uniform (``ln V``), after
        that its loss is ``-log transition[token[t - 1], token[t], token[t + 1]]``.

        Shape:
            tokens: ``(M, T + 1)`` -> ``(T,)``
        """
        tokens = self.test_tokens if tokens is None else tokens
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.size(1) < 2 or tokens.is_floating_point():
            raise ValueError(f"tokens must be a (M, T + 1) tensor of token ids with T >= 1, got {describe(tokens)}")
        tokens = tokens.cpu()
        losses = torch.full((tokens.size(1) - 1,), math.log(self.vocab_size), dtype=torch.float64)
        if tokens.size(1) > 2:
            p = self.transition.double().cpu()[tokens[:, :-2], tokens[:, 1:-1], tokens[:, 2:]]  # (M, T - 1)
            losses[1:] = -p.log().mean(dim=0)
        return losses

    def best_loss(self, tokens: torch.Tensor | None = None) -> float:
        """:meth:`best_loss_per_position` averaged over every position, as :meth:`test_loss` averages."""
        return float(self.best_loss_per_position(tokens).mean())

    @torch.no_grad()
    def loss_per_position(self, model: nn.Module, tokens: torch.Tensor | None = None) -> torch.Tensor:
        """The model's next-token loss at each position of ``tokens`` (default: the test set), averaged
        over the sequences, in evaluation mode, on the model's device.

        Shape:
            tokens: ``(M, T + 1)`` -> ``(T,)`` on the CPU
        """
        tokens = self.test_tokens if tokens is None else tokens
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        try:
            losses = _lm_loss(model, tokens.to(device), reduction="none")  # (M, T)
        finally:
            model.train(was_training)
        return losses.mean(dim=0).cpu()

    def test_loss(self, model: nn.Module) -> float:
        """The model's mean next-token loss over every position of the test set (nats)."""
        return float(self.loss_per_position(model).mean())

    def train(self, model: nn.Module, steps: int, *, batch_size: int = 32, lr: float = 3e-3, seed: int = 1,
              device: torch.device | str | None = None, progress: bool = False) -> History:
        """Train ``model`` with :func:`fit` on batches of ``batch_size`` training sequences drawn (with
        replacement) by a generator seeded with ``seed``; return the :class:`History`. The model is
        left in evaluation mode."""
        check_positive_int("batch_size", batch_size)
        check_positive_int("seed", seed, allow_zero=True)
        generator = torch.Generator().manual_seed(seed)
        rows = self.train_tokens.size(0)

        def make_batch(step: int) -> torch.Tensor:
            return self.train_tokens[torch.randint(0, rows, (batch_size,), generator=generator)]  # (B, T + 1)

        history = fit(model, make_batch, _lm_loss, steps=steps, lr=lr, device=device, progress=progress)
        model.eval()
        return history


def markov_task(vocab_size: int = 12, *, train_sequences: int = 4096, train_length: int = 32,
                test_sequences: int = 512, test_length: int = 32, sharpness: float = 3.0, seed: int = 0) -> MarkovTask:
    """A random second-order Markov chain over ``vocab_size`` symbols, and training and test sequences.

    The table is ``softmax(sharpness * N(0, 1))`` over the next symbol (generator seeded with
    ``seed``): peaked, so that the best possible loss (about 0.97 nats for the defaults) is well
    below guessing (``ln 12 = 2.48``). The training sequences are drawn with ``seed + 1``, the test
    sequences with ``seed + 2``.

    Args:
        vocab_size: ``V``.
        train_sequences, train_length: ``N`` training sequences of ``train_length`` inputs (each
            stored with its next token: ``train_length + 1`` tokens).
        test_sequences, test_length: the same for the test set.
        sharpness: how peaked the table is.
        seed: the table's seed.
    """
    check_positive_int("vocab_size", vocab_size)
    for name, value in (("train_sequences", train_sequences), ("train_length", train_length),
                        ("test_sequences", test_sequences), ("test_length", test_length)):
        check_positive_int(name, value)
    if isinstance(sharpness, bool) or not isinstance(sharpness, (int, float)) or not (sharpness > 0 and math.isfinite(sharpness)):
        raise ValueError(f"sharpness must be a positive finite number, got {sharpness!r}")
    check_positive_int("seed", seed, allow_zero=True)
    generator = torch.Generator().manual_seed(seed)
    transition = (torch.randn(vocab_size, vocab_size, vocab_size, generator=generator) * sharpness).softmax(dim=-1)
    train_tokens = markov_sequences(transition, train_sequences, train_length + 1, seed + 1)
    test_tokens = markov_sequences(transition, test_sequences, test_length + 1, seed + 2)
    return MarkovTask(transition, train_tokens, test_tokens)


@dataclass
class QualityResult:
    """One attention variant trained on a :class:`MarkovTask` with several seeds (:func:`quality_vs_cache`).

    Attributes:
        name: the variant's name.
        test_losses: the test loss of each seed's model, in the order of the seeds.
        cache_bytes_per_token: the bytes its cache keeps per token and sequence, all layers together,
            in the model's dtype (``model.new_cache(...).bytes_per_token``); None for a model without
            such a cache.
        models: the trained models, one per seed (in evaluation mode).
    """

    name: str
    test_losses: list[float]
    cache_bytes_per_token: int | None
    models: list[nn.Module] = field(repr=False, default_factory=list)

    @property
    def mean(self) -> float:
        return sum(self.test_losses) / len(self.test_losses)

    @property
    def low(self) -> float:
        return min(self.test_losses)

    @property
    def high(self) -> float:
        return max(self.test_losses)


def quality_vs_cache(builders: Mapping[str, Callable[[], nn.Module]], task: MarkovTask, *,
                     seeds: Sequence[int] = (0, 1, 2), steps: int = 250, batch_size: int = 32, lr: float = 3e-3,
                     device: torch.device | str | None = None) -> dict[str, QualityResult]:
    """Train each variant once per seed on ``task`` and measure its test loss and its cache per token.

    Chapter 10 compares multi-head, grouped-query and multi-query attention with it, chapter 11
    multi-head latent attention with the same settings, so that their tables can be read together.
    For each seed ``s`` the global generator is seeded with ``s`` before ``build()`` (the initial
    weights) and the batches are drawn with seed ``s + 1``: every variant sees the same batches.

    Args:
        builders: a name and a function that builds a fresh model, per variant, e.g.
            ``{"G = 8": lambda: DecoderOnlyLM(12, d_model=32, num_heads=8, num_kv_heads=8, ...)}``.
        task: the data (:func:`markov_task`).
        seeds: one training run per seed.
        steps, batch_size, lr: of :meth:`MarkovTask.train`.
        device: where to train (default: where each built model is).

    Returns:
        A :class:`QualityResult` per name, in the order of ``builders``.
    """
    if not isinstance(builders, Mapping) or not builders:
        raise TypeError(f"builders must be a non-empty mapping of names to model builders, got {describe(builders)}")
    for name, build in builders.items():
        if not callable(build):
            raise TypeError(f"builders[{name!r}] must be a function that returns a new model, got {describe(build)}")
    if isinstance(seeds, (int, str)) or not seeds:
        raise TypeError(f"seeds must be a non-empty sequence of ints, got {seeds!r}")
    for seed in seeds:
        check_positive_int("every seed", seed, allow_zero=True)
    results = {}
    for name, build in builders.items():
        losses, models = [], []
        for seed in seeds:
            torch.manual_seed(seed)
            model = build()
            if not isinstance(model, nn.Module):
                raise TypeError(f"builders[{name!r}]() must return an nn.Module, got {describe(model)}")
            task.train(model, steps, batch_size=batch_size, lr=lr, seed=seed + 1, device=device)
            losses.append(task.test_loss(model))
            models.append(model)
        per_token = None
        new_cache = getattr(models[0], "new_cache", None)
        if callable(new_cache):
            cache = new_cache(1, task.test_tokens.size(1))
            per_token = getattr(cache, "bytes_per_token", None)
        results[name] = QualityResult(name, losses, per_token, models)
    return results
