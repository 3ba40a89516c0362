"""Forbidding functions by every route: the ``forbid=`` of :func:`attn_course.exercises.exercise`.

A check that asks the student to write something by hand forbids the library's versions of it while
the student's code runs, and only then (never around the check's own reference computation). Two
watchers see every route:

- a ``TorchFunctionMode`` sees every call of a torch function from Python: ``torch.X``,
  ``torch.nn.functional.X``, ``torch.special.X``, Tensor methods and their in-place forms,
  ``torch._X`` private aliases and ``torch.ops.aten.X`` (whatever module the function was imported
  from, also ``from torch import softmax``). Torch routes are matched by their *name*
  (``softmax``, ``_softmax``, ``special_softmax``, ``softmax_`` ...), so a new alias in a later torch
  is caught too;
- a profile hook (``sys.setprofile``) sees every call of a Python function: ``nn`` modules' forward
  (``nn.Softmax``, ``nn.MultiheadAttention``), numpy's and torch's own Python versions
  (``numpy.tril``, ``torch._refs.softmax``) and the course's package (``attn_course.*``), matched by
  the function's code object, so every alias of it counts.

Nothing is patched: leaving the guard pops the mode and restores the previous profile function, also
when the student's code raised, and guards nest. A forbidden call is recorded, not raised into the
student's code (a ``try``/``except`` there cannot hide it); the check then reports the first one:
"you called torch.log_softmax: this exercise asks you to write the softmax yourself".

Limits: a student can still undo anything in their own kernel (reassign ``torch.softmax`` before the
check runs, say); the guard sees calls made from Python in the current thread.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ._core import Mismatch, NotAttempted

__all__ = ["FAMILIES", "forbidden", "describe_families", "Violation"]


# --------------------------------------------------------------------------------------------------
# The families


@dataclass(frozen=True)
class _Family:
    """One named family of routes. ``torch_names`` are base names of torch functions (after
    :func:`_base_name`); ``torch_prefixes`` match base names by prefix; ``python_paths`` are dotted paths
    of Python callables (functions, or classes whose ``forward``/``__init__`` counts), resolved when a
    guard starts (a path whose module is not imported is skipped: nothing can call it without importing
    it, and the name scan of ``python_namespaces`` covers the torch and numpy modules that torch loads);
    ``package`` selects code of the attn_course package by its top-level name."""

    name: str
    reason: str
    covers: str
    torch_names: frozenset = frozenset()
    torch_prefixes: tuple = ()
    python_paths: tuple = ()
    python_namespaces: tuple = ()
    package: Callable[[str], bool] | None = None
    torch_predicate: Callable[[str, tuple, dict], bool] | None = None
    package_frame_predicate: Callable[[Any], bool] | None = None
    predicate_note: str = ""  # added to the route's name when a predicate matched


def _sdpa_with_gqa(name: str, args: tuple, kwargs: dict) -> bool:
    """F.scaled_dot_product_attention(..., enable_gqa=True), by keyword or as the 8th argument."""
    if name != "scaled_dot_product_attention":
        return False
    if "enable_gqa" in kwargs:
        return bool(kwargs["enable_gqa"])
    return len(args) > 7 and bool(args[7])


def _frame_enables_gqa(frame) -> bool:
    try:
        return frame.f_locals.get("enable_gqa") is True
    except Exception:  # pragma: no cover - f_locals of an odd frame
        return False


_SOFTMAX_NAMES = frozenset({
    "softmax", "log_softmax", "softmin", "_softmax", "_log_softmax", "_safe_softmax", "safe_softmax",
    "_masked_softmax", "_sparse_softmax", "_sparse_log_softmax", "gumbel_softmax",
    "_nested_tensor_softmax_with_shape",
})
_TRIL_NAMES = frozenset({"tril", "triu", "tril_indices", "triu_indices", "tri"})
_SDPA_NAMES = frozenset({
    "scaled_dot_product_attention", "multi_head_attention_forward", "_native_multi_head_attention",
    "flex_attention", "_flash_attention_forward", "_efficient_attention_forward",
})
_TORCH_PYTHON_NAMESPACES = ("torch._refs", "torch._refs.nn.functional", "torch._refs.special",
                            "torch._decomp.decompositions", "torch.masked")

FAMILIES: dict[str, _Family] = {}


def _add(family: _Family, *aliases: str) -> None:
    for key in (family.name, *aliases):
        FAMILIES[key] = family


_add(_Family(
    name="softmax",
    reason="this exercise asks you to write the softmax yourself",
    covers="softmax, log_softmax (so log_softmax(...).exp() is caught), softmin and gumbel_softmax by every "
           "torch route (torch.*, torch.nn.functional.*, torch.special.*, Tensor methods, torch._softmax, "
           "torch._log_softmax, torch._safe_softmax, torch.masked.*, torch.sparse.*, torch.ops.aten.*, "
           "torch._refs, torch._decomp); nn.Softmax, nn.LogSoftmax, nn.Softmin, nn.Softmax2d; "
           "scipy.special.softmax/log_softmax; attn_course.online_softmax",
    torch_names=_SOFTMAX_NAMES,
    python_paths=(
        ("torch.nn.Softmax", "torch.nn.Softmax"),
        ("torch.nn.LogSoftmax", "torch.nn.LogSoftmax"),
        ("torch.nn.Softmin", "torch.nn.Softmin"),
        ("torch.nn.Softmax2d", "torch.nn.Softmax2d"),
        ("scipy.special.softmax", "scipy.special.softmax"),
        ("scipy.special.log_softmax", "scipy.special.log_softmax"),
        ("attn_course.online_softmax", "attn_course.efficient.online_softmax"),
    ),
    python_namespaces=_TORCH_PYTHON_NAMESPACES,
    package=lambda top: "softmax" in top.lower(),
))

_add(_Family(
    name="tril",
    reason="this exercise asks you to build the triangle yourself, by comparing positions",
    covers="tril, triu (also in place: Tensor.tril_, Tensor.triu_), tril_indices, triu_indices by every torch "
           "route (torch.*, Tensor methods, torch.ops.aten.*, torch._refs); numpy.tril, triu, tri, tril_indices, "
           "triu_indices, tril_indices_from, triu_indices_from, mask_indices; "
           "nn.Transformer.generate_square_subsequent_mask; torch.nn.attention.bias.causal_lower_right and "
           "causal_upper_left; attn_course.causal_mask and attn_course.sliding_window_mask",
    torch_names=_TRIL_NAMES,
    python_paths=(
        ("numpy.tril", "numpy.tril"),
        ("numpy.triu", "numpy.triu"),
        ("numpy.tri", "numpy.tri"),
        ("numpy.tril_indices", "numpy.tril_indices"),
        ("numpy.triu_indices", "numpy.triu_indices"),
        ("numpy.tril_indices_from", "numpy.tril_indices_from"),
        ("numpy.triu_indices_from", "numpy.triu_indices_from"),
        ("numpy.mask_indices", "numpy.mask_indices"),
        ("scipy.linalg.tril", "scipy.linalg.tril"),
        ("scipy.linalg.triu", "scipy.linalg.triu"),
        ("torch.nn.Transformer.generate_square_subsequent_mask", "torch.nn.Transformer.generate_square_subsequent_mask"),
        ("torch.nn.Transformer.generate_square_subsequent_mask",
         "torch.nn.modules.transformer._generate_square_subsequent_mask"),
        ("torch.nn.attention.bias.causal_lower_right", "torch.nn.attention.bias.causal_lower_right"),
        ("torch.nn.attention.bias.causal_upper_left", "torch.nn.attention.bias.causal_upper_left"),
        ("attn_course.causal_mask", "attn_course.masks.causal_mask"),
        ("attn_course.sliding_window_mask", "attn_course.masks.sliding_window_mask"),
    ),
    python_namespaces=_TORCH_PYTHON_NAMESPACES,
))

_add(_Family(
    name="sdpa",
    reason="this exercise asks you to write the attention yourself",
    covers="F.scaled_dot_product_attention (torch._C._nn, torch.ops.aten.scaled_dot_product_attention and the "
           "aten::_scaled_dot_product_* kernels), F.multi_head_attention_forward, nn.MultiheadAttention (so "
           "nn.Transformer* layers too), flex_attention; the package's attention: every attn_course function or "
           "class whose name contains 'attention' (scaled_dot_product_attention, simple_self_attention, "
           "SelfAttention, MultiHeadAttention, GroupedQueryAttention, DotProductAttention, AdditiveAttention, "
           "cached_self_attention, tiled_attention, and those added later)",
    torch_names=_SDPA_NAMES,
    torch_prefixes=("_scaled_dot_product",),
    python_paths=(
        ("torch.nn.MultiheadAttention", "torch.nn.MultiheadAttention"),
        ("torch.nn.attention.flex_attention.flex_attention", "torch.nn.attention.flex_attention.flex_attention"),
    ),
    package=lambda top: "attention" in top.lower(),
), "attention")

_add(_Family(
    name="enable_gqa",
    reason="this exercise asks you to share the key/value heads yourself",
    covers="F.scaled_dot_product_attention (or torch.ops.aten.scaled_dot_product_attention) called with "
           "enable_gqa=True; attn_course.GroupedQueryAttention and any attn_course function called with "
           "enable_gqa=True",
    torch_predicate=_sdpa_with_gqa,
    package=lambda top: top == "GroupedQueryAttention",
    package_frame_predicate=_frame_enables_gqa,
    predicate_note=" with enable_gqa=True",
))

_add(_Family(
    name="attn_course",
    reason="this exercise asks you to write it without the course's package",
    covers="every function and class of the attn_course package (attn_course.* outside attn_course.exercises, "
           "plotting, widgets, diagrams and utils), however it was imported",
    package=lambda top: True,
), "package")


def describe_families() -> str:
    """One line per family: its name and what it covers (for the guide and for error messages)."""
    seen, lines = set(), []
    for family in FAMILIES.values():
        if family.name not in seen:
            seen.add(family.name)
            aliases = [k for k, v in FAMILIES.items() if v is family and k != family.name]
            alias = f" (alias {', '.join(repr(a) for a in aliases)})" if aliases else ""
            lines.append(f"{family.name!r}{alias}: {family.covers}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Names of routes


def _base_name(func: Any) -> str:
    """The name a torch function goes by: ``softmax`` for torch.softmax, Tensor.softmax, F.softmax,
    torch.special.softmax (``special_softmax``) and torch.ops.aten.softmax; in-place ``tril_`` -> ``tril``."""
    if isinstance(func, torch._ops.OpOverload):
        name = func._schema.name.split("::")[-1]
    elif isinstance(func, torch._ops.OpOverloadPacket):
        name = func._qualified_op_name.split("::")[-1]
    else:
        name = getattr(func, "__name__", "") or ""
    if name.endswith("_") and not name.endswith("__"):
        name = name[:-1]
    if name.startswith("special_"):
        name = name[len("special_"):]
    return name


def _torch_route_name(func: Any) -> str:
    """How a student would write the torch route: ``torch.log_softmax``, ``Tensor.tril_``,
    ``torch.nn.functional.softmax``, ``torch.special.softmax``, ``torch.ops.aten._softmax``."""
    if isinstance(func, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return f"torch.ops.{func}"
    name = getattr(func, "__name__", None) or repr(func)
    qualname = getattr(func, "__qualname__", "") or ""
    if qualname.startswith(("TensorBase.", "Tensor.")):
        return f"Tensor.{name}"
    module = getattr(func, "__module__", None) or ""
    if qualname.startswith("_VariableFunctionsClass") or module in ("torch", "torch._C._VariableFunctions"):
        return f"torch.{name}"
    if module == "torch._C._nn":
        return f"torch.nn.functional.{name}"
    if module == "torch._C._special":
        return f"torch.special.{name[len('special_'):] if name.startswith('special_') else name}"
    if module.startswith("torch._C._"):
        return f"torch.{module[len('torch._C._'):]}.{name}"
    public = ".".join(part for part in module.split(".") if not part.startswith("_")) or "torch"
    return f"{public}.{name}"


def _public_name(obj: Any) -> str:
    """``torch.nn.Softmax`` rather than ``torch.nn.modules.activation.Softmax``; ``attn_course.X``."""
    name = getattr(obj, "__name__", None)
    module = getattr(obj, "__module__", None) or ""
    if name is None:
        return repr(obj)
    for public in ("torch", "torch.nn", "torch.nn.functional", "attn_course", "numpy"):
        if module.startswith(public.split(".")[0]) and getattr(sys.modules.get(public), name, None) is obj:
            return f"{public}.{name}"
    if module.startswith("torch"):
        return _torch_route_name(obj)
    qualname = (getattr(obj, "__qualname__", None) or name).split("<locals>.")[-1]
    if module.split(".")[0] in ("attn_course", "numpy", "scipy", "math", "builtins", "einops") and module != "builtins":
        return f"{module}.{qualname}"
    return qualname  # the student's own or another module's: by the name it was defined with


_EXCLUDED_PACKAGE_MODULES = ("attn_course.exercises", "attn_course.plotting", "attn_course.widgets",
                             "attn_course.diagrams", "attn_course.utils", "attn_course._checks")


def _package_code_name(frame) -> str | None:
    """``attn_course.MultiHeadAttention`` for a frame running package code (its methods name the class);
    None outside the package, or in the parts of it that are no mechanism (exercises, plotting, ...)."""
    module = frame.f_globals.get("__name__", "")
    if not isinstance(module, str) or not (module == "attn_course" or module.startswith("attn_course.")):
        return None
    if module.startswith(_EXCLUDED_PACKAGE_MODULES):
        return None
    code = frame.f_code
    qualname = getattr(code, "co_qualname", code.co_name)
    top = qualname.split(".")[0]
    if top.startswith("<"):
        return None
    package = sys.modules.get("attn_course")
    return f"attn_course.{top}" if getattr(package, top, None) is not None else f"{module}.{top}"


def _python_codes(obj: Any) -> list:
    """The code objects whose running means ``obj`` was called: a function's own body (after unwrapping
    decorators), a bound method's function, a partial's function, an nn.Module class's ``forward``, or
    another class's ``__init__`` and ``__call__``."""
    if isinstance(obj, nn.Module):
        obj = type(obj)
    if isinstance(obj, type):
        members = ["forward"] if issubclass(obj, nn.Module) else ["__init__", "__call__"]
        codes = []
        for member in members:
            function = obj.__dict__.get(member) or getattr(obj, member, None)
            codes.extend(_python_codes(function) if function is not None and not isinstance(function, type) else [])
        return codes
    obj = getattr(obj, "__func__", obj)  # bound methods, staticmethod
    while hasattr(obj, "func") and callable(getattr(obj, "func")) and not inspect.isfunction(obj):  # functools.partial
        obj = obj.func
    try:
        obj = inspect.unwrap(obj)
    except ValueError:  # pragma: no cover - a cycle of __wrapped__
        pass
    code = getattr(obj, "__code__", None)
    return [code] if code is not None else []


