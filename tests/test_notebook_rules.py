"""Rules every chapter notebook keeps, read from the committed, executed notebooks (nothing is executed
here), and the check that tools/execute.py compares outputs exactly as nbval does.

The rules (issue 16, "guards so these kinds do not come back"):

- **Stated run time.** The header's **Time** paragraph (the first cell) says how long the notebook
  runs in one fixed phrase, ``runs top to bottom in about N s on <machine>`` (or ``about N min``),
  and N is within 0.67x to 1.5x of the time the committed notebook records (nbclient's
  ``metadata.execution`` timestamps, from the first code cell's start to the last one's reply).
  ``make execute`` (tools/execute.py) prints that phrase for the run it just recorded: copy it.
  Any other sentence about the whole notebook's run time ("the notebook runs in under a minute",
  "in a few seconds") must hold for the recorded time too.
- **Solutions print only their verdict.** A cell tagged ``solution`` shows nothing but the check's
  feedback for a correct answer: per check, the line "✅ <title>: correct." and its one-line message.
- **Predict, then see.** A markdown cell that asks the reader to predict ("predict:", "Predict
  first", "Before you run ...", "What do you expect", "Guess ... before") may be followed by code
  cells (running them is how the reader checks), but the next markdown cell either starts a new
  section (a heading) or gives the answer collapsed, as HTML that Jupyter, JupyterLab, Colab and
  the site all render closed::

      <details><summary>Answer</summary>

      The answer, in Markdown (a blank line after the summary line and before the closing tag).

      </details>

- **Errors in a form that survives versions.** A cell whose output nbval compares does not print
  the text of an error raised by PyTorch (``except RuntimeError as error: print(error)``): PyTorch
  rewords its messages between releases (2.15 prefixed "mm: " to the matmul shape error). Print
  the error's type and the shapes instead, or tag the cell ``nbval-ignore-output``.

Chapters that break a rule today are listed in ``KNOWN_FAILURES`` below, per rule, with a strict
xfail: the test suite stays green, and the test turns red as soon as the chapter is fixed. Fixing a
chapter therefore means deleting its entry here, in the same commit. Do not add entries for new
chapters.
"""

from __future__ import annotations

import ast
import json
import pathlib
import re
import sys
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import execute  # noqa: E402  (tools/execute.py)

CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))

# (rule, chapter stem) -> why the chapter fails it today. Strict xfail: delete the entry once fixed.
KNOWN_FAILURES: dict[str, dict[str, str]] = {
    "header_run_time": {
    },
    "prose_run_time": {
    },
    "solution_output": {
    },
    "predict_answer": {
    },
    "torch_error_text": {
    },
    "sections": {
    },
}


def _chapters(rule: str):
    """The chapters, each marked xfail(strict=True) where KNOWN_FAILURES lists it for this rule."""
    known = KNOWN_FAILURES[rule]
    unknown = set(known) - {path.stem for path in CHAPTERS}
    assert not unknown, f"KNOWN_FAILURES[{rule!r}] names chapters that do not exist: {sorted(unknown)}"
    return [pytest.param(path, id=path.stem,
                         marks=[pytest.mark.xfail(strict=True, reason=known[path.stem])] if path.stem in known else [])
            for path in CHAPTERS]


def _load(path: pathlib.Path) -> dict:
    return json.loads(path.read_text())


def _source(cell) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _text(output) -> str:
    """The text an output shows: a stream's text, or a result's text/plain."""
    if output.get("output_type") == "stream":
        text = output.get("text", "")
    else:
        text = output.get("data", {}).get("text/plain", "")
    return "".join(text) if isinstance(text, list) else text


# ---------------------------------------------------------------------------------------------------
# tools/execute.py compares what nbval compares, as nbval compares it

def _nbval_cell(patterns):
    """An object on which nbval's own IPyNbCell.sanitize and compare_outputs run, as in a pytest run
    with --nbval-sanitize-with (the parts of the pytest item that those two methods use)."""
    from nbval.plugin import IPyNbCell, nocolors

    parent = types.SimpleNamespace(sanitize_patterns=patterns, skip_compare=(
        # IPyNbFile.__init__ without --nbdime
        "metadata", "traceback", "prompt_number", "output_type", "name", "execution_count",
        "application/vnd.jupyter.widget-view+json", "image/png", "image/jpeg"))
    cell = types.SimpleNamespace(parent=parent, colors=nocolors, comparison_traceback=[])
    cell.sanitize = lambda text: IPyNbCell.sanitize(cell, text)
    cell.format_output_compare = lambda key, left, right: None
    cell.compare = lambda test, ref: IPyNbCell.compare_outputs(cell, test, ref)
    return cell


