"""Exercise checks: friendly, specific feedback, and one mechanism that every check uses.

Every check returns a :class:`Feedback` that prints as a short message: what was expected, what came
back and a hint; never a bare traceback. A scaffold left as it was handed out (``...``, ``None`` or
``raise NotImplementedError``) gets "not attempted yet", so that student versions run top to bottom.
``bool(feedback)`` is True only for a correct answer; ``feedback.assert_correct()`` raises
``AssertionError(str(feedback))`` otherwise (nbgrader's test cells). Each chapter's checks live in
their own module (``attn_course.exercises.ch02`` ...); its table of wrong answers is in
``tests/test_exercises_chNN.py``.

How to write a check
--------------------
A check is as good as the wrong answers it rejects. Follow this order:

1. ``@exercise(title, hint=..., forbid=(...))``. The hint points the way in words (which axis, which
   idea), never code: no assignment, no ``x.max(...).values`` chain, no ``torch.exp(...)`` call, no
   slicing; ``tests/test_exercise_mechanism.py`` scans every hint (its ``PASTED_HINTS`` lists today's
   offenders as strict xfails: rewrite the hint, then delete its entry). ``forbid`` lists what the
   exercise says not to use, as family names or callables (below); it applies to every ``call`` of the
   check and never to the check's own reference computation. For one call only:
   ``with forbidden("tril"): got = call(fn, T)``.
2. Inputs from ``rng(seed)`` (``randn(..., generator=g)``), never the global generator. Try the
   notebook's sizes, then sizes unlike them: ``other_sizes()`` (batch 1 and 3, ``L != S``, one query,
   ``B == L == S``, odd widths, one head), ``padding_cases()`` (right and left padding),
   ``large_scores()`` (about +-100 in float32, where a softmax without its max shift overflows).
3. Run the student's code only through ``call(fn, *args, **kwargs)``: it applies ``forbid`` (the
   first forbidden call becomes "you called torch.log_softmax: this exercise asks you to write the
   softmax yourself"), reports an input changed in place ("your function changed its input `scores`
   in place ..."; wrap an argument in ``mutable(x)`` when the exercise asks to change it), turns a
   crash into an "error" feedback that names the inputs it failed on ("called with x of shape
   (1, 3, 6)") and a stub into "not attempted". Pass the inputs themselves (no ``.clone()``: ``call``
   watches them). An answer that is a value, not a function: ``attempted(value)``.
4. Unpack and type-check: ``expect_sequence(result, length=2, what=..., names=("context",
   "weights"))`` (a tuple or a list), ``expect_int`` / ``expect_number`` (numpy integers and floats,
   one-element tensors too), ``expect_tensor(got, what=..., shape=..., dtype=..., device=...)``;
   ``dtype`` is a ``torch.dtype`` or ``"float"``, ``"integer"``, ``"bool"``.
5. Name the mistakes: compute each plausible wrong answer (wrong axis, scale, mask convention,
   padding side ...) and ``raise Mismatch("<what>: <the mistake, in words>")`` (or
   ``expect(condition, message)``) when the answer equals one of them, before the generic comparison.
6. ``expect_close(got, expected, what=...)``: the same shape, the kind of dtype (floats for floats,
   integers for ids, bools for masks; an exact dtype only with ``dtype=``), the device of ``expected``
   (which the check computed from the inputs), and values within the tolerance of the less precise of
   the two dtypes: float32 ``atol=1e-5, rtol=1e-4`` (a right answer computed in another order passes
   even on scores of 1000, which float32 holds only to 6e-5; an answer off by 1e-3 of its size, or
   computed in float16, does not), float64 ``1e-7``, float16 ``1e-3``, bfloat16 ``1e-2``. Pass
   ``atol=``/``rtol=`` only with a reason in a comment.
7. ``return`` the success message (it prints after "correct").

Worked example::

    @exercise("Exercise 1, a softmax that does not overflow",
              hint="subtract each row's own maximum before exponentiating", forbid=("softmax",))
    def check_stable_softmax(stable_softmax):
        g = rng(1)
        for x in (randn(3, 5, generator=g), randn(2, 3, 4, generator=g), large_scores(4, 6, generator=g)):
            what = f"stable_softmax(x) for x of shape {tuple(x.shape)}"
            got = expect_tensor(call(stable_softmax, x), what=what, shape=x.shape, dtype="float")
            if torch.allclose(got.double(), torch.softmax(x.double(), dim=0)):
                raise Mismatch(f"{what}: you normalised over the first axis; normalise over the last")
            expect_close(got, torch.softmax(x, dim=-1), what=what)
        return "your softmax matches torch.softmax over the last axis"

Families for ``forbid`` (strings; any callable works too, and nn.Module classes or instances forbid
their ``forward``):

- ``"softmax"``: softmax, log_softmax (so ``log_softmax(...).exp()``), softmin, gumbel_softmax by every
  torch route (``torch.*``, ``F.*``, ``torch.special.*``, Tensor methods, ``torch._softmax``,
  ``torch.ops.aten.*``, ``torch.masked``, ``torch.sparse``, ``torch._refs``), ``nn.Softmax``,
  ``nn.LogSoftmax``, ``nn.Softmin``, scipy's, ``attn_course.online_softmax``.
- ``"tril"``: tril, triu (and ``tril_``, ``triu_``), tril_indices, triu_indices by every torch route;
  numpy's tril, triu, tri, ..._indices; ``nn.Transformer.generate_square_subsequent_mask``;
  ``attn_course.causal_mask`` and ``sliding_window_mask``.
- ``"sdpa"`` (alias ``"attention"``): ``F.scaled_dot_product_attention`` and its aten kernels,
  ``F.multi_head_attention_forward``, ``nn.MultiheadAttention``, flex_attention, and every
  attn_course function or class whose name contains "attention".
- ``"enable_gqa"``: ``F.scaled_dot_product_attention(..., enable_gqa=True)`` and
  ``attn_course.GroupedQueryAttention``.
- ``"attn_course"`` (alias ``"package"``): every function and class of the package (not its
  exercises, plotting, widgets, diagrams or utils).

A check that hands the student a package module to use (chapter 05's ``mha``, chapter 07's
``layer``) must not forbid ``"sdpa"`` or ``"attn_course"`` (they cover that module's forward); forbid
the object itself around the call (``with forbidden(mha): got = call(fn, queries, mha)`` bans its
class's forward). Graded mode: ``ATTN_COURSE_GRADED=1`` or ``set_graded(True)`` leaves every
hint out. Graders load a check afresh with ``fresh_check("ch02", "check_stable_softmax")``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import numbers
import pkgutil
import random
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from ..utils import get_device
from . import _core, _device, _gradients, _guards, _inputs
from ._cases import Sizes, large_scores, other_sizes, padding_cases, padding_mask_for, randn, rng
from ._core import ACTIVE_CHECK, ExerciseInfo, Feedback, Mismatch, NotAttempted, _StudentCodeFailed, is_graded, set_graded
from ._guards import FAMILIES, forbidden
from ._inputs import mutable

__all__ = [
    "Feedback",
    "NotAttempted",
    "Mismatch",
    "exercise",
    "ExerciseInfo",
    "call",
    "attempted",
    "mutable",
    "forbidden",
    "FAMILIES",
    "expect",
    "expect_close",
    "expect_tensor",
    "expect_same_device",
    "other_device",
    "call_elsewhere",
    "expect_on_device",
    "expect_int",
    "expect_number",
    "expect_sequence",
    "expect_gradients",
    "tolerance",
    "rng",
    "randn",
    "Sizes",
    "other_sizes",
    "padding_mask_for",
    "padding_cases",
    "large_scores",
    "set_graded",
    "is_graded",
    "fresh_check",
    "iter_checks",
]

NOT_ATTEMPTED_MESSAGE = "Not attempted yet: replace the `...` placeholder with your answer and run the cell again."


# --------------------------------------------------------------------------------------------------
# Calling the student's code


def attempted(answer: Any) -> Any:
    """Return ``answer``, or raise :class:`NotAttempted` if it is a placeholder (``...`` or None)."""
    if answer is ... or answer is None:
        raise NotAttempted
    return answer


def call(fn: Callable, *args, **kwargs) -> Any:
    """Call the student's ``fn(*args, **kwargs)`` and return its result, watched.

    - The routes that the running check forbids (``@exercise(forbid=...)``), and those of any
      :func:`forbidden` block around this call, are watched while ``fn`` runs; the first one it used
      raises :class:`Mismatch` ("you called torch.log_softmax: ..."). So does calling the code of a
      chapter's check module (``attn_course.exercises.chNN``: its reference answers), except what the
      check passed to ``fn`` itself (a model, a callback).
    - A stub (``...``/None result, ``NotImplementedError``) raises :class:`NotAttempted`; any other
      exception of the student's becomes an "error" feedback without a traceback.
    - Every input is copied first and compared afterwards (tensors, also inside lists, tuples and
      dicts, an ``nn.Module``'s parameters and buffers): a change raises :class:`Mismatch` naming the
      argument. Wrap an argument in :func:`mutable` when the exercise asks to change it in place.
    """
    if not callable(fn):
        if fn is ... or fn is None:
            raise NotAttempted
        raise Mismatch(f"expected a function, got {type(fn).__name__} {fn!r}")
    args, kwargs, marked = _inputs.unwrap(args, kwargs)
    saved = _inputs.snapshot(fn, args, kwargs, marked)
    context = ACTIVE_CHECK.get()
    routes = context.forbid if context is not None else ()
    outer = _guards.active_guards()
    marks = [(guard, len(guard.violations)) for guard in outer]
    failure: BaseException | None = None
    result = None
    # Always watched: the check's own code (its reference answer), unless the check passed it in.
    guard = forbidden(*routes, check_code=(fn, args, kwargs))
    guard.__enter__()
    try:
        result = fn(*args, **kwargs)
    except Exception as error:  # the student's code failed: reported below, without a traceback
        failure = error
    finally:
        guard._exit_quietly()
    violation = None
    for watcher, before in [(guard, 0)] + marks:
        if len(watcher.violations) > before and violation is None:
            violation = watcher.violations[before]
        watcher.reported = len(watcher.violations)
    if violation is not None:
        raise Mismatch(violation.message)
    if isinstance(failure, NotImplementedError):
        raise NotAttempted
    if failure is not None:
        raise _StudentCodeFailed(failure, _inputs.describe_arguments(fn, args, kwargs))
    change = _inputs.first_change(saved)
    if change is not None:
        path, what = change
        raise Mismatch(f"your function changed its input `{path}` in place ({what}): work on a copy, so that "
                       "the caller's data stays as it was")
    _mark_input_dtype(result, _floating_dtype_of((args, kwargs)))
    return attempted(result)


# --------------------------------------------------------------------------------------------------
# Another device: where a check tries the answer once more


def other_device() -> torch.device:
    """The notebook's accelerator where there is one (CUDA, then Apple's MPS), else PyTorch's "meta" device,
    which has shapes and dtypes but no values. A tensor the answer makes without ``device=`` lives on the
    CPU, and mixing it with the inputs fails on meta as it does on a GPU: trying one case there names it."""
    device = get_device()  # the chapters' own choice: CUDA, then MPS, then the CPU
    return device if device.type != "cpu" else torch.device("meta")


def _meta_note(device: torch.device) -> str:
    return (" (the meta device stands for a GPU here: its tensors have shapes and dtypes but no values)"
            if device.type == "meta" else "")


class _NoData(RuntimeError):
    """A NotImplementedError raised on the meta device ("Cannot copy out of meta tensor; no data!"): passed
    on as an error, not taken for the scaffold's ``raise NotImplementedError``."""