def _resolve(path: str) -> Any:
    """The object at a dotted path, importing nothing that is not imported yet; None if absent."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is not None:
            obj = module
            for part in parts[cut:]:
                obj = getattr(obj, part, None)
                if obj is None:
                    return None
            return obj
    return None


# --------------------------------------------------------------------------------------------------
# The guard


@dataclass(frozen=True)
class Violation:
    """One forbidden call: ``route`` as the student would write it, ``inside`` the library call of the
    student's that made it (or ""), and the ``reason`` the exercise gives."""

    route: str
    reason: str
    inside: str = ""

    @property
    def message(self) -> str:
        where = f" (inside {self.inside})" if self.inside and self.inside != self.route else ""
        return f"you called {self.route}{where}: {self.reason}"


@dataclass
class _Rules:
    torch_names: dict = field(default_factory=dict)  # base name -> reason
    torch_prefixes: list = field(default_factory=list)  # (prefix, reason)
    torch_predicates: list = field(default_factory=list)  # (predicate, note, reason)
    torch_objects: dict = field(default_factory=dict)  # id -> (object, name, reason): non-torch builtins
    codes: dict = field(default_factory=dict)  # code object -> (name, reason)
    package: list = field(default_factory=list)  # (predicate on the top-level name, frame predicate, note, reason)


