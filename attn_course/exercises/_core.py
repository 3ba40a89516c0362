"""The objects of the check mechanism that must keep their identity when the mechanism is reloaded.

``attn_course.exercises.fresh_check`` (and graders that call ``importlib.reload`` on
``attn_course.exercises``) re-execute the mechanism's ``__init__`` from disk. Chapter modules imported
before that keep references to ``Mismatch``, ``NotAttempted`` and ``Feedback``; defining them here, in a
module that is never reloaded, keeps those references valid, so a check imported earlier still works
after a grader's reload. The graded-mode switch lives here for the same reason: a reload must not
turn it off.
"""

from __future__ import annotations

import contextvars
import os
from dataclasses import dataclass
from typing import Any

__all__ = ["Feedback", "ExerciseInfo", "mutable", "NotAttempted", "Mismatch", "set_graded", "is_graded", "GRADED_ENV"]

GRADED_ENV = "ATTN_COURSE_GRADED"
_ICONS = {"correct": "✅", "incorrect": "❌", "not attempted": "📝", "error": "⚠️"}
_TRUE = ("1", "true", "yes", "on")

# None: follow the environment variable; True or False: set_graded() decided.
_graded_override: bool | None = None

# The check that is running (set by ``exercise``; read by ``call``): its forbidden routes and options.
ACTIVE_CHECK: contextvars.ContextVar = contextvars.ContextVar("attn_course_active_check", default=None)


def set_graded(graded: bool | None = True) -> None:
    """Turn graded mode on (``True``) or off (``False``); ``None`` follows ``ATTN_COURSE_GRADED`` again.

    In graded mode every :class:`Feedback` leaves out its hint: the verdict and the named mistake stay.
    """
    global _graded_override
    if graded is not None and not isinstance(graded, bool):
        raise TypeError(f"graded must be True, False or None, got {type(graded).__name__} {graded!r}")
    _graded_override = graded


def is_graded() -> bool:
    """True in graded mode: ``set_graded(True)`` was called, or ``ATTN_COURSE_GRADED=1`` is set."""
    if _graded_override is not None:
        return _graded_override
    return os.environ.get(GRADED_ENV, "").strip().lower() in _TRUE


@dataclass(frozen=True)
class Feedback:
    """The outcome of one check: ``status`` is "correct", "incorrect", "not attempted" or "error".

    ``bool(feedback)`` is True only for a correct answer; :meth:`assert_correct` raises otherwise (for
    nbgrader's test cells). In graded mode (:func:`set_graded`) the hint is left out.
    """

    title: str
    status: str
    message: str
    hint: str | None = None

    def __bool__(self) -> bool:
        return self.status == "correct"

    def __str__(self) -> str:
        lines = [f"{_ICONS.get(self.status, '?')} {self.title}: {self.status}.", self.message]
        if self.hint and self.status in ("incorrect", "error") and not is_graded():
            lines.append(f"Hint: {self.hint}")
        return "\n".join(line for line in lines if line)

    __repr__ = __str__

    def assert_correct(self) -> "Feedback":
        """Return this feedback if the answer is correct; raise ``AssertionError(str(self))`` otherwise.

        "not attempted" and "error" fail too. nbgrader's autograded test cells call it, so that the
        cell fails exactly when the check says the answer is not right, with the check's message.
        """
        if self.status != "correct":
            raise AssertionError(str(self))
        return self


@dataclass(frozen=True)
class ExerciseInfo:
    """What ``@exercise`` knows about a check (``check.__exercise__``): its title, hint and forbids."""

    title: str
    hint: str | None
    forbid: tuple


class mutable:
    """Mark an argument of :func:`call` that the student's function may (or must) change in place.

    ``call(step, query, mutable(cache_keys), mutable(cache_values), length)`` passes the tensors
    themselves and does not report their change.
    """

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"mutable({self.value!r})"


class NotAttempted(Exception):
    """The answer is still the scaffold that was handed out."""


class Mismatch(Exception):
    """The answer was attempted but is wrong; the message says how."""


class _StudentCodeFailed(Exception):
    """The student's code raised; ``error`` is what it raised."""

    def __init__(self, error: BaseException, called_with: str = "") -> None:
        super().__init__(str(error))
        self.error = error
        self.called_with = called_with  # "x of shape (1, 3, 6)": the inputs it failed on