def _nbval_patterns():
    """The patterns exactly as nbval loads them (IPyNbFile.setup_sanitize_files)."""
    from collections import OrderedDict

    from nbval.plugin import get_sanitize_patterns

    patterns = OrderedDict()
    with open(ROOT / "tests" / "nbval_sanitize.cfg") as handle:
        patterns.update(get_sanitize_patterns(handle.read()))
    return patterns


TRICKY_TEXTS = [
    "all 16 sentences are right",      # no time: "16 s" followed by a letter
    "one step took 12.5 ms",            # a time at the end of the text
    "trained in 3 s.",                  # a time before a full stop
    "attention: 40 s, training: 26 s\n",
    "mean 7 µs per call, 8us at most",
    "<Figure at 0x7f3a2b1c4d90>",
    "object at 0x7F3A and 0xdeadBEEF",
    "line one took 2.0 s\nline two: 16 sentences\n  line three 100ms \n",
    "no numbers at all",
    "0x12 s",
]


def test_sanitize_file_has_patterns_and_no_trailing_spaces():
    text = (ROOT / "tests" / "nbval_sanitize.cfg").read_text()
    assert execute.sanitize_patterns() == _nbval_patterns() and len(_nbval_patterns()) >= 2
    assert not [line for line in text.splitlines() if line != line.rstrip()], \
        "a trailing space is part of nbval's pattern, and editors remove it: end the pattern with \\b instead"


@pytest.mark.parametrize("text", TRICKY_TEXTS)
def test_execute_sanitizes_as_nbval(text):
    nbval = _nbval_cell(_nbval_patterns())
    assert execute.sanitize(text, execute.sanitize_patterns()) == nbval.sanitize(text)


def test_sanitized_examples():
    patterns = execute.sanitize_patterns()
    assert execute.sanitize("all 16 sentences", patterns) == "all 16 sentences"
    assert execute.sanitize("12.5 ms", patterns) == "TIME"
    assert execute.sanitize("3 s.", patterns) == "TIME."
    assert execute.sanitize("at 0x7f3a2b", patterns) == "at 0xADDRESS"
    assert execute.sanitize("a: 2 s\nb: 16 sentences\n", patterns) == "a: TIME\nb: 16 sentences\n"


def _stream(text, name="stdout"):
    import nbformat

    return nbformat.v4.new_output("stream", name=name, text=text)


def _result(data, kind="execute_result"):
    import nbformat

    if kind == "execute_result":
        return nbformat.v4.new_output(kind, data=data, execution_count=1)
    return nbformat.v4.new_output(kind, data=data)


OUTPUT_PAIRS = {
    "same text": ([_stream("a\n")], [_stream("a\n")]),
    "streams split differently": ([_stream("a\n"), _stream("b\n")], [_stream("a\nb\n")]),
    "stderr and stdout interleaved": ([_stream("a\n"), _stream("w\n", "stderr"), _stream("b\n")],
                                      [_stream("a\nb\n"), _stream("w\n", "stderr")]),
    "a time differs": ([_stream("took 12.5 ms\n")], [_stream("took 3 ms\n")]),
    "a count differs": ([_stream("all 16 sentences\n")], [_stream("all 17 sentences\n")]),
    "a progress bar's carriage returns": ([_stream("10%\r50%\r100%\n")], [_stream("100%\n")]),
    "another picture, same text": ([_result({"image/png": "AAAA", "text/plain": "<Figure size 640x480 with 1 Axes>"}, "display_data")],
                                   [_result({"image/png": "BBBB", "text/plain": "<Figure size 640x480 with 1 Axes>"}, "display_data")]),
    # (the address pattern also hides a figure's size: "640x480" holds "0x480")
    "another number of axes": ([_result({"image/png": "AAAA", "text/plain": "<Figure size 640x480 with 1 Axes>"}, "display_data")],
                               [_result({"image/png": "AAAA", "text/plain": "<Figure size 640x400 with 2 Axes>"}, "display_data")]),
    "html differs": ([_result({"text/html": "<b>1</b>", "text/plain": "x"})], [_result({"text/html": "<b>2</b>", "text/plain": "x"})]),
    "a widget's model id": ([_result({"application/vnd.jupyter.widget-view+json": {"model_id": "a"}, "text/plain": "VBox()"})],
                            [_result({"application/vnd.jupyter.widget-view+json": {"model_id": "b"}, "text/plain": "VBox()"})]),
    "one output more": ([_stream("a\n")], [_stream("a\n"), _result({"text/plain": "1"})]),
    "an address": ([_result({"text/plain": "<object at 0x7f00>"})], [_result({"text/plain": "<object at 0x7fff>"})]),
    "a multi-line result": ([_result({"text/plain": "tensor([[1.000, 2.000],\n        [3.000, 4.000]])"})],
                            [_result({"text/plain": "tensor([[1.000, 2.000],\n        [3.000, 4.001]])"})]),
}