_NEW_TENSORS = "torch.zeros, torch.full, torch.tensor, torch.arange ..."


def call_elsewhere(fn: Callable, *args, device: torch.device, what: str, made_by: str = _NEW_TENSORS,
                   copy_out_is_a_mistake: bool = True, reading_values_is_a_mistake: bool = False,
                   cpu_args: tuple | None = None) -> Any:
    """:func:`call` with ``args`` already on ``device`` (from :func:`other_device`). Returns the result, or
    None where the meta device cannot judge the answer (it needed values: ``.item()``, an ``if`` on a tensor;
    the CPU cases judged it). An answer that made a tensor on the CPU, or moved data to numpy, raises
    :class:`Mismatch` saying so; ``made_by`` lists the constructors the message names. On the meta device,
    data copied out of an input ("Cannot copy out of meta tensor": ``.cpu()``, ``.tolist()``) is named as a
    move to the CPU unless ``copy_out_is_a_mistake=False`` (where the exercise's right answers may copy
    out and back: then the answer is not judged there).

    ``cpu_args``: the same arguments on the CPU. Where the meta device cannot run the answer, it then runs
    on them under a :class:`~attn_course.exercises._device.DeviceWatch`, which names a tensor made without
    ``device=`` that meets the inputs, and a result left on the CPU (returns None: the values were compared
    by the CPU cases). ``reading_values_is_a_mistake=True`` (an exercise whose statement forbids bringing
    values to the host: ``.item()``, ``float(t)``, ``.tolist()``, an ``if`` on a tensor) names such a read
    on every device, the GPU's included, where it would run."""
    @functools.wraps(fn)
    def answer(*a, **k):
        try:
            return fn(*a, **k)
        except NotImplementedError as error:
            if device.type == "meta":
                raise _NoData(str(error)) from None
            raise

    def name_read(read: str) -> None:
        shown = {"__bool__": "an if or bool() on a tensor", "__float__": "float() of a tensor",
                 "__int__": "int() of a tensor", "__index__": "a tensor used as a Python int"}.get(read, f".{read}()")
        raise Mismatch(f"{what}: your code brings a value from the device to the host ({shown}): this exercise "
                       "asks for tensor operations only, which stay on the inputs' device (on a GPU each such "
                       "read waits for the device and copies to the CPU)")

    if device.type == "meta":  # a module's meta parameters cannot be compared: the CPU cases watched for changes
        args = tuple(mutable(a) if isinstance(a, torch.nn.Module) else a for a in args)
    try:
        if reading_values_is_a_mistake and device.type != "meta":  # a GPU runs the read: watch for it
            with _device.DeviceWatch(*args) as watch:
                result = call(answer, *args)
            if watch.read is not None:
                name_read(watch.read)
            return result
        return call(answer, *args)
    except _StudentCodeFailed as failed:
        error, text = failed.error, str(failed.error)
        lowered, first = text.lower(), (text.splitlines()[0] if text else "")
        kind = "NotImplementedError" if isinstance(error, _NoData) else type(error).__name__
        if "numpy" in lowered and "device" in lowered:
            raise Mismatch(f"{what}: your code raised {kind}: {first}{_meta_note(device)}. numpy holds only CPU "
                           "data: copy with .cpu() before .numpy(), and put the result back on the inputs' "
                           "device") from None
        # A CPU tensor met the inputs ("... on the expected device cpu", "found ... cuda:0 and cpu"), or data was
        # copied out of a meta tensor into one. Other errors of the meta device are not the student's: it
        # refuses a 0-dimensional CPU value in masked_fill, which CUDA accepts.
        copied_out = isinstance(error, _NoData) and "copy" in lowered
        if ("device" in lowered and "cpu" in lowered and not copied_out) or (copied_out and copy_out_is_a_mistake):
            raise Mismatch(f"{what}: your code raised {kind}: {first}{_meta_note(device)}. It works only with CPU "
                           f"tensors: a tensor made without device= ({made_by}) lives on the CPU, whatever the "
                           "inputs: make new tensors on the inputs' device (device= from an input, or zeros_like, "
                           "new_zeros, full_like)") from None
        if device.type != "meta":
            raise
        value_read = "item() cannot be called on meta tensors" in text  # .item(), float(), int(), bool() of a tensor
    # The meta device could not run the answer: it needed values.
    if cpu_args is not None:
        with _device.DeviceWatch(*cpu_args) as watch:
            result = call(fn, *cpu_args)
        if reading_values_is_a_mistake and watch.read is not None:
            name_read(watch.read)
        if watch.mixed is not None:
            raise Mismatch(f"{what}: your code reads a tensor's value, so the meta device (which stands for a GPU "
                           "here and has no values) cannot run it. Run on the CPU instead, your code mixed a tensor "
                           f"made without device= ({made_by}), which lives on the CPU whatever the inputs, with "
                           f"tensors computed from the inputs in `{watch.mixed}`: on a GPU that fails. Make new "
                           "tensors on the inputs' device (device= from an input, or zeros_like, new_zeros, full_like)")
        if watch.off_device(result):
            raise Mismatch(f"{what}: your code reads a tensor's value, so the meta device (which stands for a GPU "
                           "here and has no values) cannot run it. Run on the CPU instead, your result is made "
                           f"without device= ({made_by}, or data brought to the host with .tolist(), .numpy(), "
                           ".item()): on a GPU it would be on the CPU, not on the inputs' device. Make it on the "
                           "inputs' device (device= from an input, or zeros_like, new_zeros, full_like), or move it "
                           "back with .to(input.device)")
    elif reading_values_is_a_mistake and value_read:
        name_read("item")
    return None