def _is_torch_callable(obj: Any) -> bool:
    if isinstance(obj, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return True
    module = getattr(obj, "__module__", None) or ""
    qualname = getattr(obj, "__qualname__", "") or ""
    return (module == "torch" or module.startswith("torch.") or qualname.startswith(("TensorBase.", "_VariableFunctionsClass"))) \
        and not inspect.isclass(obj)


def _build_rules(routes: Iterable[Any], reason: str | None) -> _Rules:
    rules = _Rules()
    for route in routes:
        if isinstance(route, str):
            family = FAMILIES.get(route)
            if family is None:
                raise ValueError(f"forbid: unknown family {route!r}; the families are {sorted(FAMILIES)}, or pass "
                                 "the callable itself")
            why = reason or family.reason
            for name in family.torch_names:
                rules.torch_names.setdefault(name, why)
            rules.torch_prefixes.extend((prefix, why) for prefix in family.torch_prefixes)
            if family.torch_predicate is not None:
                rules.torch_predicates.append((family.torch_predicate, family.predicate_note, why))
            for shown, path in family.python_paths:
                obj = _resolve(path)
                for code in _python_codes(obj) if obj is not None else []:
                    rules.codes.setdefault(code, (shown, why))
            for namespace in family.python_namespaces:
                module = sys.modules.get(namespace)
                for attribute, obj in (vars(module).items() if module is not None else ()):
                    if inspect.isfunction(obj) and _base_name(obj) in family.torch_names:
                        shown = f"{namespace}.{attribute}"
                        for code in _python_codes(obj):
                            rules.codes.setdefault(code, (shown, why))
            if family.package is not None:
                rules.package.append((family.package, family.package_frame_predicate, family.predicate_note, why))
        elif callable(route):
            why = reason or "this exercise asks you to do without it"
            if _is_torch_callable(route):
                rules.torch_names.setdefault(_base_name(route), why)
            codes = _python_codes(route)
            if codes:
                shown = _public_name(type(route) if isinstance(route, nn.Module) else route)
                for code in codes:
                    rules.codes.setdefault(code, (shown, why))
            elif not _is_torch_callable(route):  # a builtin of another library (math.exp, numpy ufuncs)
                rules.torch_objects[id(route)] = (route, _public_name(route), why)
        else:
            raise TypeError(f"forbid: expected a family name (one of {sorted(FAMILIES)}) or a callable, got "
                            f"{type(route).__name__} {route!r}")
    return rules


# --------------------------------------------------------------------------------------------------
# The checks' own code: an answer may not call it (a check's reference answer is the answer)

_CHECK_MODULE = re.compile(r"^attn_course\.exercises\.ch\d\d$")
_CALLED_BY_TORCH = ("__torch_function__", "__torch_dispatch__")
CHECK_CODE_REASON = ("that is the check's own code (its reference answer); the exercise asks you to write the "
                     "answer yourself")


def _is_check_frame(frame) -> bool:
    name = frame.f_globals.get("__name__") if frame is not None else None
    return isinstance(name, str) and _CHECK_MODULE.match(name) is not None


def _function_codes(function: Any) -> list:
    """The function's own code and, for a decorated one (functools.wraps), the code it wraps."""
    if not callable(function):
        return []
    codes = [getattr(function, "__code__", None)]
    try:
        codes.append(getattr(inspect.unwrap(function), "__code__", None))
    except ValueError:  # a cycle of __wrapped__
        pass
    return [code for code in codes if isinstance(code, types.CodeType)]


def codes_passed_in(values: Any) -> set:
    """The code objects that a check hands to the student's function in ``values`` (the arguments):
    functions and lambdas, bound methods, partials, generators, classes and the classes of objects
    (every function in their ``__dict__`` along the MRO, properties included), and what containers,
    modules and the check's own objects hold. Running these is the check's doing, not the answer's."""
    found: set = set()
    seen: set = set()

    def add_class(cls: type) -> None:
        if id(cls) in seen:
            return
        seen.add(id(cls))
        for klass in cls.__mro__:
            if klass.__module__ in ("builtins", "torch.nn.modules.module") or klass is object:
                continue
            for member in vars(klass).values():
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                if isinstance(member, property):
                    for accessor in (member.fget, member.fset, member.fdel):
                        found.update(_function_codes(accessor))
                elif isinstance(member, types.FunctionType):
                    found.update(_function_codes(member))

    def visit(value: Any, depth: int) -> None:
        if depth > 6 or value is None or isinstance(value, (torch.Tensor, str, bytes, int, float, complex, bool)):
            return
        if id(value) in seen:
            return
        seen.add(id(value))
        if isinstance(value, types.FunctionType):
            found.update(_function_codes(value))
            for cell in value.__closure__ or ():
                try:
                    visit(cell.cell_contents, depth + 1)
                except ValueError:  # an empty cell
                    pass
        elif isinstance(value, types.MethodType):
            visit(value.__func__, depth + 1)
            visit(value.__self__, depth + 1)
        elif isinstance(value, functools.partial):
            visit(value.func, depth + 1)
            for item in (*value.args, *value.keywords.values()):
                visit(item, depth + 1)
        elif isinstance(value, types.GeneratorType):
            found.add(value.gi_code)
        elif isinstance(value, type):
            add_class(value)
        elif isinstance(value, dict):
            for item in value.values():
                visit(item, depth + 1)
        elif isinstance(value, (list, tuple, set, frozenset)):
            for item in value:
                visit(item, depth + 1)
        elif isinstance(value, types.ModuleType):
            return
        else:
            add_class(type(value))
            if isinstance(value, nn.Module) or _CHECK_MODULE.match(type(value).__module__ or ""):
                for item in getattr(value, "__dict__", {}).values():
                    visit(item, depth + 1)

    visit(values, 0)
    return found


_ACTIVE: list["forbidden"] = []  # the guards in force, innermost last
_PREVIOUS_PROFILE: list = []  # the profile function to restore when the last guard ends


def _profile(frame, event, arg):
    previous = _PREVIOUS_PROFILE[0] if _PREVIOUS_PROFILE else None
    if previous is not None:
        try:
            previous(frame, event, arg)
        except Exception:  # pragma: no cover - someone else's profiler
            pass
    if event == "call":
        for guard in _ACTIVE:
            guard._observe_python(frame)
    elif event == "c_call":
        for guard in _ACTIVE:
            if guard._rules.torch_objects:
                guard._observe_builtin(arg)


class _Watch(TorchFunctionMode):
    """Sees every torch function call from Python while its guard is in force, and lets it run."""

    def __init__(self, guard: "forbidden") -> None:
        super().__init__()
        self._guard = guard

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self._guard._observe_torch(func, args, kwargs)
        return func(*args, **kwargs)


class forbidden:
    """Forbid routes while the student's code runs: ``with forbidden("softmax", torch.roll): ...``.

    Args:
        *routes: family names (see :data:`FAMILIES`; ``"softmax"``, ``"tril"``, ``"sdpa"``,
            ``"enable_gqa"``, ``"attn_course"``) or callables: a torch function (then every torch route of
            that name: ``torch.roll`` also forbids ``Tensor.roll`` and ``torch.ops.aten.roll``), a Python
            function (every alias of it), an ``nn.Module`` class or instance (its ``forward``), or another
            library's builtin.
        reason: what the message says after the route; by default the family's reason.

    Calls are recorded in :attr:`violations`, not raised into the student's code. :func:`call` reports
    the first as a :class:`Mismatch`; used directly, the guard raises that Mismatch when it ends (also
    in place of an exception the student's code raised, which the forbidden call explains).

    Use it around the student's call only, never around the check's reference computation. The
    ``forbid=`` of ``@exercise`` does that for every :func:`call` of the check.
    """

    def __init__(self, *routes: Any, reason: str | None = None, check_code: Any = None) -> None:
        self._routes = routes
        self._reason = reason
        # check_code: the arguments a check passes (see codes_passed_in); when given, the guard also
        # forbids entering any other code of a check module (attn_course.exercises.chNN) from outside it.
        self._watch_checks = check_code is not None
        self._allowed_check_codes = codes_passed_in(check_code) if self._watch_checks else set()
        self._rules = _Rules()
        self.violations: list[Violation] = []
        self.reported = 0
        self._mode: _Watch | None = None
        self._base = None
        self._python = False
        # Validate now, so that a typo in a family name fails where the check is written.
        _build_rules(routes, reason)

    # Entering and leaving ----------------------------------------------------------------------------
    def __enter__(self) -> "forbidden":
        self._rules = _build_rules(self._routes, self._reason)
        self._base = sys._getframe(1)
        self._python = bool(self._rules.codes or self._rules.package or self._rules.torch_objects or self._watch_checks)
        if self._python and not any(guard._python for guard in _ACTIVE):
            _PREVIOUS_PROFILE[:] = [sys.getprofile()]
            sys.setprofile(_profile)
        _ACTIVE.append(self)
        if self._rules.torch_names or self._rules.torch_prefixes or self._rules.torch_predicates:
            self._mode = _Watch(self)
            self._mode.__enter__()
        return self

    def _exit_quietly(self) -> None:
        """Leave the guard without reporting (``call`` reports what was recorded)."""
        try:
            if self._mode is not None:
                self._mode.__exit__(None, None, None)
                self._mode = None
        finally:
            if self in _ACTIVE:
                _ACTIVE.remove(self)
            if self._python and not any(guard._python for guard in _ACTIVE):
                previous = _PREVIOUS_PROFILE[0] if _PREVIOUS_PROFILE else None
                sys.setprofile(previous)
                _PREVIOUS_PROFILE.clear()
            self._base = None

    def __exit__(self, exc_type, exc, traceback) -> bool:
        self._exit_quietly()
        unreported = self.unreported()
        if unreported is None or (exc_type is not None and not issubclass(exc_type, Exception)):
            return False
        if exc_type is not None and issubclass(exc_type, (Mismatch, NotAttempted)):
            return False
        self.reported = len(self.violations)
        raise Mismatch(unreported.message) from None

    def unreported(self) -> Violation | None:
        """The first violation not reported yet, or None."""
        return self.violations[self.reported] if len(self.violations) > self.reported else None

    # Observing ------------------------------------------------------------------------------------
    def _record(self, route: str, reason: str) -> None:
        if len(self.violations) < 20:
            self.violations.append(Violation(route, reason, self._inside()))

    def _inside(self) -> str:
        """The outermost library call below the guard's frame that led to the forbidden call: the
        student called ``attn_course.causal_mask`` (or ``nn.Softmax``), which called the route."""
        frame, outermost = sys._getframe(2), ""
        while frame is not None and frame is not self._base:
            name = _package_code_name(frame)
            if name is None and frame.f_code.co_name == "forward":
                owner = frame.f_locals.get("self")
                if isinstance(owner, nn.Module):
                    name = _public_name(type(owner))
            if name:
                outermost = name
            frame = frame.f_back
        return outermost

    def _observe_torch(self, func, args, kwargs) -> None:
        rules = self._rules
        name = _base_name(func)
        note, reason = "", rules.torch_names.get(name)
        if reason is None:
            reason = next((why for prefix, why in rules.torch_prefixes if name.startswith(prefix)), None)
        if reason is None:
            note, reason = next(((n, why) for predicate, n, why in rules.torch_predicates
                                 if predicate(name, args, kwargs)), ("", None))
        if reason is not None:
            self._record(_torch_route_name(func) + note, reason)

    def _observe_python(self, frame) -> None:
        if self._watch_checks and _is_check_frame(frame):
            # Not the answer's doing: code the check passed in, code called by the check's own code, a
            # torch function/dispatch mode the check set up (torch calls it), a hook run by autograd's thread.
            if (frame.f_code not in self._allowed_check_codes and frame.f_back is not None
                    and not _is_check_frame(frame.f_back) and frame.f_code.co_name not in _CALLED_BY_TORCH):
                code = frame.f_code
                self._record(f"{frame.f_globals['__name__']}.{getattr(code, 'co_qualname', code.co_name)}",
                             CHECK_CODE_REASON)
            return
        rules = self._rules
        hit = rules.codes.get(frame.f_code)
        if hit is not None:
            self._record(*hit)
            return
        if rules.package:
            name = _package_code_name(frame)
            if name is not None:
                top = name.rsplit(".", 1)[-1]
                for predicate, frame_predicate, note, why in rules.package:
                    if predicate(top):
                        self._record(name, why)
                        return
                    if frame_predicate is not None and frame_predicate(frame):
                        self._record(name + note, why)
                        return

    def _observe_builtin(self, func) -> None:
        hit = self._rules.torch_objects.get(id(func))
        if hit is not None and hit[0] is func:
            self._record(hit[1], hit[2])


def active_guards() -> list[forbidden]:
    """The guards in force, outermost first."""
    return list(_ACTIVE)


def check_routes(routes: Iterable[Any]) -> tuple:
    """Validate ``forbid=`` at decoration time: a tuple of family names and callables."""
    if isinstance(routes, str) or callable(routes):
        routes = (routes,)
    routes = tuple(routes)
    _build_rules(routes, None)
    return routes

