"""Checks for the exercises of chapter 07, the character-level translator.

Each check tries the answer on cases chosen so that the usual mistakes give a wrong result, and
names the mistake when it recognises one; the table of those mistakes is in
tests/test_exercises_ch07.py. They use the shared mechanism of ``attn_course.exercises``: inputs
watched for changes in place, results' kind of dtype and device, sizes unlike the notebook's
(``other_sizes``), left padding (``padding_cases``) and logits near 100 in float32
(``large_scores``); the package's own answers are forbidden where the exercise asks for them.

- Exercise 1 forbids the whole package (its rules are the answer) and tries new nouns of every
  initial and adjectives that go before the noun and start with a vowel (the word right after the
  article decides the elision: *l'ancienne école*, *l'ancien chat*). It names the package's set of eliding
  letters (``ELIDING_INITIALS``) too, read by the answer's code or by a function of the student's that it calls
  (found in their code before the answer runs), or read as it runs by any route, ``getattr`` with a computed name or
  an import inside the function included (:class:`_WatchedConstant`). A copy made before the check runs, under
  another name, cannot be told apart from letters typed out.
- Exercise 2 samples one row too (``.squeeze()`` would drop the batch axis) and passes logits that
  are a tensor of their own, so that a division in place is named as such. At temperature 0 it tries rows whose
  two largest logits are 1e-3 down to 1e-6 apart (a clamp of the temperature from 1e-6 up is named), then rows
  whose largest logits are exactly tied, each repeated 2,000 times: every copy of a row must get the same one of its
  largest ids (argmax picks the first; any one tied id is accepted), so that a clamp of the temperature however
  small (1e-9, 1e-30), a sample between the tied ids, is named. It samples at temperatures 0.1, 0.05, 0.02, 0.005,
  0.001, 1e-6, 1e-12 and 1e-30 (greedy below a threshold is named, and probabilities raised to the power
  1 / temperature, which underflow there), and at 0.01 on float32 logits near 50 (a softmax in half precision,
  which cannot tell 5000 from 5000.5, is named). Wide rows whose probability is spread out (64 ids over 4 nats;
  one id and 1,023 ids 9 nats below it) name cuts of the distribution that remove a share a sample of 20,000 or
  5,000 can see: top-k with k up to 63 on the 64 ids, min-p and dropping ids below a probability from about
  1.2e-4 up, top-p well below 1. (A cut of the last few ids of a thousand, top-k 1000 or top-p 0.999, changes too
  few draws for any sample of this size to see.)
- Exercise 3 has a table whose best survivor at ``max_len`` has not ended and one whose best survivor there has
  ended (each preference named), and names a search that stops early
  (an unfinished result shorter than ``max_len``). A long case (200 ids, finalists 28 tokens long, totals near -110
  and 0.01 apart) names scores summed in float16 and probabilities multiplied instead of log-probabilities added,
  and a table where a sequence ends at the first step names a beam that shrinks each time a sequence ends.
- Exercise 4 forbids the layer's own wiring by every route (``DecoderLayer.forward`` and
  ``apply_sublayers``, ``Transformer``, PyTorch's decoder layers and ``nn.MultiheadAttention``),
  asks for the inputs' exact dtype (a float64 case too, as its statement says) and names a causal mask in
  the other convention. One more case runs with autograd on and compares the gradients with respect to h and
  every weight, so that an output cut from autograd (``.detach()``, ``torch.no_grad()``) is named.
- Exercise 4 tries a target longer than the notebook's T = 6 too, so that a causal mask built for
  that size and sliced is named.
- Exercises 2 and 4 try one more case on another device (:func:`other_device`): the notebook's GPU,
  or the meta device where there is none, so that a mask or noise made without ``device=`` is named
  on every machine; exercise 2 names ids returned on the CPU there too (:class:`_CopiesOut`), and a sampler that
  restarts from the generator's seed at every call (two successive calls with one generator must differ).
  Exercise 3 runs one case on the CPU under a :class:`DeviceWatch` that takes the model's log-probabilities to be
  on a GPU (a beam search reads values, which the meta device has not), so that a score tensor made without
  ``device=`` is named on every machine, and one more case on the GPU when there is one (:func:`_accelerator`);
  it says, where a wrong search finds a more probable sequence than the reference, that beam search does not
  promise the most probable one.
"""

from __future__ import annotations

import contextlib
import dis
import functools
import inspect
import math
import re
import sys
import types

import torch
from torch.overrides import TorchFunctionMode

from ..transformer import DecoderLayer, Transformer
from ..translator import DEFAULT_LEXICON, beam_search, beam_translate, french_noun_phrase
from ..translator import language as _language
from ..utils import get_device
from . import (Mismatch, call, call_elsewhere, exercise, expect, expect_close, expect_on_device, expect_tensor,
               forbidden, large_scores, other_device, other_sizes, padding_cases, randn, rng, tolerance)
from . import _meta_note
from ._core import _StudentCodeFailed
from ._device import DeviceWatch

__all__ = ["check_french_noun_phrase", "check_sample_next", "check_beam_search", "check_post_norm_decoder_layer"]

# New nouns that the student's rules must handle too, one for each way of starting a word: a vowel of each
# accent that French writes at the start of a word (île, âne, ère, être), the ligature œ (œuf), a mute h with
# an accent (hôtel), a y, which is a consonant (le yaourt), and plain consonants.
NEW_NOUNS = {
    "island": ("île", "f"), "donkey": ("âne", "m"), "era": ("ère", "f"), "being": ("être", "m"),
    "egg": ("œuf", "m"), "hotel": ("hôtel", "m"), "yogurt": ("yaourt", "m"), "computer": ("ordinateur", "m"),
    "mouse": ("souris", "f"),
}
# Nouns that start with a plain e and a plain u, which neither the lexicon nor NEW_NOUNS has: a rule that writes
# its vowels out by hand and leaves one of these two out (le enfant, la usine) fails on them. They are checked after
# NEW_NOUNS but left out of the count and the list of the success message, which the notebook's stored output prints.
PLAIN_VOWEL_NOUNS = {"child": ("enfant", "m"), "factory": ("usine", "f")}
# Pre-nominal adjectives that start with a vowel or a mute h (l'ancienne école, l'immense arbre, l'ancien chat,
# l'honnête voiture).
ANCIEN, IMMENSE = ("ancien", "ancienne", "before"), ("immense", "immense", "before")
HONNETE = ("honnête", "honnête", "before")


def _cases():
    """(description, arguments) in the order of the phenomena, so that the first failure names the rule."""
    adjectives = DEFAULT_LEXICON.adjectives
    chat, voiture, arbre, ecole, homme = ("chat", "m"), ("voiture", "f"), ("arbre", "m"), ("école", "f"), ("homme", "m")
    yield "the article agrees with the noun's gender", ("the", None, *chat)
    yield "the article agrees with the noun's gender", ("the", None, *voiture)
    yield "the indefinite article agrees with the noun's gender", ("a", None, *voiture)
    yield "most adjectives go after the noun", ("the", adjectives["red"], *chat)
    yield "a pre-nominal adjective goes before the noun", ("the", adjectives["small"], *chat)
    yield "the adjective agrees with a feminine noun", ("a", adjectives["green"], *voiture)
    yield "the adjective agrees with a feminine noun (irregular form)", ("the", adjectives["white"], *voiture)
    yield "a feminine pre-nominal adjective", ("a", adjectives["good"], *voiture)
    yield "elision before a vowel: l'", ("the", None, *arbre)
    yield "elision before a vowel, feminine too", ("the", adjectives["blue"], *ecole)
    yield "elision before a mute h", ("the", None, *homme)
    yield "no elision when a pre-nominal adjective comes first", ("the", adjectives["big"], *arbre)
    yield "no elision with un/une", ("a", None, *ecole)
    # Adjectives that go before the noun and start with a vowel or a mute h (not in the lexicon): the word right
    # after the article decides, so they elide themselves, before a vowel-initial noun or a consonant-initial one
    # (an h that elides only when it is the noun's gives "la honnête voiture").
    for entry, (noun, gender) in ((ANCIEN, ecole), (IMMENSE, arbre), (ANCIEN, chat), (HONNETE, voiture)):
        yield "the word right after the article decides the elision", ("the", entry, noun, gender)
    for english, (noun, gender) in [*NEW_NOUNS.items(), *PLAIN_VOWEL_NOUNS.items()]:
        for article in ("the", "a"):
            for adjective in (None, "small", "black"):
                entry = adjectives[adjective] if adjective else None
                yield (f"the new noun {english!r} -> {noun!r} ({'feminine' if gender == 'f' else 'masculine'})",
                       (article, entry, noun, gender))
    for article in ("the", "a"):
        for adjective in [None, *adjectives.values()]:
            for noun, gender in DEFAULT_LEXICON.nouns.values():
                yield "every noun phrase of the lexicon", (article, adjective, noun, gender)


def _elision_hint(noun: str) -> str:
    first = noun[0]
    if first == "y":
        return " A y is a consonant here, as in le yaourt: no elision before it."
    if first == "œ":
        return " The ligature œ (as in l'œuf) is a vowel too."
    if first == "h":
        return " This h is mute: elide before it, as in l'homme."
    if first not in "aeiou":
        return f" '{first}' is an accented vowel: every vowel elides, whatever its accent."
    return (f" '{first}' is a plain vowel: elide before it too (l'{noun}); check that your letters hold every plain "
            "vowel, a, e, i, o and u, as well as the accented ones.")


# The package's constants that hold part of exercise 1's answer. ``forbid=("attn_course",)`` watches calls only, so
# the check looks for these in the answer's code before it runs it: by identity among the globals, closure cells and
# defaults that the answer (and the functions of the student's own that it calls) reads, and by name where the code
# reads an attribute (tr.ELIDING_INITIALS, language.ELIDING_INITIALS).
_PACKAGE_CONSTANTS = ("ELIDING_INITIALS",)