@pytest.mark.parametrize("name", OUTPUT_PAIRS)
def test_execute_compares_outputs_as_nbval(name):
    import copy

    first, second = OUTPUT_PAIRS[name]
    patterns = execute.sanitize_patterns()
    ours = execute.compared_outputs(first, patterns) == execute.compared_outputs(second, patterns)
    # nbval merges the streams of both sides before comparing (coalesce_streams), then compares.
    from nbval.plugin import coalesce_streams

    theirs = _nbval_cell(_nbval_patterns()).compare(coalesce_streams(copy.deepcopy(first)),
                                                    coalesce_streams(copy.deepcopy(second)))
    assert ours == theirs
    expected = name in {"same text", "streams split differently", "stderr and stdout interleaved", "a time differs",
                        "a progress bar's carriage returns", "another picture, same text", "a widget's model id",
                        "an address"}
    assert ours == expected, name


def test_execute_compares_the_cells_nbval_compares():
    import nbformat

    cells = [nbformat.v4.new_code_cell("print(1)", execution_count=1),
             nbformat.v4.new_code_cell("print(1)", execution_count=2, metadata={"tags": ["nbval-ignore-output"]}),
             nbformat.v4.new_code_cell("# NBVAL_IGNORE_OUTPUT\nprint(1)", execution_count=3),
             nbformat.v4.new_code_cell("print(1)", execution_count=4, metadata={"tags": ["nbval-skip"]}),
             nbformat.v4.new_code_cell("print(1)", execution_count=None),
             nbformat.v4.new_code_cell("print(1)", execution_count=6, metadata={"tags": ["raises-exception"]})]
    assert [execute.compared_by_nbval(cell) for cell in cells] == [True, False, False, False, False, True]


# ---------------------------------------------------------------------------------------------------
# Stated run time

NUMBER_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
                "eight": 8, "nine": 9, "ten": 10, "fifteen": 15, "twenty": 20, "thirty": 30, "forty": 40,
                "fifty": 50, "sixty": 60, "ninety": 90, "half a": 0.5}
_NUMBER = r"(?P<number>\d+(?:\.\d+)?|" + "|".join(sorted(NUMBER_WORDS, key=len, reverse=True)) + ")"
_UNIT = r"(?P<unit>seconds?|s|minutes?|min)\b"
# "<verb> [top to bottom] in <claim>": the claims a sentence about the whole notebook makes.
RUN_CLAIM = re.compile(
    r"\b(?:runs?|ran|takes?|took)\b(?:\s+top\s+to\s+bottom)?(?:\s+in)?\s+"
    r"(?P<kind>well under|under|less than|within|about|around|roughly|in|)\s*"
    r"(?:(?P<few>a few seconds)|" + _NUMBER + r"\s*" + _UNIT + ")", re.IGNORECASE)
WHOLE_NOTEBOOK = re.compile(r"\bnotebook\b|\btop to bottom\b|\bwhole chapter\b", re.IGNORECASE)