def expect_on_device(got: Any, device: torch.device, what: str, dtype: Any = None) -> torch.Tensor:
    """``got`` as a tensor on ``device``'s type, or :class:`Mismatch` naming a result made on a fixed device."""
    got = expect_tensor(got, what=what, dtype=dtype)
    if got.device.type != device.type:
        raise Mismatch(f"{what}: the inputs are on the {device.type} device{_meta_note(device)} but your result is "
                       f"on {got.device}: make new tensors on the inputs' device (device= from an input, or "
                       "zeros_like, new_zeros, full_like), never on a fixed one")
    return got


_INPUT_DTYPE = "_attn_course_input_dtype"  # set on each result tensor of call(): its inputs' float dtype


def _floating_dtype_of(value: Any, depth: int = 0) -> torch.dtype | None:
    """The dtype that PyTorch's promotion gives the floating-point tensors in ``value`` (tensors, also
    inside lists, tuples and dicts, and an ``nn.Module``'s parameters), or None when there are none."""
    found = None
    if isinstance(value, torch.Tensor):
        return value.dtype if value.is_floating_point() else None
    if depth > 4:
        return None
    if isinstance(value, torch.nn.Module):
        items = list(value.parameters()) + [b for b in value.buffers() if b.is_floating_point()]
    elif isinstance(value, dict):
        items = list(value.values())
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        return None
    for item in items:
        dtype = _floating_dtype_of(item, depth + 1)
        if dtype is not None:
            found = dtype if found is None else torch.promote_types(found, dtype)
    return found