def _package_constant_used(fn, depth: int = 0, seen: set | None = None) -> str | None:
    """The name of a constant of ``_PACKAGE_CONSTANTS`` that ``fn`` reads, or None."""
    seen = set() if seen is None else seen
    if depth > 4 or id(fn) in seen:
        return None
    seen.add(id(fn))
    constants = {id(getattr(_language, name)): name for name in _PACKAGE_CONSTANTS}
    if isinstance(fn, functools.partial):
        values = [fn.func, *fn.args, *fn.keywords.values()]
        return next((found for found in (constants.get(id(v)) or _package_constant_used(v, depth + 1, seen)
                                         for v in values) if found), None)
    fn = inspect.unwrap(fn) if callable(fn) else fn
    if isinstance(fn, types.MethodType):
        fn = fn.__func__
    if not isinstance(fn, types.FunctionType):
        call_method = getattr(type(fn), "__call__", None)
        if isinstance(call_method, types.FunctionType):
            return _package_constant_used(call_method, depth + 1, seen)
        return None
    if (fn.__module__ or "").startswith("attn_course"):
        return None  # the package's own functions: forbid=("attn_course",) names them when called

    def reads(code):  # (opname, name) of every global and attribute the code reads, nested functions included
        for instruction in dis.get_instructions(code):
            if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_ATTR", "LOAD_METHOD"):
                yield instruction.opname, instruction.argval
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                yield from reads(const)

    try:  # the function's own text, its def line's default arguments included (vowels=set(tr.ELIDING_INITIALS))
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        source = ""
    found = next((name for name in _PACKAGE_CONSTANTS if re.search(rf"\.\s*{name}\b", source)), None)  # tr.NAME
    if found:
        return found
    values = [*(fn.__defaults__ or ()), *(fn.__kwdefaults__ or {}).values(),
              *(cell.cell_contents for cell in (fn.__closure__ or ()) if _cell_filled(cell))]
    for opname, name in reads(fn.__code__):
        if opname in ("LOAD_ATTR", "LOAD_METHOD"):
            if name in _PACKAGE_CONSTANTS:  # an attribute: tr.ELIDING_INITIALS
                return name
        elif name in fn.__globals__:
            values.append(fn.__globals__[name])
    for value in values:
        if id(value) in constants:
            return constants[id(value)]
        if isinstance(value, (types.FunctionType, functools.partial)):
            found = _package_constant_used(value, depth + 1, seen)
            if found:
                return found
    return None


class _WatchedConstant:
    """Stands in for a package constant (a frozenset of letters) while the answer runs, and notes in ``reads`` every
    use of it by code outside the package: a membership test, an iteration (``sorted``, ``"".join``, ``set(...)``,
    a copy), its length, a set operation or a method. The static search of :func:`_package_constant_used` does
    not see a read by a computed name (``getattr(tr, "ELIDING_" + "INITIALS")``) or an import inside the function;
    this does. Not a frozenset subclass: ``set(x)`` and ``frozenset(x)`` copy a set's contents without calling
    ``__iter__``. The package's own code reads it unnoted (a call of it is named as such by ``forbid``)."""

    def __init__(self, value: frozenset, reads: list) -> None:
        object.__setattr__(self, "_value", value)
        object.__setattr__(self, "_reads", reads)

    def _note(self) -> frozenset:
        caller = inspect.currentframe().f_back.f_back
        module = caller.f_globals.get("__name__", "") if caller is not None else ""
        if not (isinstance(module, str) and module.startswith("attn_course.")
                and not module.startswith("attn_course.exercises")):
            self._reads.append(module)
        return self._value

    def __getattr__(self, name):  # .union, .issubset, .copy, __deepcopy__, ...
        return getattr(self._note(), name)

    def __contains__(self, item):
        return item in self._note()

    def __iter__(self):
        return iter(self._note())

    def __len__(self):
        return len(self._note())

    def __bool__(self):
        return bool(self._note())

    def __eq__(self, other):
        return self._note() == other

    def __hash__(self):
        return hash(self._note())

    def __repr__(self):
        return repr(self._note())

    def __reduce_ex__(self, protocol):
        return self._note().__reduce_ex__(protocol)


def _binary(name):
    def method(self, other):
        return getattr(self._note(), name)(other)
    method.__name__ = name
    return method


for _name in ("__or__", "__ror__", "__and__", "__rand__", "__sub__", "__rsub__", "__xor__", "__rxor__",
              "__le__", "__lt__", "__ge__", "__gt__", "__ne__"):
    setattr(_WatchedConstant, _name, _binary(_name))
del _name


@contextlib.contextmanager
def _watching_package_constants():
    """While the block runs, every module of the package that holds a constant of ``_PACKAGE_CONSTANTS`` holds a
    :class:`_WatchedConstant` in its place; yields the list of the modules whose code read one (empty when none did).
    The constants are put back afterwards, whatever happens."""
    reads: list = []
    swapped = []
    for name in _PACKAGE_CONSTANTS:
        original = getattr(_language, name)
        watched = _WatchedConstant(original, reads)
        for module_name, module in list(sys.modules.items()):
            if not (module_name == "attn_course" or module_name.startswith("attn_course.")):
                continue
            namespace = getattr(module, "__dict__", None)
            if isinstance(namespace, dict) and namespace.get(name) is original:
                swapped.append((namespace, name, original))
                namespace[name] = watched
    try:
        yield reads
    finally:
        for namespace, name, original in swapped:
            namespace[name] = original


def _cell_filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


_USES_THE_CONSTANT = ("your code uses attn_course.translator.{name}{how}, the package's set of the letters before "
                      "which le and la elide: which letters elide (accented vowels, œ, h, not y) is half of this exercise. "
                      "Write the letters out yourself")


@exercise(
    "Exercise 1, add a new noun: the rules of a French noun phrase",
    hint="choose the adjective's form by the noun's gender and put it before or after the noun as its entry says; "
         "then the article: un or une for 'a'; for 'the', look at the first letter of the word that follows it "
         "(the adjective, when it goes first), and elide to l' (no space) before any vowel, accented or not, or an h",
    forbid=("attn_course",),
)
def check_french_noun_phrase(noun_phrase) -> str:
    used = _package_constant_used(noun_phrase)
    if used is not None:
        raise Mismatch(_USES_THE_CONSTANT.format(name=used, how=""))
    checked = 0
    for rule, args in _cases():
        with _watching_package_constants() as reads:
            try:
                got = call(noun_phrase, *args)
            except (Mismatch, _StudentCodeFailed):
                if not reads:
                    raise
                got = None
        if reads:  # a read by a computed name (getattr) or an import inside the function, seen as it ran
            raise Mismatch(_USES_THE_CONSTANT.format(
                name=_PACKAGE_CONSTANTS[0], how=" (read as your function ran: by getattr, an import inside it, or a "
                                                "copy made at the call)"))
        expected = french_noun_phrase(*args)
        what = f"for article={args[0]!r}, adjective={args[1]!r}, noun={args[2]!r}, gender={args[3]!r}"
        expect(isinstance(got, str), f"{what}: return a str such as 'le chat rouge'; got {type(got).__name__} {got!r}")
        if got != expected:
            detail = ""
            words = expected.split(" ")
            if ("l'" in expected) != ("l'" in got) and args[0] == "the":
                first_word = expected[2:].split(" ")[0] if expected.startswith("l'") else words[1]
                detail = _elision_hint(first_word)
                adjective = args[1]
                if adjective is not None and adjective[2] == "before":
                    form = adjective[0] if args[3] == "m" else adjective[1]
                    detail = (f" The word right after the article decides, here the adjective {form!r}, not the "
                              f"noun {args[2]!r}: elide when it starts with a vowel or an h, whatever the noun "
                              "starts with.")
            adjective = args[1]
            if adjective is not None and adjective[0] != adjective[1]:
                form, other = (adjective[0], adjective[1]) if args[3] == "m" else (adjective[1], adjective[0])
                if got == french_noun_phrase(args[0], (other, other, adjective[2]), args[2], args[3]):
                    gender = "masculine" if args[3] == "m" else "feminine"
                    rule, detail = "the adjective agrees with the noun's gender", (
                        f" Only the adjective's form is wrong: {args[2]!r} is {gender}, so the adjective is "
                        f"{form!r}, not {other!r}; the gender argument decides it, not the noun's spelling.")
            raise Mismatch(f"{rule}: {what} expected {expected!r}, got {got!r}.{detail}")
        if args[2] not in {noun for noun, _ in PLAIN_VOWEL_NOUNS.values()}:  # the message's count, as stored
            checked += 1
    return (f"all {checked} noun phrases are right, including the new nouns "
            f"{', '.join(repr(n) for n, _ in NEW_NOUNS.values())} and adjectives that start with a vowel "
            "(l'ancienne école, l'immense arbre): for a noun that starts with a consonant, a vowel or a mute h, its "
            "French and its gender are all the grammar needs.")


# --------------------------------------------------------------------------------------------------
# The notebook's GPU


def _accelerator() -> torch.device | None:
    """The GPU where exercise 3 tries one more case (CUDA, then Apple's MPS), or None on a CPU-only machine.
    A tensor made there without ``device=`` would live on the CPU, and mixing the two fails."""
    device = get_device()  # CUDA, then MPS, then the CPU: as the notebook's first cell picks
    return device if device.type != "cpu" else None


# --------------------------------------------------------------------------------------------------
# Exercise 2


class _CopiesOut(TorchFunctionMode):
    """Records the answer's copies of data to the CPU (``.cpu()``, ``.to("cpu")``, ``.numpy()``, ``.tolist()``)
    from a tensor that lives elsewhere, in ``copied``. The meta device has no data to copy ("Cannot copy out of meta
    tensor"): there the copy gets stand-in values of the right shape and dtype (rows of equal probabilities, or
    zeros for ids), so that the answer runs on and the check can see where its result ends up: still on the CPU
    (a mistake), or moved back to the inputs' device (right)."""

    _NAMES = ("cpu", "to", "numpy", "tolist")

    def __init__(self, copied: list) -> None:
        super().__init__()
        self.copied = copied

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        source = args[0] if args else None
        if name not in self._NAMES or not isinstance(source, torch.Tensor) or source.device.type == "cpu":
            return func(*args, **kwargs)
        try:
            result = func(*args, **kwargs)
        except (NotImplementedError, TypeError, RuntimeError) as error:
            if source.device.type != "meta":
                raise
            if source.is_floating_point() and source.dim():  # rows of equal probabilities
                stand_in = torch.full(source.shape, 1 / max(source.shape[-1], 1), dtype=source.dtype)
            else:
                stand_in = torch.zeros(source.shape, dtype=source.dtype)
            try:
                result = func(stand_in, *args[1:], **kwargs)
            except (NotImplementedError, TypeError, RuntimeError):
                raise error from None  # not a copy to the CPU: the answer's own error
        if name != "to" or (isinstance(result, torch.Tensor) and result.device.type == "cpu"):
            self.copied.append(name)
        return result