def _claims(text: str):
    """(sentence, kind, seconds) for each run-time claim about the whole notebook in a markdown text."""
    for match in RUN_CLAIM.finditer(text):
        start = max(text.rfind(". ", 0, match.start()), text.rfind(".\n", 0, match.start()), text.rfind(";", 0, match.start()))
        end_candidates = [i for i in (text.find(". ", match.end()), text.find(".\n", match.end()), text.find(";", match.end())) if i >= 0]
        sentence = text[start + 1: min(end_candidates) if end_candidates else len(text)]
        before = text[start + 1: match.start()]
        if not WHOLE_NOTEBOOK.search(before):
            continue  # about a cell, a model, a training run: not the notebook
        if match["few"]:
            yield sentence.strip(), "under", 10.0
            continue
        number = match["number"].lower()
        value = NUMBER_WORDS[number] if number in NUMBER_WORDS else float(number)
        seconds = value * (60 if match["unit"].lower().startswith("m") else 1)
        kind = "under" if match["kind"].lower() in ("well under", "under", "less than", "within") else "about"
        yield sentence.strip(), kind, seconds


def _recorded(nb) -> float:
    seconds = execute.recorded_seconds(nb)
    assert seconds is not None, "the notebook records no execution times (execute it with make execute)"
    return seconds


@pytest.mark.parametrize("path", _chapters("header_run_time"))
def test_header_states_the_recorded_run_time(path):
    nb = _load(path)
    header = _source(nb["cells"][0])
    low, high = execute.RUN_TIME_TOLERANCE
    phrases = list(execute.RUN_TIME_PHRASE.finditer(header))
    recorded = _recorded(nb)
    suggestion = execute.run_time_phrase(recorded)
    assert len(phrases) == 1, (f"{path.name}: the header's Time line should say once "
                               f"'runs top to bottom in about N s on <machine>'; for this record: '{suggestion}'")
    phrase = phrases[0]
    assert phrase["machine"], f"{path.name}: say on what machine ('{phrase[0]} on a 2-core CPU')"
    stated = execute.stated_seconds(phrase)
    assert low <= stated / recorded <= high, (f"{path.name}: the header says {stated:.0f} s, the notebook records "
                                              f"{recorded:.0f} s; for this record: '{suggestion}'")


@pytest.mark.parametrize("path", _chapters("prose_run_time"))
def test_prose_about_the_run_time_holds_for_the_record(path):
    nb = _load(path)
    recorded = _recorded(nb)
    low, high = execute.RUN_TIME_TOLERANCE
    wrong = []
    for index, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        for sentence, kind, seconds in _claims(_source(cell)):
            holds = recorded <= seconds if kind == "under" else low <= seconds / recorded <= high
            if not holds:
                wrong.append(f"cell {index}: {sentence!r} ({kind} {seconds:.0f} s)")
    assert not wrong, f"{path.name} records {recorded:.0f} s, but says: " + "; ".join(wrong)


def test_run_time_claims_are_found():
    found = lambda text: [(kind, seconds) for _, kind, seconds in _claims(text)]  # noqa: E731
    assert found("About 60 minutes to read; the notebook runs in under a minute on a laptop.") == [("under", 60)]
    assert found("The notebook runs in about twenty seconds.") == [("about", 20)]
    assert found("the notebook runs top to bottom in about 55 s on a 2-core CPU.") == [("about", 55)]
    assert found("the whole notebook ran in 48 s with two threads (26 s of it in the training cell)") == [("about", 48)]
    assert found("the notebook runs in a few seconds on a laptop CPU.") == [("under", 10)]
    assert found("the notebook runs in well under 2 minutes") == [("under", 120)]
    assert found("The notebook runs\nin under a minute on a laptop CPU") == [("under", 60)]
    assert found("Training takes about 30 s on a CPU.") == []  # not the notebook
    assert found("About 50 minutes to read and do the exercises.") == []


def test_run_time_phrase_round_trips():
    for seconds in (4, 17.5, 55.8, 126.9, 1400):
        phrase = execute.run_time_phrase(seconds, machine="a 2-core CPU")
        match = execute.RUN_TIME_PHRASE.search(f"The notebook {phrase}.")
        assert match and match["machine"] == " on a 2-core CPU", phrase
        wrapped = execute.RUN_TIME_PHRASE.search(f"The notebook {phrase}.".replace(" about ", "\nabout "))
        assert wrapped and wrapped.group(0) == match.group(0).replace(" about ", "\nabout "), "a line break inside"
        low, high = execute.RUN_TIME_TOLERANCE
        assert low <= execute.stated_seconds(match) / seconds <= high, phrase


