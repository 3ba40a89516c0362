"""Exercise checks: friendly, specific feedback for the exercises at the end of each chapter.

Every check returns a :class:`Feedback` that prints as a short message: what was expected, what came
back and a hint; never a bare traceback. A scaffold left as it was handed out (``...``, ``None`` or
``raise NotImplementedError``) gets "not attempted yet", so that student versions of the chapters
run top to bottom. ``bool(feedback)`` is True only for a correct answer, for autograders.

Each chapter's checks live in their own module (``attn_course.exercises.ch02`` and so on), written
with the tools below::

    @exercise("Softmax by hand", hint="exponentiate, then divide by the row sum")
    def check_softmax(softmax):
        x = torch.randn(3, 5)
        got = call(softmax, x)
        expect_close(got, torch.softmax(x, dim=-1), what="softmax(x) for x of shape (3, 5)")
        return "your softmax matches torch.softmax"
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import torch

__all__ = [
    "Feedback",
    "NotAttempted",
    "Mismatch",
    "exercise",
    "call",
    "attempted",
    "expect",
    "expect_close",
    "expect_tensor",
]

_ICONS = {"correct": "✅", "incorrect": "❌", "not attempted": "📝", "error": "⚠️"}


@dataclass(frozen=True)
class Feedback:
    """The outcome of one check: ``status`` is "correct", "incorrect", "not attempted" or "error"."""

    title: str
    status: str
    message: str
    hint: str | None = None

    def __bool__(self) -> bool:
        return self.status == "correct"

    def __str__(self) -> str:
        lines = [f"{_ICONS[self.status]} {self.title}: {self.status}.", self.message]
        if self.hint and self.status in ("incorrect", "error"):
            lines.append(f"Hint: {self.hint}")
        return "\n".join(line for line in lines if line)

    __repr__ = __str__


class NotAttempted(Exception):
    """The answer is still the scaffold that was handed out."""


class Mismatch(Exception):
    """The answer was attempted but is wrong; the message says how."""


class _StudentCodeFailed(Exception):
    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def attempted(answer: Any) -> Any:
    """Return ``answer``, or raise :class:`NotAttempted` if it is a placeholder (``...`` or None)."""
    if answer is ... or answer is None:
        raise NotAttempted
    return answer


def call(fn: Callable, *args, **kwargs) -> Any:
    """Call the student's function; a placeholder body or result counts as not attempted."""
    if not callable(fn):
        if fn is ... or fn is None:
            raise NotAttempted
        raise Mismatch(f"expected a function, got {type(fn).__name__} {fn!r}")
    try:
        result = fn(*args, **kwargs)
    except NotImplementedError:
        raise NotAttempted from None
    except Exception as error:  # the student's code failed: report it without a traceback
        raise _StudentCodeFailed(error) from None
    return attempted(result)


def expect(condition: bool, message: str) -> None:
    """Raise :class:`Mismatch` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise Mismatch(message)


def expect_tensor(got: Any, *, what: str, shape=None, dtype=None) -> torch.Tensor:
    """Check that ``got`` is a tensor (with the given shape and dtype) and return it."""
    if not isinstance(got, torch.Tensor):
        raise Mismatch(f"{what}: expected a torch.Tensor, got {type(got).__name__}")
    if shape is not None and tuple(got.shape) != tuple(shape):
        raise Mismatch(f"{what}: expected shape {tuple(shape)}, got {tuple(got.shape)}")
    if dtype is not None and got.dtype != dtype:
        raise Mismatch(f"{what}: expected dtype {dtype}, got {got.dtype}")
    return got


def expect_close(got: Any, expected: torch.Tensor, *, what: str, atol: float = 1e-5, rtol: float = 1e-4) -> None:
    """Check that ``got`` is a tensor of ``expected``'s shape with close values; say where it is not."""
    got = expect_tensor(got, what=what, shape=expected.shape)
    got = got.detach().to(device="cpu", dtype=torch.float64)
    want = expected.detach().to(device="cpu", dtype=torch.float64)
    if torch.isnan(got).any() and not torch.isnan(want).any():
        raise Mismatch(f"{what}: your result contains NaN at {int(torch.isnan(got).sum())} place(s)")
    close = torch.isclose(got, want, atol=atol, rtol=rtol, equal_nan=True)
    if not bool(close.all()):
        index = tuple(int(i) for i in (~close).nonzero()[0])
        raise Mismatch(
            f"{what}: {int((~close).sum())} of {close.numel()} values differ; first at index {index}: "
            f"expected {float(want[index]):.4f}, got {float(got[index]):.4f}"
        )


def exercise(title: str, hint: str | None = None):
    """Decorate a check: its ``return`` is the success message; the helpers above raise the rest."""

    def decorate(check: Callable[..., str]) -> Callable[..., Feedback]:
        @functools.wraps(check)
        def run(*args, **kwargs) -> Feedback:
            try:
                message = check(*args, **kwargs)
            except NotAttempted:
                return Feedback(title, "not attempted", "Not attempted yet: replace the `...` placeholder with your answer and run the cell again.")
            except Mismatch as wrong:
                return Feedback(title, "incorrect", str(wrong), hint)
            except _StudentCodeFailed as failed:
                error = failed.error
                return Feedback(title, "error", f"Your code raised {type(error).__name__}: {error}", hint)
            return Feedback(title, "correct", message or "Well done.")

        return run

    return decorate