def _frequencies(ids: torch.Tensor, V: int) -> torch.Tensor:
    return torch.bincount(ids.long().cpu(), minlength=V)[:V].double() / len(ids)


def _expect_every_count(ids: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Each id's count within 5 standard deviations of its expected count (binomial), so that a rare id dropped or
    cut down is seen: at temperature 0.5, id 3 has probability 0.002, about 43 draws in 20,000 (std 6.5), which
    an absolute tolerance of 0.02 on the frequencies cannot see. A right answer fails this about once in a million."""
    n = len(ids)
    counts = torch.bincount(ids.long().cpu(), minlength=len(expected))[:len(expected)].double()
    means, stds = n * expected, (n * expected * (1 - expected)).sqrt()
    off = [i for i in range(len(expected)) if abs(counts[i] - means[i]) > 5 * stds[i] + 1]
    for i in sorted(off, key=lambda i: counts[i] >= means[i]):  # an id that comes up too rarely named first
        detail = (" Sample from the whole distribution: no top-k or top-p (nucleus) cut, no id left out."
                  if counts[i] < means[i] else "")
        raise Mismatch(f"{what}: id {i} has probability {expected[i]:.4f}, about {means[i]:.0f} draws in "
                       f"{n:,}; yours came up {int(counts[i])} times.{detail}")


def _expect_large_rows_sampled_right(sample_next) -> None:
    """One row near +100 and one near -100 (V = 40), each repeated 20,000 times, sampled at temperature 1: the counts
    must follow softmax(row) computed in float64. Three ids per row hold nearly all the probability (0.52, 0.32,
    0.16); the other 37 lie 20.5 to 24.1 below the max (under 1e-9 each, about 0.0001 draws in all in 20,000).
    This tells apart what the ids-in-range check above cannot: logits clamped against overflow (l.clamp(-30, 30)
    makes both rows flat), an overflowed exp patched with torch.nan_to_num (inf / inf turned into equal numbers),
    and a floor on the probabilities (.clamp(min=1e-3) or + 1e-4, which gives the 37 unlikely ids dozens to
    hundreds of draws)."""
    offsets = torch.tensor([0.5, 0.0, -0.7] + [-20.0 - 0.1 * k for k in range(37)], dtype=torch.float64)
    rows = torch.stack([100.0 + offsets, -100.0 + offsets]).float()  # (2, 40) in float32
    big = rows.repeat_interleave(20000, dim=0)  # (40000, 40): 20,000 rows near +100, then 20,000 near -100
    what = "sample_next(logits of shape (40000, 40), rows near +100 and near -100 in float32, temperature=1)"
    got = expect_tensor(call(sample_next, big, 1.0, torch.Generator().manual_seed(4)), what=what, shape=(40000,),
                        dtype="integer", device=big)
    got = got.long().cpu()
    for half, level in ((0, "+100"), (1, "-100")):
        ids = got[half * 20000:(half + 1) * 20000]
        expected = torch.softmax(rows[half].double(), dim=-1)
        part = f"{what}, the rows near {level}"
        expect(bool(((ids >= 0) & (ids < 40)).all()),
               f"{part}: ids must lie between 0 and V - 1 = 39, got {ids.unique().tolist()}")
        frequencies = _frequencies(ids, 40)
        if not torch.allclose(frequencies[:3], expected[:3], atol=0.05):
            raise Mismatch(
                f"{part}: ids 0, 1 and 2 should come up with frequencies "
                f"{[round(p, 3) for p in expected[:3].tolist()]}, yours came up "
                f"{[round(p, 3) for p in frequencies[:3].tolist()]} (and the other 37 ids {frequencies[3:].sum():.3f} "
                "of the time, where they should almost never). Only the differences between a row's logits matter, "
                "wherever the row sits: clamping the logits against overflow (l.clamp(-30, 30), say) flattens a row "
                "near 100, and patching an overflowed exp with torch.nan_to_num turns its inf / inf into made-up "
                "equal numbers. Leave the logits as they are and subtract each row's max before exp (torch.softmax "
                "does)")
        unlikely = int((ids >= 3).sum())
        expected_unlikely = 20000 * float(expected[3:].sum())
        if unlikely > expected_unlikely + 5 * (expected_unlikely ** 0.5) + 3:
            raise Mismatch(
                f"{part}: ids 3 to 39 have probability {float(expected[3:].sum()):.1e} in all, about "
                f"{expected_unlikely:.2g} draws in 20,000; yours came up {unlikely:,} times. A floor on the "
                "probabilities (.clamp(min=1e-3), or + 1e-4 before torch.multinomial) gives every id a share it "
                "does not have: pass softmax(logits / temperature) to torch.multinomial as it is, zeros included")
        _expect_every_count(ids, expected, part)


def _expect_wide_rows_sampled_right(sample_next) -> None:
    """Wide rows whose probability is spread out, each repeated many times, so that a cut of the distribution is
    seen, however it is made (top-k for any k < V, top-p, min-p, dropping the ids below a probability): 64 logits
    evenly over 4 nats at temperatures 1 and 2 (20,000 rows; the least likely id about 24 and 100 draws), and one
    likely id with 1,023 ids 9 nats below it (5,000 rows; each of those 1.1e-4 of the probability and 1.2e-4 of the
    top id's, 11% together, about 550 draws). Each id's count must fall within 5 standard deviations of its expected
    count, and so must the total count of the less likely half of the ids."""
    spread = -torch.linspace(0.0, 4.0, 64)  # (64,): the least likely id holds e^-4 of the top one's probability
    tail = torch.cat([torch.zeros(1), torch.full((1023,), -9.0)])  # (1024,): one id, then 1,023 at e^-9 of it each
    for seed, (row, n, temperature, name) in enumerate(((spread, 20000, 1.0, "spread evenly over 4 nats"),
                                                        (spread, 20000, 2.0, "spread evenly over 4 nats"),
                                                        (tail, 5000, 1.0, "one id and 1,023 ids 9 nats below it"))):
        V = len(row)
        rows = row.repeat(n, 1)  # (n, V)
        what = f"sample_next(logits of shape ({n}, {V}), {name}, temperature={temperature:g})"
        ids = expect_tensor(call(sample_next, rows, temperature, torch.Generator().manual_seed(20 + seed)), what=what,
                            shape=(n,), dtype="integer", device=rows).long().cpu()
        expect(bool(((ids >= 0) & (ids < V)).all()), f"{what}: ids must lie between 0 and V - 1 = {V - 1}, got "
               f"{ids.unique().tolist()[:8]}")
        expected = torch.softmax(row.double() / temperature, dim=-1)
        rare = expected.argsort()[: V // 2]  # the less likely half of the ids
        share = float(expected[rare].sum())
        mean, std = n * share, (n * share * (1 - share)) ** 0.5
        count = int(torch.isin(ids, rare).sum())
        if abs(count - mean) > 5 * std + 1:
            raise Mismatch(f"{what}: the {V // 2} least likely ids have probability {share:.4f} together, about "
                           f"{mean:.0f} draws in {n:,}; yours came up {count} times."
                           + (" Sample from the whole distribution: no top-k, top-p (nucleus) or min-p cut, no "
                              "probability below which ids are dropped." if count < mean else ""))
        _expect_every_count(ids, expected, what)


@exercise(
    "Exercise 2, greedy decoding or sampling",
    hint="at temperature 0 take each row's largest logit; otherwise divide the logits by the temperature, turn each "
         "row into probabilities over the vocabulary (the last axis), and draw one id per row with torch.multinomial, "
         "passing it the generator",
)
def check_sample_next(sample_next) -> str:
    generator = rng(7)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 3.0, 0.5, 0.5]])  # (B=2, V=4)
    what = "sample_next(logits of shape (2, 4), temperature=0)"
    greedy = call(sample_next, logits, 0.0, torch.Generator().manual_seed(0))
    if isinstance(greedy, torch.Tensor) and tuple(greedy.shape) == (4,) and torch.equal(greedy.cpu(), logits.argmax(0)):
        raise Mismatch(f"{what}: got {greedy.tolist()}, one id per column: the argmax ran over the batch (dim 0); each "
                       "row needs its own, over the vocabulary (the last axis)")
    greedy = expect_tensor(greedy, what=what, shape=(2,), dtype="integer", device=logits)
    expect(greedy.tolist() == [0, 1],
           f"{what}: temperature 0 must pick the largest logit of each row: expected [0, 1], got {greedy.tolist()}")
    # Greedy at other sizes: batch 1 and 3, vocabularies of 5 and 7, an integer temperature 0.
    for B, V in ((1, 5), (3, 7)):
        other = randn(B, V, generator=generator, scale=2.0)
        what = f"sample_next(logits of shape ({B}, {V}), temperature=0)"
        got = expect_tensor(call(sample_next, other, 0, torch.Generator().manual_seed(0)), what=what, shape=(B,),
                            dtype="integer", device=other)
        expect_close(got, other.argmax(dim=-1), what=what)

    # Many rows whose two largest logits are 0.001 apart: at temperature 0 every id must be the argmax. Sampling at a
    # small temperature instead (a clamp such as max(temperature, 0.3), max(temperature, 0.01) or even
    # max(temperature, 1e-3), to avoid dividing by 0) picks the runner-up in a sizeable share of these rows (about 27%
    # at 1e-3); smaller clamps are named by the closer ties below.
    tied = torch.tensor([[2.0, 1.999, 0.0, -1.0], [1.999, 2.0, -1.0, 0.0]]).repeat(10000, 1)  # (20000, 4)
    what = "sample_next(logits of shape (20000, 4) whose two largest logits are 0.001 apart, temperature=0)"
    got = expect_tensor(call(sample_next, tied, 0.0, torch.Generator().manual_seed(0)), what=what, shape=(20000,),
                        dtype="integer", device=tied)
    wrong = int((got.long().cpu() != tied.argmax(dim=-1)).sum())
    expect(wrong == 0,
           f"{what}: {wrong:,} of 20,000 rows got an id other than their largest logit. At temperature 0 take the "
           "argmax of each row; do not sample at a small temperature instead (max(temperature, 0.3), "
           "max(temperature, 0.01) or max(temperature, 1e-3), say, to avoid dividing by 0): near-tied logits still "
           "give the runner-up a sizeable chance there")
    # Closer ties still, 1e-4, 1e-5 and 1e-6 apart (near 0, where float32 holds such gaps exactly): a clamp of the
    # temperature anywhere from 1e-6 up gives the runner-up a share of these rows (about 27% where the gap equals the
    # clamp), while a clamp as small as 1e-8 is 100 times below the closest gap and picks the argmax here: the exact
    # ties after this name it.
    close = torch.tensor([[0.0, -gap, -1.0, -2.0] for gap in (1e-4, 1e-5, 1e-6)]
                         + [[-gap, 0.0, -2.0, -1.0] for gap in (1e-4, 1e-5, 1e-6)]).repeat(2000, 1)  # (12000, 4)
    what = ("sample_next(logits of shape (12000, 4) whose two largest logits are 1e-4, 1e-5 or 1e-6 apart, "
            "temperature=0)")
    got = expect_tensor(call(sample_next, close, 0.0, torch.Generator().manual_seed(0)), what=what, shape=(12000,),
                        dtype="integer", device=close)
    wrong = got.long().cpu() != close.argmax(dim=-1)
    if bool(wrong.any()):
        gaps = [gap for k, gap in enumerate(("1e-4", "1e-5", "1e-6")) if bool(wrong.view(-1, 6)[:, [k, k + 3]].any())]
        raise Mismatch(f"{what}: {int(wrong.sum()):,} of 12,000 rows got an id other than their largest logit (rows "
                       f"{', '.join(gaps)} apart). At temperature 0 take the argmax of each "
                       "row; a clamp of the temperature, max(temperature, 1e-4), 1e-5 or 1e-6, is still a sample at a "
                       "small temperature, and logits that close give the runner-up a sizeable chance there")
    # Exact ties: rows whose largest logits are equal (two, three or four of them, at every place), each row repeated
    # 2,000 times. The argmax is deterministic: torch.argmax and numpy's argmax pick the first of the tied ids, the same
    # for every copy of a row (the statement does not say which tied id, so any one of them is accepted, as long as
    # every copy gets the same). A sample at temperature 0, whatever the clamp of the temperature (max(temperature,
    # 1e-9), 1e-30: exactly tied logits have no gap for the clamp to be small against), splits each row's copies
    # between its tied ids about evenly.
    patterns = [[0.0, 0.0, -1.0, -2.0], [-1.0, 3.0, 3.0, -2.0], [2.0, -1.0, 2.0, 2.0], [5.0, 5.0, 5.0, 5.0],
                [-2.0, 1.0, -3.0, 1.0]]
    exact = torch.tensor(patterns).repeat(2000, 1)  # (10000, 4): row r is pattern r % 5
    what = ("sample_next(logits of shape (10000, 4): 5 rows whose largest logits are exactly tied, each repeated "
            "2,000 times, temperature=0)")
    got = expect_tensor(call(sample_next, exact, 0.0, torch.Generator().manual_seed(0)), what=what, shape=(10000,),
                        dtype="integer", device=exact)
    got = got.long().cpu()
    largest = exact == exact.max(dim=-1, keepdim=True).values
    if bool((got < 0).any() or (got >= 4).any()):
        raise Mismatch(f"{what}: got ids outside 0 to 3: {sorted(set(got.tolist()))[:8]}")
    not_largest = ~largest.gather(-1, got[:, None])[:, 0]
    expect(not bool(not_largest.any()),
           f"{what}: {int(not_largest.sum()):,} of 10,000 rows got an id whose logit is not the row's largest. At "
           "temperature 0 take the argmax of each row")
    by_pattern = got.view(2000, len(patterns))  # column k holds the 2,000 copies of pattern k
    split = [k for k in range(len(patterns)) if bool((by_pattern[:, k] != by_pattern[0, k]).any())]
    if split:
        raise Mismatch(f"{what}: copies of one row got different ids among its tied largest logits (in {len(split)} of "
                       f"the {len(patterns)} rows, e.g. the copies of {patterns[split[0]]} got ids "
                       f"{sorted(set(by_pattern[:, split[0]].tolist()))}): this is sampling at temperature 0, a clamp "
                       "of the temperature (max(temperature, 1e-9), say). However small the clamp, it is still a "
                       "sample at a small temperature, and between exactly tied logits it draws at random. At "
                       "temperature 0 take the argmax of each row: it gives every copy of a row the same id (the "
                       "first of the tied ones)")

    # One row, sampled: the batch axis must survive (translate appends next_id[:, None] to each sentence).
    one = randn(1, 6, generator=generator)
    what = "sample_next(logits of shape (1, 6), temperature=1)"
    single = call(sample_next, one, 1.0, torch.Generator().manual_seed(0))
    if isinstance(single, torch.Tensor) and single.dim() == 0:
        raise Mismatch(f"{what}: got a tensor of shape () for one sentence: .squeeze() without an axis removes every "
                       "axis of size 1, the batch's too when B = 1; remove only the axis of the one sample drawn per "
                       "row")
    expect_tensor(single, what=what, shape=(1,), dtype="integer", device=one)

    many = logits[:1].repeat(20000, 1)  # the same distribution 20,000 times (a tensor of its own, not a view)
    for temperature in (1.0, 0.5, 2.0):
        what = f"sample_next(logits of shape (20000, 4), temperature={temperature})"
        first = expect_tensor(call(sample_next, many, temperature, torch.Generator().manual_seed(1)), what=what,
                              shape=(20000,), dtype="integer", device=many)
        again = call(sample_next, many, temperature, torch.Generator().manual_seed(1))
        expect(isinstance(again, torch.Tensor) and torch.equal(first, again),
               f"{what}: two calls with generators seeded alike gave different samples: draw with the generator you "
               "were given, so that the results are reproducible")
        frequencies = _frequencies(first, 4)
        expected = torch.softmax(logits[0].double() / temperature, dim=-1)
        if not torch.allclose(frequencies, expected, atol=0.02):
            at_one = torch.softmax(logits[0].double(), dim=-1)
            times = torch.softmax(logits[0].double() * temperature, dim=-1)
            detail = ""
            if temperature != 1.0 and torch.allclose(frequencies, at_one, atol=0.02):
                detail = " They match temperature 1: divide the logits by the temperature."
            elif temperature != 1.0 and torch.allclose(frequencies, times, atol=0.02):
                detail = " They match the logits multiplied by the temperature: divide by it instead."
            elif frequencies.max() > 0.99:
                detail = " Every sample is the same id: at a temperature above 0, draw at random."
            elif bool(((frequencies == 0) & (expected * len(first) > 20)).any()):
                detail = (" Some ids never came up: sample from the whole distribution: no top-k or top-p (nucleus) "
                          "cut, no id left out.")
            raise Mismatch(f"{what}: the ids should come up with frequencies {[round(p, 3) for p in expected.tolist()]}, "
                           f"yours came up {[round(p, 3) for p in frequencies.tolist()]}.{detail}")
        _expect_every_count(first, expected, what)
        other = call(sample_next, many, temperature, torch.Generator().manual_seed(2))
        expect(not (isinstance(other, torch.Tensor) and torch.equal(first, other)),
               f"{what}: generators seeded differently gave the same samples: draw with the generator you were "
               "given, not with one of your own (or the global one, reseeded)")
    # A small temperature above 0 is still a sample: at temperature t, rows whose two largest logits are t apart
    # give the runner-up about 26% of the draws; an answer that turns greedy below some threshold (argmax if
    # temperature < 0.5, < 0.2, < 0.095 or < 0.05) draws the largest logit every time. Tried at 0.1, 0.05 and 0.02
    # on these float32 rows of four logits (not smaller, so that each message here is about greedy decoding:
    # softmax(z) ** (1 / temperature) underflows to 0 at 0.01 in float32; at 0.02 these rows' softmax, about 0.25
    # each, to the 50th power is about 1e-30, a normal float32), then at 0.005 and 0.001 on float64 rows of two
    # logits, then at 1e-6 and below, where the powers underflow and are named.
    for small in (0.1, 0.05, 0.02):
        sharp = (torch.tensor([[1.0, 0.0, -2.0, -3.0]]) * small).repeat(20000, 1)  # (20000, 4): one row, 20,000 times
        what = (f"sample_next(logits of shape (20000, 4) whose two largest logits are {small:g} apart, "
                f"temperature={small:g})")
        got = expect_tensor(call(sample_next, sharp, small, torch.Generator().manual_seed(6)), what=what,
                            shape=(20000,), dtype="integer", device=sharp)
        want = torch.softmax(sharp[0].double() / small, dim=-1)  # about 0.696, 0.256, 0.035, 0.013
        if bool((got.long().cpu() == 0).all()):
            raise Mismatch(f"{what}: every row got its largest logit, id 0, where id 1 should come up "
                           f"{float(want[1]):.0%} of the time. Only temperature 0 is greedy: at every temperature "
                           "above 0, sample from softmax(logits / temperature)")
        _expect_every_count(got, want, what)
    # Smaller temperatures still, on float64 rows of two logits t apart (V = 2), so that logits / t is [1, 0] and the
    # runner-up still gets about 27% of the draws: at 0.005 and 0.001 greedy below a threshold under 0.02 is named (the
    # powers form still works there: 0.5 to the 1000th power is about 1e-301, a normal float64); at 1e-6, 1e-12 and
    # 1e-30 greedy below any threshold down to 1e-30 is named, and softmax(logits) ** (1 / temperature), about
    # 0.5 ** 1e6, underflows to 0 (in float32 as in float64) and is named with it: divide the logits by the
    # temperature first. (1e-30 is a normal float32, so an answer that computes in float32, as the course's dtype
    # policy allows, still divides right.)
    for small in (0.005, 0.001, 1e-6, 1e-12, 1e-30):
        sharp = torch.tensor([[small, 0.0]], dtype=torch.float64).repeat(20000, 1)  # (20000, 2) in float64
        what = (f"sample_next(logits of shape (20000, 2) in float64 whose two logits are {small:g} apart, "
                f"temperature={small:g})")
        try:
            got = call(sample_next, sharp, small, torch.Generator().manual_seed(8))
        except _StudentCodeFailed as failed:
            if small >= 1e-3:
                raise
            raise Mismatch(f"{what}: your code raised {type(failed.error).__name__}: "
                           f"{str(failed.error).splitlines()[0] if str(failed.error) else ''}. At so small a "
                           "temperature, probabilities raised to the power 1 / temperature (softmax(logits) ** "
                           "(1 / temperature)) underflow to 0: divide the logits by the temperature, then take the "
                           "softmax (it subtracts each row's max, so nothing overflows or underflows)") from None
        got = expect_tensor(got, what=what, shape=(20000,), dtype="integer", device=sharp)
        want = torch.softmax(sharp[0] / small, dim=-1)  # about 0.731, 0.269
        if bool((got.long().cpu() == 0).all()):
            raise Mismatch(f"{what}: every row got its largest logit, id 0, where id 1 should come up "
                           f"{float(want[1]):.0%} of the time. Only temperature 0 is greedy: at every temperature "
                           "above 0, however small, sample from softmax(logits / temperature)")
        _expect_every_count(got, want, what)
    # One generator, used at successive calls without reseeding, as translate(...) uses it at every decoding step:
    # each call must go on from where the last one stopped (the reference's two draws differ). An answer that
    # restarts from generator.initial_seed() (reseeding the global generator, or one of its own) or from a copy of
    # the generator's state is reproducible and tells differently seeded generators apart, and draws the same
    # numbers at every step: on a flat distribution it writes the same character again and again.
    what = "two successive calls sample_next(logits of shape (20000, 4), temperature=1.0, generator) with one generator"
    shared = torch.Generator().manual_seed(5)
    before = shared.get_state()
    first = call(sample_next, many, 1.0, shared)
    advanced = not torch.equal(shared.get_state(), before)
    second = call(sample_next, many, 1.0, shared)
    if isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor) and torch.equal(first, second):
        moved = "" if advanced else " (the generator's state did not change)"
        raise Mismatch(f"{what}: both calls gave the same samples{moved}: you restarted from the generator's seed "
                       "(generator.initial_seed(), through torch.manual_seed or a generator of your own) or from a "
                       "copy of its state. Draw from the generator itself, so that each call continues where the last "
                       "one stopped: translate(...) passes the same generator at every step, and a restarted one "
                       "draws the same numbers at every step")
    # Rows that differ (each row its own distribution) and logits near 100 in float32 (exp overflows there).
    mixed = torch.tensor([[3.0, 0.0, 0.0], [0.0, 0.0, 3.0]]).repeat(6000, 1)  # (12000, 3): rows alternate
    what = "sample_next(logits whose rows alternate between two distributions, temperature=1)"
    got = expect_tensor(call(sample_next, mixed, 1.0, torch.Generator().manual_seed(2)), what=what, shape=(12000,),
                        dtype="integer", device=mixed)
    for row in (0, 1):
        want = torch.softmax(mixed[row].double(), dim=-1)
        have = _frequencies(got[row::2], 3)
        expect(torch.allclose(have, want, atol=0.03),
               f"{what}: rows like row {row} should give frequencies {[round(p, 3) for p in want.tolist()]}, yours "
               f"gave {[round(p, 3) for p in have.tolist()]}: each row is its own distribution over the last axis")
        _expect_every_count(got[row::2], want, f"{what}, rows like row {row}")
    big = large_scores(4000, 3, generator=generator, spread=1.0)  # rows near +100 and -100
    what = "sample_next(logits near +100 and -100 in float32, temperature=1)"
    try:
        got = call(sample_next, big, 1.0, torch.Generator().manual_seed(3))
    except _StudentCodeFailed as failed:
        text = str(failed.error)
        if "inf" in text and "nan" in text.lower():
            raise Mismatch(f"{what}: your code raised {type(failed.error).__name__}: {text.splitlines()[0]}. exp of "
                           "a logit near 100 overflows float32 (to inf, and inf / inf is nan): subtract each row's "
                           "max before exp, or use torch.softmax, which does") from None
        raise
    got = expect_tensor(got, what=what, shape=(4000,), dtype="integer", device=big)
    expect(bool(((got >= 0) & (got < 3)).all()), f"{what}: ids must lie between 0 and V - 1 = 2, got {got.unique().tolist()}")
    _expect_large_rows_sampled_right(sample_next)
    # Logits that share a large offset, at temperature 0.01 in float32: logits / temperature lie near 5000, where
    # float16's spacing is 4, so a softmax taken in half precision makes the two ids equally likely (0.5 each)
    # instead of 0.378 and 0.622. (The powers form, named at 1e-6 above, would not underflow here: softmax(z), about
    # 0.5 each, to the 100th power is about 1e-30, a normal float32.)
    offset = torch.tensor([[50.0, 50.005]]).repeat(20000, 1)  # (20000, 2): one row, 20,000 times
    what = "sample_next(logits of shape (20000, 2) near 50 and 0.005 apart, in float32, temperature=0.01)"
    got = expect_tensor(call(sample_next, offset, 0.01, torch.Generator().manual_seed(9)), what=what,
                        shape=(20000,), dtype="integer", device=offset)
    want = torch.softmax(offset[0].double() / 0.01, dim=-1)  # about 0.378, 0.622
    have = _frequencies(got, 2)
    if abs(float(have[1]) - 0.5) < 0.02 < abs(float(want[1]) - 0.5):
        raise Mismatch(f"{what}: ids 0 and 1 came up about equally often ({float(have[0]):.3f} and {float(have[1]):.3f}), "
                       f"where id 1 should come up {float(want[1]):.3f} of the time: logits / temperature lie near "
                       "5000 here, where float16 (or bfloat16) cannot tell 5000 from 5000.5. Keep the logits' own "
                       "dtype for the division and the softmax")
    _expect_every_count(got, want, what)
    _expect_wide_rows_sampled_right(sample_next)  # after the float16 case, which names half precision by its own name
    # Once more on another device: the notebook's GPU with a generator there, as translate(...) on a GPU does, or
    # the meta device (with a CPU generator) where there is none, so that noise made without device= is named, and
    # ids returned on the CPU (.cpu() before or after sampling) too: translate(...) appends them to sentences that
    # live on the logits' device. Copying out and back (numpy's argmax, then .to(logits.device)) is a right answer:
    # on the meta device, _CopiesOut hands the copy stand-in values, so that the answer runs on to its result.
    device = other_device()
    on_device = logits.repeat(500, 1).to(device)  # (1000, 4)
    for temperature in (0.0, 1.0):
        what = f"sample_next(logits of shape (1000, 4) on the {device.type} device, temperature={temperature})"
        generator_there = torch.Generator(device=device) if device.type != "meta" else torch.Generator()
        copied = []  # the copies to the CPU that the answer made: "cpu", "numpy", ...

        @functools.wraps(sample_next)
        def answer(*args):
            with _CopiesOut(copied):
                return sample_next(*args)
        got = call_elsewhere(answer, on_device, temperature, generator_there.manual_seed(0), device=device,
                             what=what, made_by="torch.rand, torch.empty, torch.zeros, torch.tensor ...",
                             copy_out_is_a_mistake=True)
        if got is not None:
            if isinstance(got, torch.Tensor) and got.device.type != device.type and copied:
                calls = ", ".join(f".{name}()" for name in dict.fromkeys(copied))
                raise Mismatch(f"{what}: your ids came back on {got.device}, not on the logits' device"
                               f"{_meta_note(device)}: you copied data to the CPU ({calls}) and returned the result "
                               "there. translate(...) appends each id to sentences that live on the logits' device, "
                               "and mixing the two fails: sample where the logits are (torch.multinomial with the "
                               "generator you were given), or move the ids back with .to(logits.device)")
            got = expect_on_device(got, device, what, dtype="integer")
            expect_tensor(got, what=what, shape=(1000,), dtype="integer")
    return "greedy at temperature 0, and samples that follow softmax(logits / temperature) row by row, reproducibly."


# --------------------------------------------------------------------------------------------------
# Exercise 3


class _ToyModel:
    """A next-token distribution given by a table: prefix (after the start symbol) -> probabilities.

    Prefixes that the table does not list get a default that depends on the prefix, so that every
    sequence has its own score. Calls are (N, t) LongTensors whose rows start with ``start_id``.
    """

    def __init__(self, V: int, start_id: int, end_id: int, table: dict, seed: int, device=None) -> None:
        self.V, self.start_id, self.end_id, self.table, self.seed = V, start_id, end_id, table, seed
        self.device = device  # where the log-probabilities are returned (None: the CPU)
        self.watch = None  # a DeviceWatch that takes the log-probabilities to be on the device
        self.calls = 0

    def probabilities(self, prefix: tuple) -> torch.Tensor:
        if prefix in self.table:
            p = torch.zeros(self.V, dtype=torch.float64)
            for token, value in self.table[prefix].items():
                p[token] = value
            rest = 1 - float(p.sum())
            others = [i for i in range(self.V) if i not in self.table[prefix] and i != self.start_id]
            for i in others:
                p[i] = rest / len(others)
            return p
        g = torch.Generator().manual_seed(self.seed * 1000003 + hash(prefix) % 1000003)
        p = torch.rand(self.V, generator=g, dtype=torch.float64) + 0.05
        p[self.start_id] = 0.0
        p[self.end_id] += 0.25 * len(prefix)  # longer prefixes tend to end
        return p / p.sum()

    def __call__(self, prefixes) -> torch.Tensor:
        self.calls += 1
        if isinstance(prefixes, torch.Tensor) and prefixes.dim() == 2 and prefixes.size(1) == 0:
            raise ValueError(f"every prefix passed to next_log_probs must start with the start symbol "
                             f"{self.start_id}, got empty prefixes")
        if not isinstance(prefixes, torch.Tensor) or prefixes.dim() != 2 or prefixes.is_floating_point():
            raise TypeError(f"next_log_probs expects an (N, t) tensor of integer ids, got "
                            f"{type(prefixes).__name__} {getattr(prefixes, 'shape', '')}")
        rows = []
        for row in prefixes.tolist():
            if not row or row[0] != self.start_id:
                raise ValueError(f"every prefix passed to next_log_probs must start with the start symbol "
                                 f"{self.start_id}, got {row}")
            if self.end_id in row:
                raise ValueError(f"next_log_probs was asked to extend {row}, which has already ended "
                                 f"(end symbol {self.end_id}): a finished sequence stays as it is")
            rows.append(self.probabilities(tuple(row[1:])).log())
        log_probs = torch.stack(rows).float().to(self.device)  # (N, V)
        if self.watch is not None:
            self.watch.placed[log_probs] = True
        return log_probs


def _shrinking(model: _ToyModel, beam_width: int, max_len: int) -> list[int]:
    """A search whose beam shrinks: each sequence that ends leaves the beam for a list of finished ones and takes its
    place with it (the width drops to beam_width - 1, and so on), a pattern of some tutorials. It stops looking as
    wide as it should: with a beam of 2, once one sequence has ended, it goes on greedily."""
    beams, finished = [([model.start_id], 0.0)], []
    for _ in range(max_len):
        width = beam_width - len(finished)
        if width <= 0 or not beams:
            break
        candidates = []
        for ids, total in beams:
            log_p = model.probabilities(tuple(ids[1:])).log()
            candidates += [(ids + [token], total + float(log_p[token])) for token in range(model.V)
                           if token != model.start_id]
        top = sorted(candidates, key=lambda b: -b[1])[:width]
        finished += [b for b in top if b[0][-1] == model.end_id]
        beams = [b for b in top if b[0][-1] != model.end_id]
    return sorted(finished + beams, key=lambda b: -b[1])[0][0][1:]


def _variant(model: _ToyModel, beam_width: int, max_len: int, *, score="sum", first_finished=False,
             greedy=False, prefer_finished=False, prefer_unfinished=False, shrinking=False) -> list[int]:
    """The answer of a plausible wrong beam search (or the right one, with the defaults)."""
    if shrinking:
        return _shrinking(model, beam_width, max_len)
    width = 1 if greedy else beam_width
    beams = [([model.start_id], 0.0, 0.0)]  # ids, sum of log-probabilities, the last one
    for _ in range(max_len):
        alive = [b for b in beams if b[0][-1] != model.end_id]
        if not alive:
            break
        candidates = [b for b in beams if b[0][-1] == model.end_id]
        for ids, total, _ in alive:
            log_p = model.probabilities(tuple(ids[1:])).log()
            for token in range(model.V):
                if token != model.start_id:
                    candidates.append((ids + [token], total + float(log_p[token]), float(log_p[token])))

        def key(b):
            if score == "last":
                return -b[2]
            if score == "mean":
                return -b[1] / (len(b[0]) - 1)
            return -b[1]
        beams = sorted(candidates, key=key)[:width]
        if first_finished:
            done = [b for b in beams if b[0][-1] == model.end_id]
            if done:
                return done[0][0][1:]
    if prefer_finished:  # a finished survivor returned even where an unfinished one scores higher
        done = [b for b in beams if b[0][-1] == model.end_id]
        return (done or beams)[0][0][1:]
    if prefer_unfinished:  # an unfinished survivor returned at max_len even where a finished one scores higher
        alive = [b for b in beams if b[0][-1] != model.end_id]
        return (alive or beams)[0][0][1:]
    return beams[0][0][1:]


def _beam_cases():
    """(description, model, beam_width, max_len) from hand-made traps to random tables."""
    S, E, A, B, C, D = 1, 2, 3, 4, 5, 6
    greedy_trap = {(): {A: 0.5, B: 0.4, E: 0.1}, (A,): {A: 0.3, B: 0.25, C: 0.2, E: 0.25}, (B,): {C: 0.9, E: 0.1},
                   (B, C): {E: 0.97}, (A, A): {E: 0.6}}
    yield "a case where greedy decoding goes wrong", _ToyModel(7, S, E, greedy_trap, 1), 2, 6
    yield "the same case at beam_width=1 (greedy decoding)", _ToyModel(7, S, E, greedy_trap, 1), 1, 6
    late = {(): {A: 0.5, B: 0.45, E: 0.05}, (A,): {E: 0.4, A: 0.3, B: 0.3}, (B,): {C: 0.95}, (B, C): {D: 0.9},
            (B, C, D): {E: 0.95}}
    yield "a case where a worse sequence ends first", _ToyModel(7, S, E, late, 2), 2, 8
    early = {(): {E: 0.45, A: 0.35, B: 0.2}, (A,): {A: 0.26, B: 0.25, C: 0.25, E: 0.24}, (B,): {C: 0.5, E: 0.5}}
    yield "a case where ending at once is best", _ToyModel(7, S, E, early, 3), 2, 8
    never = {(): {A: 0.6, B: 0.4}, (A,): {A: 0.55, B: 0.45}, (B,): {A: 0.9, B: 0.1}, (A, A): {B: 0.7, A: 0.3},
             (A, B): {A: 0.8, B: 0.2}, (B, A): {A: 0.55, B: 0.45}}
    yield "a case that reaches max_len before any sequence ends", _ToyModel(4, 0, 1, {
        tuple(2 if t == A else 3 for t in k): {(2 if t == A else 3): v for t, v in d.items()} for k, d in never.items()
    }, 4), 2, 3
    unfinished = {(): {A: 0.65, E: 0.3}, (A,): {A: 0.9, E: 0.05}}  # after 2 tokens: A A (0.585) above E (0.3)
    yield "a case whose best survivor at max_len has not ended", _ToyModel(7, S, E, unfinished, 5), 2, 2
    finished = {(): {E: 0.6, A: 0.35}, (A,): {A: 0.6, B: 0.3}}  # after 2 tokens: E (0.6) above A A (0.21)
    yield "a case whose best survivor at max_len has ended", _ToyModel(7, S, E, finished, 6), 2, 2
    for seed, (V, width, max_len) in enumerate(((6, 2, 6), (5, 3, 7), (8, 4, 6), (7, 3, 5), (9, 2, 8)), start=10):
        start, end = (0, V - 1) if seed % 2 else (1, 2)  # the special ids are not always 1 and 2
        yield f"random tables (V={V}, start_id={start}, end_id={end})", _ToyModel(V, start, end, {}, seed), width, max_len
    # E ends at once (0.15) and stays in a beam of 2 beside A (0.8); A A (0.4) and A B (0.392) then push it out, and
    # A B E (0.372) wins. A beam that shrinks when E ends follows A A alone and returns E (the twentieth review).
    shrink = {(): {A: 0.8, E: 0.15, B: 0.05}, (A,): {A: 0.5, B: 0.49, E: 0.01}, (A, A): {A: 0.25, B: 0.25, C: 0.25, E: 0.05},
              (A, B): {E: 0.95}}
    yield "a case where a sequence ends early and the search must stay as wide", _ToyModel(7, S, E, shrink, 8), 2, 6
    yield _LONG_CASE, _ToyModel(200, S, E, _long_table(), 7), 2, 29


_LONG_CASE = "a long case (200 ids, 28 tokens before the end)"


def _long_table() -> dict:
    """Two finalists 28 tokens long whose totals lie near -109.64, 0.01 apart: A A ... A (each token 0.02) and
    B B ... B (0.0256 and 0.0004 / 0.0256 in turn, the same product per pair), B's end 1% more likely. The other
    198 ids share the rest (about 0.005 each), so both stay in a beam of 2 at every step. Summed in float32 or
    float64, B wins by 0.01; summed in float16 (spacing 0.0625 near 110), A comes out ahead by 0.0625; multiplied as
    probabilities, both are about 1e-48, which is 0 in float32."""
    A, B, E = 3, 4, 2
    table = {(): {A: 0.02, B: 0.0256}}
    for k in range(1, 28):
        table[(A,) * k] = {A: 0.02}
        table[(B,) * k] = {B: 0.0004 / 0.0256 if k % 2 else 0.0256}
    table[(A,) * 28], table[(B,) * 28] = {E: 0.9}, {E: 0.909}
    return table


def _beam_search_watched(beam_search_fn) -> None:
    """The first case once more on the CPU, with the model's log-probabilities taken to be on a GPU, under a
    :class:`DeviceWatch`: a beam search reads values (.tolist(), float(), topk's indices), so the meta device
    cannot run it, but the watch names a tensor made without ``device=`` (scores from torch.zeros, a
    torch.tensor of the scores so far) that meets the log-probabilities, which fails on a GPU. Ids kept on the
    CPU, as a list or a tensor, are fine: the model and the caller accept them."""
    description, model, width, max_len = next(_beam_cases())
    what = (f"beam_search(next_log_probs, beam_width={width}, max_len={max_len}, start_id={model.start_id}, "
            f"end_id={model.end_id}) on {description}, with log-probabilities taken to be on a GPU")
    with DeviceWatch() as watch:
        model.watch = watch
        call(beam_search_fn, model, width, max_len, model.start_id, model.end_id)
    if watch.mixed is not None:
        raise Mismatch(f"{what}: your code mixed a tensor made without device= (torch.zeros, torch.full, "
                       "torch.tensor ...), which lives on the CPU whatever the model's device, with the "
                       f"log-probabilities that next_log_probs returned, in `{watch.mixed}`. Where the model runs on "
                       "a GPU, as the notebook's does there, its log-probabilities are on the GPU and that fails. "
                       "Make such tensors on the log-probabilities' device (device=log_probs.device, or "
                       "zeros_like, new_zeros, new_tensor, full_like), or work with Python numbers (.tolist())")


_BEAM_MISTAKES = (
    ({"greedy": True}, "this is greedy decoding's answer: keep the beam_width best prefixes at every step, not one"),
    ({"score": "last"}, "you ranked the prefixes by the log-probability of their last token only; a prefix's score is "
                        "the sum of the log-probabilities of all its tokens"),
    ({"score": "mean"}, "you divided each score by the length (a length penalty); this exercise ranks by the plain "
                        "sum of log-probabilities"),
    ({"first_finished": True}, "you returned the first sequence that ended; a better one may still be in the beam: "
                               "stop when every survivor has ended and return the best"),
    ({"prefer_finished": True}, "after max_len tokens you returned a survivor that has ended, but one that has not "
                                "ended scores higher: return the best survivor, finished or not"),
    ({"prefer_unfinished": True}, "after max_len tokens you returned a survivor that has not ended, but one that has "
                                  "ended scores higher: return the best survivor, finished or not"),
    ({"shrinking": True}, "when a sequence ended you took its place out of the beam for good (the beam shrank to "
                          "beam_width - 1, then less), so the search stopped looking as wide as beam_width: keep the "
                          "beam_width best of the finished and the extended prefixes at every step, and a finished "
                          "one gives up its place only to better prefixes"),
)


@exercise(
    "Exercise 3, beam search",
    hint="keep a list of (ids, score) pairs, best first; at each step extend every unfinished prefix by every token, "
         "adding the token's log-probability to the prefix's score, keep the finished ones as they are, and keep the "
         "beam_width best of all these; stop when all survivors have ended (or after max_len tokens)",
    forbid=(beam_search, beam_translate),
)
def check_beam_search(beam_search_fn) -> str:
    results = []  # (what, model, width, max_len, got, expected)
    for description, model, width, max_len in _beam_cases():
        what = (f"beam_search(next_log_probs, beam_width={width}, max_len={max_len}, start_id={model.start_id}, "
                f"end_id={model.end_id}) on {description}")
        got = call(beam_search_fn, model, width, max_len, model.start_id, model.end_id)
        if isinstance(got, tuple) and len(got) == 2 and not isinstance(got[0], (int, float)):
            got = got[0]  # (ids, score) is fine too
        if isinstance(got, (list, tuple)) and len(got) == 0:
            got = torch.zeros(0, dtype=torch.long)  # no token at all: a list with nothing to tell its dtype
        got = expect_tensor(got, what=what, dtype="integer", convert=True).flatten().tolist()
        results.append((what, model, width, max_len, got, _variant(model, width, max_len)))
    wrong = [r for r in results if r[4] != r[5]]
    if not wrong:
        _beam_search_watched(beam_search_fn)
    device = _accelerator()
    if not wrong and device is not None:  # once more with a model whose log-probabilities live on the GPU
        description, model, width, max_len = next(_beam_cases())
        model.device = device
        what = (f"beam_search(next_log_probs, beam_width={width}, max_len={max_len}, start_id={model.start_id}, "
                f"end_id={model.end_id}) on {description}, with log-probabilities on {device}")
        got = call(beam_search_fn, model, width, max_len, model.start_id, model.end_id)
        if isinstance(got, tuple) and len(got) == 2 and not isinstance(got[0], (int, float)):
            got = got[0]
        got = expect_tensor(got, what=what, dtype="integer", convert=True).flatten().tolist()
        expected = _variant(model, width, max_len)
        expect(got == expected, f"{what}: expected {expected}, got {got} (on the CPU your search found it)")
    if not wrong:
        return ("your beam search finds what the reference finds, on traps for greedy decoding, on sequences that end "
                "early or late, and on random tables: beam_width=1 is greedy decoding, a wider beam looks further.")
    what, model, width, max_len, got, expected = wrong[0]
    if all(_LONG_CASE in r[0] for r in wrong):  # right everywhere but where the totals lie near -110, 0.01 apart
        raise Mismatch(f"{what}: expected {expected}, got {got}. The two best sequences here are 28 tokens long, with "
                       "total log-probabilities near -109.64 only 0.01 apart: scores kept in float16 (whose spacing "
                       "near 110 is 0.0625) or probabilities multiplied (about 1e-48, which is 0 in float32) cannot "
                       "tell them apart. Add the log-probabilities as they come (float32), or in float64")
    if all(r[4] == [r[1].start_id] + r[5] for r in results):
        raise Mismatch(f"{what}: leave the start symbol out of the result; return the ids after it")
    if all(r[4] == [t for t in r[5] if t != r[1].end_id] for r in results):
        raise Mismatch(f"{what}: you left out the end symbol; keep it at the end of a sequence that ended, so that "
                       "the caller can tell a finished sentence from one cut at max_len")
    if len(got) > max_len:
        raise Mismatch(f"{what}: your sequence has {len(got)} tokens; max_len={max_len} allows at most {max_len} "
                       "after the start symbol")
    # A result that has not ended and is shorter than max_len: the reference never returns one (an unfinished
    # survivor has max_len tokens), so the search stopped early (range(max_len - 1), say). Name it before comparing
    # scores, which would set an unfinished prefix against a complete sequence.
    early = [r for r in wrong if (not r[4] or r[4][-1] != r[1].end_id) and len(r[4]) < r[3]]
    if early:
        what, model, width, max_len, got, expected = early[0]
        raise Mismatch(f"{what}: expected {expected}, got {got}: yours has {len(got)} token(s) and has not ended, "
                       f"but max_len={max_len} allows {max_len}: your search stopped early. Run up to max_len steps, "
                       "and stop sooner only when every survivor has ended")
    for options, message in _BEAM_MISTAKES:  # a mistake is named only when it explains every case
        if all(r[4] == _variant(r[1], r[2], r[3], **options) for r in results):
            raise Mismatch(f"{what}: {message}")
    if all(r[4] == _variant(r[1], 2, r[3]) for r in results):  # a width of 2 wherever the width asked for differs
        raise Mismatch(f"{what}: your answer is right for beam_width=2 only: use the beam_width you are given")

    def score(ids):
        total, prefix = 0.0, ()
        for token in ids:
            total += float(model.probabilities(prefix)[token].log())
            prefix += (token,)
        return total
    scored = bool(got) and all(0 <= t < model.V for t in got)
    shown = f" (total log-probability {score(got):.3f})" if scored else ""
    better = ""
    if scored and score(got) > score(expected) + 1e-9:  # the student sees a higher score and doubts the check
        better = (". Yours is more probable, but beam search does not promise the most probable sequence: it drops "
                  "prefixes that score lower at some step. Yours is not the one that the search described in the "
                  "exercise keeps (at every step, the beam_width best of all the extended and finished prefixes)")
    raise Mismatch(f"{what}: expected {expected} (total log-probability {score(expected):.3f}), got {got}{shown}"
                   f"{better}")


# --------------------------------------------------------------------------------------------------
# Exercise 4


def _wirings(layer: DecoderLayer, x, memory, memory_padding) -> dict:
    """The right post-norm output and the outputs of the plausible wrong wirings, by name."""
    self_attn, cross_attn, ffn = layer.self_attn, layer.cross_attn, layer.feed_forward
    n1, n2, n3 = layer.norm1, layer.norm2, layer.norm3

    def attend_self(h, causal=True):
        return self_attn(h, h, h, is_causal=causal, need_weights=False)[0]

    def attend_source(h, padding=memory_padding, keys=None):
        keys = memory if keys is None else keys
        return cross_attn(h, keys, keys, key_padding_mask=padding, need_weights=False)[0]

    def post(attend_self_fn=attend_self, attend_source_fn=attend_source, residual=True, norms=(n1, n2, n3)):
        a, b, c = norms
        h = a((x if residual else 0) + attend_self_fn(x))
        h = b((h if residual else 0) + attend_source_fn(h))
        return c((h if residual else 0) + ffn(h))

    def query_from_input():  # the cross-attention's queries taken from the layer's input, not from h
        h = n1(x + attend_self(x))
        h = n2(h + cross_attn(x, memory, memory, key_padding_mask=memory_padding, need_weights=False)[0])
        return n3(h + ffn(h))

    def pre_norm():
        h = x + attend_self(n1(x))
        h = h + attend_source(n2(h))
        return h + ffn(n3(h))

    T = x.size(1)
    allowed = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()  # True = may attend: the other convention

    wirings = {
        "right": post(),
        "mask in the allowed convention": post(
            attend_self_fn=lambda h: self_attn(h, h, h, attn_mask=allowed, need_weights=False)[0]),
        "pre-norm": pre_norm(),
        "no causal mask": post(attend_self_fn=lambda h: attend_self(h, causal=False)),
        "cross-attention to itself": post(attend_source_fn=lambda h: attend_source(h, padding=None, keys=h)),
        "no residual": post(residual=False),
        "query from the input": query_from_input(),
    }
    for k, order in enumerate(_NORM_ORDERS):  # every other order of the three norms (norm1 and norm2 swapped, ...)
        wirings[f"norms in another order {k}"] = post(norms=tuple((n1, n2, n3)[i] for i in order))
    if bool(memory_padding.any()):
        wirings["padding attended"] = post(attend_source_fn=lambda h: attend_source(h, padding=None))
        if not bool(memory_padding.all(dim=-1).any()):
            wirings["padding inverted"] = post(attend_source_fn=lambda h: attend_source(h, padding=~memory_padding))
    return wirings


_NORM_ORDERS = ((1, 0, 2), (0, 2, 1), (2, 1, 0), (1, 2, 0), (2, 0, 1))  # the five orders of (norm1, norm2, norm3) but one
_WIRING_MESSAGES = {
    "pre-norm": "that is the pre-norm wiring, x + sublayer(norm(x)) (what this layer's own forward does); "
                "post-norm normalises after the residual sum: x = norm(x + sublayer(x))",
    "mask in the allowed convention": "your causal mask is in the other convention, True where attending is allowed "
                                      "(the lower triangle, as F.scaled_dot_product_attention and ac.causal_mask take "
                                      "it); layer.self_attn takes True where attending is blocked, so each position "
                                      "saw only the future: pass is_causal=True, or a mask that is True above the "
                                      "diagonal",
    "no causal mask": "the self-attention sees the future: the decoder's self-attention must be causal",
    "padding attended": "the cross-attention reads the source's padding: pass memory_padding (True at padding) to the "
                        "cross-attention as its key padding mask",
    "padding inverted": "the cross-attention's padding mask is inverted: memory_padding is already True at padding, "
                        "the blocked convention that layer.cross_attn expects; pass it as it is",
    "cross-attention to itself": "the cross-attention takes its keys and values from the decoder; they come from "
                                 "memory (the encoder's output)",
    "no residual": "the residual connections are missing: each sub-layer's output is added to its input "
                   "before the norm, norm(x + sublayer(x))",
    **{f"norms in another order {k}": "the right wiring with the norms swapped: norm1 follows the self-attention, "
                                      "norm2 the cross-attention, norm3 the feed-forward network"
       for k in range(5)},
    "query from the input": "the cross-attention's queries come from the layer's input; they come from the output of "
                            "the first sub-layer (after norm1), as each sub-layer reads the one before it",
}


def _layer(E: int, H: int, seed: int) -> DecoderLayer:
    g = rng(seed)
    layer = DecoderLayer(E, H, 2 * E, norm_first=True).eval()  # pre-norm: its own forward is not the answer
    with torch.no_grad():
        for parameter in layer.parameters():  # seeded weights, and norms that are not the identity
            parameter.copy_(randn(*parameter.shape, generator=g, scale=0.3))
        for norm in (layer.norm1, layer.norm2, layer.norm3):
            norm.weight.copy_(1 + 0.5 * randn(E, generator=g))
    return layer


def _longer_than_the_notebook(post_norm_decoder_layer, layer, x, memory, memory_padding, what: str):
    """The answer's output for a target longer than the notebook's T = 6; a failure that names a mask's or an
    attention's shape is the mistake of a causal mask sized for the notebook's T."""
    try:
        return call(post_norm_decoder_layer, layer, x, memory, memory_padding)
    except _StudentCodeFailed as failed:
        text = str(failed.error)
        if "mask" in text.lower() or "shape" in text.lower() or "size" in text.lower():
            raise Mismatch(f"{what}: your code raised {type(failed.error).__name__}: "
                           f"{text.splitlines()[0] if text else ''}. A causal mask sized for the notebook's T = 6 (and "
                           "sliced to T) does not fit a longer target: build it from the length of h, "
                           "h.size(1)") from None
        raise


def _post_norm_elsewhere(post_norm_decoder_layer) -> None:
    """The notebook's sizes once more on another device: the notebook's GPU, or the meta device where there is
    none (a causal mask made without device= is named)."""
    device = other_device()
    layer = _layer(16, 4, 99)
    g = rng(199)
    x, memory = randn(2, 6, 16, generator=g), randn(2, 5, 16, generator=g)
    memory_padding = torch.tensor([[False] * 5, [False, False, False, True, True]])
    what = (f"post_norm_decoder_layer(layer, h of shape (2, 6, 16), memory of shape (2, 5, 16), memory_padding) with "
            f"the layer and the inputs on the {device.type} device")
    there = [t.to(device) for t in (x, memory, memory_padding)]

    @functools.wraps(post_norm_decoder_layer)
    def answer(*args):  # nn.MultiheadAttention says "attn_mask is on cpu but query is on meta": name the device
        try:
            return post_norm_decoder_layer(*args)
        except ValueError as error:
            if " is on cpu but " in str(error):
                raise ValueError(f"{error} (a tensor on the cpu device)") from None
            raise
    with torch.no_grad():
        with forbidden(*_LIBRARY_LAYERS, reason="this exercise asks you to wire the layer's own sub-modules yourself, "
                                                "not to hand them to a library layer"):
            got = call_elsewhere(answer, layer.to(device), *there, device=device, what=what,
                                 made_by="torch.ones, torch.triu, torch.tensor ...")
    if got is None:
        return
    got = expect_on_device(got, device, what, dtype="float")
    expect_tensor(got, what=what, shape=(2, 6, 16))
    if device.type != "meta":
        with torch.no_grad():
            reference = _post_norm_reference(layer.to(device), *there)
        expect_close(got, reference, what=f"{what}: the output")


def _post_norm_reference(layer: DecoderLayer, x, memory, memory_padding):
    post = DecoderLayer(layer.norm1.normalized_shape[0], layer.self_attn.num_heads,
                        layer.feed_forward.expand.out_features, norm_first=False).eval()
    post = post.to(dtype=x.dtype, device=x.device)
    post.load_state_dict(layer.state_dict())
    return post(x, memory, memory_key_padding_mask=memory_padding)[0]


def _gradients_flow(post_norm_decoder_layer) -> None:
    """One case with autograd on (the others run under torch.no_grad()): a layer is there to be trained, so its
    output's gradients with respect to h, to memory (the encoder trains through the cross-attention) and to every
    weight must be DecoderLayer(norm_first=False)'s. An answer that detaches its output, or runs under
    torch.no_grad() as the notebook's inspection cells do, gives the right values and no gradient; one that detaches
    memory (or reads memory.data) gives the right values and leaves the encoder untrained."""
    B, T, S, E, H = 2, 5, 4, 8, 2
    layer = _layer(E, H, 77).double()
    g = rng(177)
    x = randn(B, T, E, generator=g).double().requires_grad_()
    memory = randn(B, S, E, generator=g).double().requires_grad_()
    memory_padding = torch.tensor([[False] * S, [False, False, True, True]])
    what = (f"post_norm_decoder_layer(layer, h of shape {(B, T, E)} and memory of shape {(B, S, E)}, both requiring "
            "grad, memory_padding), with autograd on")
    with forbidden(layer, reason=_NOT_A_LAYER), \
            forbidden(*_LIBRARY_LAYERS, reason="this exercise asks you to wire the layer's own sub-modules yourself, "
                                               "not to hand them to a library layer"):
        got = call(post_norm_decoder_layer, layer, x, memory, memory_padding)
    got = expect_tensor(got, what=what, shape=(B, T, E), dtype="float")
    if not got.requires_grad:
        raise Mismatch(f"{what}: your output carries no gradient: it was computed under torch.no_grad() (or "
                       "torch.inference_mode()), or cut from autograd by .detach() or .data. The values are right, "
                       "but a layer built so cannot be trained: leave autograd on")
    post = DecoderLayer(E, H, layer.feed_forward.expand.out_features, norm_first=False).eval().double()
    post.load_state_dict(layer.state_dict())
    reference = post(x, memory, memory_key_padding_mask=memory_padding)[0]
    weights = randn(B, T, E, generator=g).double()  # the gradient of sum(weights * output)
    names = ["h", "memory"] + [name for name, _ in layer.named_parameters()]
    yours = torch.autograd.grad((got * weights).sum(), [x, memory, *layer.parameters()], allow_unused=True)
    theirs = torch.autograd.grad((reference * weights).sum(), [x, memory, *post.parameters()], allow_unused=True)
    atol, rtol = tolerance(torch.float64)
    inputs = {"h": x, "memory": memory}
    for name, a, b in zip(names, yours, theirs):
        b = torch.zeros_like(inputs[name] if name in inputs else dict(post.named_parameters())[name]) if b is None else b
        if a is None or not torch.allclose(a.detach(), b.detach(), atol=atol, rtol=rtol):
            state = "none at all" if a is None else "it differs"
            raise Mismatch(f"{what}: your output is right, but its gradient with respect to {name} is not "
                           f"({state}): part of the computation is cut from autograd (.detach(), .data or "
                           "torch.no_grad() on part of the way), so the layer would not learn as "
                           "DecoderLayer(norm_first=False) does")


_NOT_A_LAYER = ("this exercise asks you to wire the layer's sub-modules yourself (norm1, self_attn, norm2, cross_attn, "
                "norm3, feed_forward), not to run a DecoderLayer: the given layer's own forward is the pre-norm "
                "wiring, and a DecoderLayer(norm_first=False) is the check's reference, the answer itself")
_LIBRARY_LAYERS = (DecoderLayer.apply_sublayers, Transformer, torch.nn.TransformerDecoderLayer, torch.nn.TransformerDecoder,
                   torch.nn.Transformer, torch.nn.MultiheadAttention, torch.nn.functional.multi_head_attention_forward)


@exercise(
    "Exercise 4, the original (post-norm) decoder layer",
    hint="three sub-layers in turn, each added to its input and then normalised: the causal self-attention (norm1), "
         "the cross-attention whose keys and values are memory, with the source's padding mask (norm2), the "
         "feed-forward network (norm3)",
)
def check_post_norm_decoder_layer(post_norm_decoder_layer) -> str:
    float32, float64 = torch.float32, torch.float64
    cases = [("the notebook's sizes", 2, 6, 5, 16, 4, torch.tensor([[False] * 5, [False, False, False, True, True]]),
              float32)]
    for name, mask in padding_cases(3, 6, convention="blocked"):
        cases.append((name, 3, 4, 6, 12, 3, mask, float32))
    for size in other_sizes():
        lengths = [size.S] + [max(1, size.S - 1 - b) for b in range(1, size.B)]
        mask = torch.arange(size.S)[None, :] >= torch.tensor(lengths)[:, None]  # (B, S): right padding
        cases.append((f"sizes {size}", size.B, size.L, size.S, size.E, size.H, mask, float32))
    # A target longer than the notebook's T = 6 (a causal mask built for that size and sliced does not fit it).
    cases.append(("a target of T = 40, longer than the notebook's T = 6", 2, 40, 7, 16, 4,
                  torch.tensor([[False] * 7, [False] * 5 + [True] * 2]), float32))
    cases.append(("float64 inputs and weights", 2, 5, 4, 8, 2, torch.tensor([[False] * 4, [False, False, True, True]]),
                  float64))
    for seed, (name, B, T, S, E, H, memory_padding, dtype) in enumerate(cases):
        layer = _layer(E, H, seed).to(dtype)
        g = rng(100 + seed)
        x, memory = randn(B, T, E, generator=g).to(dtype), randn(B, S, E, generator=g).to(dtype)  # (B, T, E), (B, S, E)
        what = (f"post_norm_decoder_layer(layer, h of shape (B, T, E) = {(B, T, E)}, memory of shape {(B, S, E)}, "
                f"memory_padding with {name})")
        with torch.no_grad():
            with forbidden(layer, reason=_NOT_A_LAYER), \
                    forbidden(*_LIBRARY_LAYERS, reason="this exercise asks you to wire the layer's own sub-modules "
                                                       "yourself, not to hand them to a library layer"):
                if T > 6:
                    got = _longer_than_the_notebook(post_norm_decoder_layer, layer, x, memory, memory_padding, what)
                else:
                    got = call(post_norm_decoder_layer, layer, x, memory, memory_padding)
            reference = _post_norm_reference(layer, x, memory, memory_padding)
            wirings = _wirings(layer, x, memory, memory_padding)
        if isinstance(got, (tuple, list)):
            raise Mismatch(f"{what}: return only the layer's output tensor (B, T, E), not a {type(got).__name__}")
        got = expect_tensor(got, what=what, shape=(B, T, E), dtype="float", device=x)
        expect(got.dtype == dtype, f"{what}: your result is {got.dtype} but the inputs and the layer are {dtype}: "
                                   "keep the inputs' dtype (no .double(), .float() or .half() on the way)")
        atol, rtol = tolerance(dtype)

        def same(a, b):
            return torch.allclose(a.detach().double().cpu(), b.detach().double().cpu(), atol=atol, rtol=rtol)
        if same(got, reference):
            continue
        for wiring, message in _WIRING_MESSAGES.items():
            if wiring in wirings and same(got, wirings[wiring]) and not same(wirings[wiring], reference):
                raise Mismatch(f"{what}: {message}")
        if same(got, x):
            raise Mismatch(f"{what}: the output equals the input: apply the three sub-layers")
        expect_close(got, reference, what=f"{what}: the output (compared with DecoderLayer(norm_first=False) holding the "
                                          "same weights)")
    _gradients_flow(post_norm_decoder_layer)
    _post_norm_elsewhere(post_norm_decoder_layer)
    return ("your post-norm wiring gives what DecoderLayer(norm_first=False) gives with the same weights (to rounding), "
            "at every size, padding and dtype tried: the original Transformer's layer.")