# ---------------------------------------------------------------------------------------------------
# Spoilers: solutions print only the verdict; predictions are answered collapsed

VERDICT = re.compile(r"✅ [^\n]*: correct\.")


@pytest.mark.parametrize("path", _chapters("solution_output"))
def test_solution_cells_print_only_the_verdict(path):
    nb = _load(path)
    wrong = []
    for index, cell in enumerate(nb["cells"]):
        if "solution" not in cell.get("metadata", {}).get("tags", []):
            continue
        # A kernel under load may split one print into several stream outputs: join the text before splitting lines.
        text = ""
        for output in cell.get("outputs", []):
            if output["output_type"] not in ("stream", "execute_result") or output.get("name") == "stderr":
                wrong.append(f"cell {index}: a {output['output_type']} {output.get('name', '')} output")
                continue
            chunk = _text(output)
            text += chunk if output["output_type"] == "stream" else chunk.rstrip("\n") + "\n"
        lines = text.rstrip("\n").split("\n") if text else []
        # Each verdict is Feedback's two lines: "✅ <title>: correct." and its message.
        position = 0
        while position < len(lines):
            if not VERDICT.fullmatch(lines[position]):
                wrong.append(f"cell {index}: {lines[position]!r} is not a check's verdict")
                break
            position += 2
        if not lines:
            wrong.append(f"cell {index}: no verdict (end the solution cell with its check)")
    assert not wrong, f"{path.name}: a solution cell shows more than its check's verdict: " + "; ".join(wrong)


PREDICT = re.compile(
    r"(?<!\bto )(?<!\bto \*\*)\bpredict(?:\*\*)?(?:\s*:|\s+(?:first|before|both|how|which|what|whether|where|when))"
    r"|\bbefore you (?:run|read|scroll|look)|\bwhat do you expect|\bguess\b[^.?]*\bbefore\b",
    re.IGNORECASE)
ANSWER_OPENING = re.compile(r"\A\s*<details>\s*<summary>", re.IGNORECASE)
DETAILS = re.compile(r"<details>.*?</details>", re.IGNORECASE | re.DOTALL)


def _asks_to_predict(markdown: str) -> bool:
    return bool(PREDICT.search(DETAILS.sub("", markdown)))


def test_predict_prompts_are_recognised():
    assert _asks_to_predict("Before you run the check, predict: how many keys?")
    assert _asks_to_predict("Then **predict**: what would the loss do?")
    assert _asks_to_predict("Predict first: what are the slopes?")
    assert _asks_to_predict("Guess the order of magnitude before you compute it.")
    assert _asks_to_predict("What do you expect the weights to be?")
    assert not _asks_to_predict("A language model predicts the next word.")
    assert not _asks_to_predict("at step i it must predict $y_i$.")
    assert not _asks_to_predict("output 0 reads token 1, the very token it is asked to predict: the loss")
    assert not _asks_to_predict("<details><summary>Answer</summary>\n\nBefore you run it, predict: no.\n</details>")


@pytest.mark.parametrize("path", _chapters("predict_answer"))
def test_predictions_are_answered_collapsed(path):
    nb = _load(path)
    cells = nb["cells"]
    wrong = []
    for index, cell in enumerate(cells):
        if cell["cell_type"] != "markdown" or not _asks_to_predict(_source(cell)):
            continue
        after = next(((j, c) for j, c in enumerate(cells[index + 1:], index + 1) if c["cell_type"] == "markdown"), None)
        if after is None:
            continue
        j, following = after
        text = _source(following).lstrip()
        if text.startswith("#") or ANSWER_OPENING.match(text):
            continue  # a new section, or the answer collapsed
        wrong.append(f"cell {index} asks for a prediction and cell {j} goes on in the open: {text[:80]!r}...")
    assert not wrong, (f"{path.name}: put the answer in <details><summary>Answer</summary> ... </details>: "
                       + "; ".join(wrong))


# ---------------------------------------------------------------------------------------------------
# Errors printed in a form that survives PyTorch versions