def _mark_input_dtype(result: Any, dtype: torch.dtype | None, depth: int = 0) -> None:
    """Remember on each floating-point tensor of ``result`` the dtype its inputs had (for expect_close)."""
    if dtype is None or depth > 3:
        return
    if isinstance(result, torch.Tensor):
        if result.is_floating_point():
            try:
                setattr(result, _INPUT_DTYPE, dtype)
            except (AttributeError, TypeError):  # a tensor subclass without attributes: nothing to remember
                pass
    elif isinstance(result, (list, tuple)):
        for item in result:
            _mark_input_dtype(item, dtype, depth + 1)
    elif isinstance(result, dict):
        for item in result.values():
            _mark_input_dtype(item, dtype, depth + 1)


# --------------------------------------------------------------------------------------------------
# Expectations


def expect(condition: bool, message: str) -> None:
    """Raise :class:`Mismatch` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise Mismatch(message)


_KINDS = {
    "float": ("floating-point numbers", lambda t: t.is_floating_point()),
    "integer": ("integers (such as token ids, dtype torch.long)",
                lambda t: not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool),
    "bool": ("a bool tensor (True/False)", lambda t: t.dtype == torch.bool),
}


def _kind_of(dtype: torch.dtype) -> str | None:
    if dtype == torch.bool:
        return "bool"
    if dtype.is_floating_point:
        return "float"
    if dtype.is_complex:
        return None
    return "integer"


def _check_dtype(got: torch.Tensor, dtype: Any, what: str) -> None:
    if dtype is None:
        return
    if isinstance(dtype, str):
        if dtype not in _KINDS:
            raise ValueError(f"dtype must be a torch.dtype or one of {sorted(_KINDS)}, got {dtype!r}")
        words, test = _KINDS[dtype]
        if not test(got):
            raise Mismatch(f"{what}: expected {words}, got dtype {got.dtype}")
        return
    allowed = tuple(dtype) if isinstance(dtype, (tuple, list, set)) else (dtype,)
    if got.dtype not in allowed:
        wanted = " or ".join(str(d) for d in allowed)
        raise Mismatch(f"{what}: expected dtype {wanted}, got {got.dtype}")


def _as_device(device: Any) -> torch.device:
    return device.device if isinstance(device, torch.Tensor) else torch.device(device)


def expect_same_device(got: torch.Tensor, like: Any, *, what: str) -> None:
    """Raise :class:`Mismatch` unless ``got`` is on the device of ``like`` (a tensor or a device)."""
    want = _as_device(like)
    have = got.device
    same = have == want or (have.type == want.type and (want.index is None or have.index is None))
    if not same:
        raise Mismatch(f"{what}: your result is on {have}, but the inputs are on {want}: create new tensors on "
                       "the inputs' device (their .device), not on a fixed one")


def expect_tensor(got: Any, *, what: str, shape=None, dtype=None, device=None, convert: bool = False) -> torch.Tensor:
    """Check that ``got`` is a tensor with the given shape, dtype and device, and return it.

    Args:
        got: the student's result.
        what: what it is, for the message ("weights for x of shape (2, 4, 3)").
        shape: the expected shape, or None.
        dtype: a ``torch.dtype`` (or several) for an exact dtype; ``"float"``, ``"integer"`` or
            ``"bool"`` for a kind; None for any.
        device: a device or a tensor whose device the result must share; None for any.
        convert: accept a list, tuple or numpy array of numbers too (returned as a tensor).
    """
    if convert and not isinstance(got, torch.Tensor):
        numpy = sys.modules.get("numpy")
        if isinstance(got, (list, tuple)) or (numpy is not None and isinstance(got, numpy.ndarray)):
            try:
                got = torch.as_tensor(got if not isinstance(got, (list, tuple)) else [_plain(v) for v in got])
            except (TypeError, ValueError, RuntimeError):
                raise Mismatch(f"{what}: expected numbers, got {got!r}") from None
    if not isinstance(got, torch.Tensor):
        raise Mismatch(f"{what}: expected a torch.Tensor, got {type(got).__name__}")
    if shape is not None and tuple(got.shape) != tuple(shape):
        raise Mismatch(f"{what}: expected shape {tuple(shape)}, got {tuple(got.shape)}")
    _check_dtype(got, dtype, what)
    if device is not None:
        expect_same_device(got, device, what=what)
    return got


_TOLERANCES = {  # dtype: (atol, rtol); see the module's guide
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1e-2, 1e-2),
    torch.float32: (1e-5, 1e-4),
    torch.float64: (1e-7, 1e-7),
}


def tolerance(*dtypes: torch.dtype) -> tuple[float, float]:
    """``(atol, rtol)`` for comparing values of these dtypes: that of the least precise floating one
    (complex counts as its real dtype); exact (0, 0) when none is floating."""
    worst = None
    for dtype in dtypes:
        if dtype.is_complex:
            dtype = torch.float32 if dtype == torch.complex64 else torch.float64
        if dtype.is_floating_point and dtype in _TOLERANCES:
            if worst is None or torch.finfo(dtype).eps > torch.finfo(worst).eps:
                worst = dtype
    return _TOLERANCES[worst] if worst is not None else (0.0, 0.0)


def expect_close(got: Any, expected: torch.Tensor, *, what: str, atol: float | None = None,
                 rtol: float | None = None, dtype=None, device: Any = True) -> None:
    """Check that ``got`` is a tensor like ``expected`` with close values; say where it is not.

    Shape must match exactly; the dtype must be of the same kind as ``expected``'s (floating point,
    integer or bool; ``dtype=`` asks for an exact one, see :func:`expect_tensor`); the device must be
    ``expected``'s (``device=True``, the default: the check computes ``expected`` from the inputs, so
    that is the inputs' device), another device, or ``None`` for any. ``atol``/``rtol`` default to
    :func:`tolerance` of the two dtypes. A floating-point ``got`` that :func:`call` returned in half
    precision (float16, bfloat16) from float32 or float64 inputs is a mistake unless ``dtype=`` says
    otherwise: its looser tolerance would hide other mistakes (a scale off by 3e-4, say). A float32
    result of float64 inputs passes with float32's tolerance.
    """
    got = expect_tensor(got, what=what, shape=expected.shape)
    if dtype is None:
        kind = _kind_of(expected.dtype)
        if kind is not None and _kind_of(got.dtype) != kind and not (kind == "float" and got.is_complex()):
            _check_dtype(got, kind, what)
    else:
        _check_dtype(got, dtype, what)
    inputs_dtype = getattr(got, _INPUT_DTYPE, None)
    half = (torch.float16, torch.bfloat16)
    if dtype is None and inputs_dtype is not None and got.dtype in half and inputs_dtype not in half:
        raise Mismatch(f"{what}: your result is {got.dtype} but the inputs were {inputs_dtype}: compute in the "
                       "inputs' dtype (new tensors take dtype= from the inputs)")
    if device is True:
        expect_same_device(got, expected, what=what)
    elif device is not None and device is not False:
        expect_same_device(got, device, what=what)
    default_atol, default_rtol = tolerance(got.dtype, expected.dtype)
    atol = default_atol if atol is None else atol
    rtol = default_rtol if rtol is None else rtol
    got = got.detach().to(device="cpu", dtype=torch.float64)
    want = expected.detach().to(device="cpu", dtype=torch.float64)
    if torch.isnan(got).any() and not torch.isnan(want).any():
        raise Mismatch(f"{what}: your result contains NaN at {int(torch.isnan(got).sum())} place(s)")
    close = torch.isclose(got, want, atol=atol, rtol=rtol, equal_nan=True)
    if not bool(close.all()):
        index = tuple(int(i) for i in (~close).nonzero()[0])
        raise Mismatch(
            f"{what}: {int((~close).sum())} of {close.numel()} values differ; first at index {index}: "
            f"{_two_numbers(float(want[index]), float(got[index]))}"
        )


def _two_numbers(expected: float, got: float) -> str:
    """'expected 2.0000, got 3.0000'; with more significant digits where four decimals would print the two
    alike ('expected 0.0045, got 0.0045' says nothing: 'expected 0.004481, got 0.004501')."""
    shown = f"expected {expected:.4f}, got {got:.4f}"
    if f"{expected:.4f}" != f"{got:.4f}" or expected == got:
        return shown
    for digits in range(4, 18):
        a, b = f"{expected:.{digits}g}", f"{got:.{digits}g}"
        if a != b:
            return f"expected {a}, got {b}"
    return shown


def _plain(value: Any) -> Any:
    """A numpy scalar or a one-element tensor as a Python number; anything else unchanged."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        return value.item()
    item = getattr(value, "item", None)
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.generic) and callable(item):
        return item()
    return value