# Exceptions PyTorch raises with its own, release-dependent words. ValueError and TypeError are the
# package's own errors (house rule), whose text the course controls.
TORCH_ERRORS = {"RuntimeError", "Exception", "BaseException", "IndexError", "NotImplementedError", "AssertionError",
                "OutOfMemoryError", "AcceleratorError"}


def _prints_error_text(source: str) -> list[str]:
    """The names of caught PyTorch-style errors whose text the code uses (anything but type(e))."""
    source = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found = []
    for handler in ast.walk(tree):
        if not isinstance(handler, ast.ExceptHandler) or handler.name is None:
            continue
        types_caught = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        names = {t.attr if isinstance(t, ast.Attribute) else getattr(t, "id", "") for t in types_caught}
        if not names & TORCH_ERRORS:
            continue
        safe = set()  # uses inside type(e) or isinstance(e, ...)
        for node in ast.walk(handler):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("type", "isinstance"):
                safe |= {id(arg) for arg in node.args[:1]}
        if any(isinstance(node, ast.Name) and node.id == handler.name and id(node) not in safe
               for body in handler.body for node in ast.walk(body)):
            found.append(handler.name)
    return found


def test_error_text_rule():
    assert _prints_error_text("try:\n    a @ b\nexcept RuntimeError as error:\n    print('RuntimeError:', error)\n")
    assert _prints_error_text("try:\n    f()\nexcept (RuntimeError, ValueError) as e:\n    print(f'{e}')\n")
    assert not _prints_error_text("try:\n    a @ b\nexcept RuntimeError as error:\n    print(type(error).__name__)\n")
    assert not _prints_error_text("try:\n    ac.f()\nexcept ValueError as error:\n    print('ValueError:', error)\n")


@pytest.mark.parametrize("path", _chapters("torch_error_text"))
def test_compared_cells_do_not_print_pytorch_error_text(path):
    import nbformat

    nb = nbformat.read(path, as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    wrong = [f"nbval cell {number}" for number, cell in enumerate(code)
             if execute.compared_by_nbval(cell) and _prints_error_text(cell.source)]
    assert not wrong, (f"{path.name}: {', '.join(wrong)} print(s) the text of a PyTorch error, which changes "
                       "between releases: print its type and the shapes involved instead")


# --- sections: numbered without a gap, every "section N" points at one, the anatomy's closing sections present -----

SECTION_HEADING = re.compile(r"^## +(\d+)[.)]? ", re.M)
# "section 4" and "sections 2 and 3" of this chapter; not "section 3 of chapter 10", "section 3.2.3" of a paper
SECTION_REFERENCE = re.compile(r"\b[Ss]ections? (\d+)\b(?![.\d]*\d)(?! of (?:chapter|the paper|their|DeepSeek))")


def _sections(nb: dict) -> tuple[list[int], set[int], str]:
    markdown = "\n".join("".join(cell["source"]) for cell in nb["cells"] if cell["cell_type"] == "markdown")
    numbers = [int(match.group(1)) for match in SECTION_HEADING.finditer(markdown)]
    references = {int(match.group(1)) for match in SECTION_REFERENCE.finditer(markdown)}
    return numbers, references, markdown


def test_section_rule():
    numbers, references, _ = _sections({"cells": [{"cell_type": "markdown", "source": [
        "## 1. One\n", "see section 2 and section 3.2.3 of the paper; section 4 of chapter 10\n", "## 2. Two\n"]}]})
    assert numbers == [1, 2] and references == {2}


@pytest.mark.parametrize("path", _chapters("sections"))
def test_sections_are_numbered_and_every_reference_has_its_section(path):
    """A cut cell once took a chapter's section 9 (its 'Why?' questions and common bugs) with it, leaving the
    numbering 8 -> 10 and a 'section 9 says why' pointing nowhere."""
    numbers, references, markdown = _sections(_load(path))
    assert numbers == list(range(1, len(numbers) + 1)), f"{path.name}: the sections are numbered {numbers}"
    missing = sorted(references - set(numbers))
    assert not missing, f"{path.name}: the prose refers to section(s) {missing}, which the chapter does not have"
    assert re.search(r"^#{2,3} .*Why\?", markdown, re.M), f"{path.name}: no 'Why?' section (questions worth answering)"
    assert "Common bugs" in markdown, f"{path.name}: no 'Common bugs' list"