def expect_int(got: Any, *, what: str) -> int:
    """Return ``got`` as a Python int: an int, a numpy integer or a one-element integer tensor.

    A bool, a float (even 3.0: the exercise asked for an integer) or anything else is a Mismatch.
    """
    value = _plain(got)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        shown = f"{type(got).__name__} {got!r}" if not isinstance(got, torch.Tensor) else f"a tensor of dtype {got.dtype}"
        raise Mismatch(f"{what}: return an integer, got {shown}")
    return int(value)


def expect_number(got: Any, *, what: str) -> float | int:
    """Return ``got`` as a Python int or float: ints, floats, numpy numbers, one-element tensors.

    A bool, a complex number, a string or a sequence is a Mismatch.
    """
    value = _plain(got)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise Mismatch(f"{what}: return a number, got {type(got).__name__} {got!r}")
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def expect_sequence(got: Any, *, what: str, length: int | None = None, names=None) -> tuple:
    """Return ``got`` as a tuple: a tuple or a list (not a tensor, string or dict) of ``length`` items.

    ``names`` (for the message) say what the items are: ``("context", "weights")``.
    """
    if names is not None and length is None:
        length = len(names)
    expected = f"({', '.join(names)})" if names else (f"{length} items" if length is not None else "a tuple")
    if not isinstance(got, (tuple, list)):
        raise Mismatch(f"{what}: return {expected} as a tuple; got {type(got).__name__}")
    if length is not None and len(got) != length:
        raise Mismatch(f"{what}: return {expected}; got {len(got)} item(s)")
    return tuple(got)


def expect_gradients(fn: Callable, args: tuple, reference: Callable, *, what: str, names: tuple | None = None) -> None:
    """One case with autograd on: the gradients of the answer's floating results with respect to every floating
    input and every parameter of a module argument, along one random direction, must be ``reference``'s. Names
    a result without gradient (``torch.no_grad()``, ``.detach()``), a ``backward()`` that raises (an in-place
    write into a tensor autograd saved), an input no gradient reaches, and a gradient that differs (one use of an
    input detached). See :mod:`attn_course.exercises._gradients`."""
    _gradients.expect_gradients(fn, args, reference, what=what, names=names, call=call)


# --------------------------------------------------------------------------------------------------
# The decorator


@dataclass(frozen=True)
class _CheckContext:
    forbid: tuple


def _save_rng() -> dict:
    state = {"torch": torch.get_rng_state(), "random": random.getstate()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    mps = getattr(torch, "mps", None)
    if mps is not None and getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        try:
            state["mps"] = mps.get_rng_state()
        except Exception:  # pragma: no cover - MPS without a generator yet
            pass
    return state


def _restore_rng(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["random"])
    if "numpy" in state:
        sys.modules["numpy"].random.set_state(state["numpy"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
    if "mps" in state:  # pragma: no cover - Apple only
        torch.mps.set_rng_state(state["mps"])


def exercise(title: str, hint: str | None = None, *, forbid=()):
    """Decorate a check: its ``return`` is the success message; the helpers raise the rest.

    Args:
        title: shown first ("Exercise 1, a softmax that does not overflow").
        hint: one sentence that points the way, in words (left out in graded mode).
        forbid: family names (``"softmax"``, ``"tril"``, ``"sdpa"``, ``"enable_gqa"``, ``"attn_course"``)
            and callables the exercise says not to use; watched during every :func:`call` of the check.

    The decorated check returns a :class:`Feedback` and leaves the global random states (torch, CUDA,
    Python, numpy) as it found them. ``check.__exercise__`` holds an :class:`ExerciseInfo`.
    """
    routes = _guards.check_routes(forbid)

    def decorate(check: Callable[..., str]) -> Callable[..., Feedback]:
        @functools.wraps(check)
        def run(*args, **kwargs) -> Feedback:
            shown_hint = None if is_graded() else hint
            state = _save_rng()
            token = ACTIVE_CHECK.set(_CheckContext(routes))
            try:
                message = check(*args, **kwargs)
            except NotAttempted:
                return Feedback(title, "not attempted", NOT_ATTEMPTED_MESSAGE)
            except Mismatch as wrong:
                return Feedback(title, "incorrect", str(wrong), shown_hint)
            except _StudentCodeFailed as failed:
                error = failed.error
                where = f" (called with {failed.called_with})" if getattr(failed, "called_with", "") else ""
                return Feedback(title, "error", f"Your code raised {type(error).__name__}: {error}{where}", shown_hint)
            finally:
                ACTIVE_CHECK.reset(token)
                _restore_rng(state)
            return Feedback(title, "correct", message or "Well done.")

        run.__exercise__ = ExerciseInfo(title=title, hint=hint, forbid=routes)
        return run

    return decorate


# --------------------------------------------------------------------------------------------------
# Graders


def _chapter_module_name(chapter: Any) -> str:
    text = str(chapter).strip()
    if text.startswith(__name__ + "."):
        text = text[len(__name__) + 1:]
    if text.startswith("ch"):
        text = text[2:]
    if not text.isdigit():
        raise ValueError(f"chapter must be like 'ch02', '02' or 2, got {chapter!r}")
    return f"{__name__}.ch{int(text):02d}"


def _same_code(a: Any, b: Any) -> bool:
    """Whether two class attributes or module functions do the same thing (compared by code)."""
    for wrapper in (staticmethod, classmethod, property):
        if isinstance(a, wrapper) and isinstance(b, wrapper):
            a, b = (a.fget, b.fget) if wrapper is property else (a.__func__, b.__func__)
    if inspect.isfunction(a) and inspect.isfunction(b):
        return a.__code__ == b.__code__ and a.__defaults__ == b.__defaults__
    if inspect.isfunction(a) or inspect.isfunction(b):
        return False
    if type(a).__name__ in ("member_descriptor", "getset_descriptor"):
        return type(a) is type(b)
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001  (values that cannot be compared count as changed)
        return False


def _changed_in_memory(module: Any) -> list[str]:
    """The classes and functions of ``module`` that differ from its source on disk.

    ``_core`` is never reloaded (see its docstring), so a notebook could replace, say,
    ``Feedback.assert_correct`` and pass every graded test cell; :func:`fresh_check` refuses then.
    """
    spec = importlib.util.spec_from_file_location(f"_pristine_{module.__name__.replace('.', '_')}", module.__file__)
    pristine = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = pristine  # dataclasses look their module up while the class is made
    try:
        spec.loader.exec_module(pristine)
    finally:
        del sys.modules[spec.name]
    missing = object()
    skip = {"__dict__", "__weakref__", "__module__", "__doc__", "__qualname__", "__annotations__",
            "__dataclass_fields__", "__dataclass_params__", "__static_attributes__", "__firstlineno__"}
    changed = []
    for name, original in vars(pristine).items():
        current = vars(module).get(name, missing)
        if inspect.isclass(original):
            if not inspect.isclass(current):
                changed.append(name)
                continue
            for key in (set(vars(original)) | set(vars(current))) - skip:
                if not _same_code(vars(original).get(key, missing), vars(current).get(key, missing)):
                    changed.append(f"{name}.{key}")
        elif inspect.isfunction(original) and not _same_code(original, current):
            changed.append(name)
    return sorted(changed)


def fresh_check(chapter: Any, name: str) -> Callable[..., Feedback]:
    """The real check ``name`` of ``chapter``, loaded afresh from disk, for graders.

    Reloads the mechanism (its private modules, then this package) and the chapter's module with
    ``importlib.reload``, so a notebook that redefined ``check_stable_softmax``, or assigned
    ``attn_course.exercises.ch02.check_stable_softmax`` or ``attn_course.exercises.call``, gets the real
    verdict. The exception classes and ``Feedback`` live in a module that is not reloaded, so checks
    imported earlier keep working, and graded mode stays as it was; instead, a ``_core`` whose classes
    or functions no longer match its source on disk (a notebook replaced ``Feedback.assert_correct``,
    say) makes it raise ``RuntimeError``, so the grader's test cell fails.

    Args:
        chapter: ``"ch02"``, ``"02"`` or ``2``.
        name: the check's name, ``"check_stable_softmax"``.
    """
    module_name = _chapter_module_name(chapter)
    if not isinstance(name, str) or not name.startswith("check_"):
        raise ValueError(f"name must be a check's name such as 'check_stable_softmax', got {name!r}")
    changed = _changed_in_memory(sys.modules[_core.__name__])
    if changed:
        raise RuntimeError(
            "the exercise mechanism was changed in this session (" + ", ".join(changed) + "): "
            "restart the kernel and run the notebook again without changing attn_course.exercises")
    for private in ("_guards", "_inputs", "_cases"):
        importlib.reload(importlib.import_module(f"{__name__}.{private}"))
    importlib.reload(sys.modules[__name__])
    module = importlib.reload(importlib.import_module(module_name))
    check = vars(module).get(name)
    if check is None or not isinstance(getattr(check, "__exercise__", None), ExerciseInfo):
        raise ValueError(f"{module_name} has no check named {name!r}")
    return check


def iter_checks() -> Iterator[tuple[str, str, Callable[..., Feedback]]]:
    """Yield ``(module, name, check)`` for every check of every chapter module (``ch01`` ...)."""
    package = sys.modules[__name__]
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if info.name.startswith("ch") and info.name[2:].isdigit():
            module = importlib.import_module(f"{__name__}.{info.name}")
            for attribute, value in vars(module).items():
                if attribute.startswith("check_") and isinstance(getattr(value, "__exercise__", None), ExerciseInfo) \
                        and getattr(value, "__module__", None) == module.__name__:
                    yield info.name, attribute, value
