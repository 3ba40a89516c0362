"""Student versions of the chapters, the instructor's bundle, and an nbgrader course: one implementation.

Every output is made from the chapters themselves (the single source) by one reading of each chapter,
:func:`plan`, which sorts its cells into the parts of an exercise:

- the exercise's **scaffold** (a code cell with a ``...`` placeholder, usually ``...  # your code here``),
- its **check** (a cell calling a ``check_*`` function of ``attn_course.exercises``),
- its **solution** (the cell tagged ``solution`` after the check, which the student versions drop),
- **prompts** that ask for a written answer (a sentence starting with "Predict", "Explain", "Guess",
  "What do you expect", or any markdown cell tagged ``prompt``), which get an answer cell below them,
  and their answers, collapsed in ``<details><summary>Answer</summary> ... </details>``, which the
  student versions drop too,
- and everything else: prose and demonstrations, kept as they are.

From that plan:

``python tools/make_student.py`` (``make student``) writes
  ``_build/student/NN_name.ipynb`` (no solutions, outputs cleared, an answer cell under each prompt),
  ``_build/solutions/`` (the chapters as committed, and ``SOLUTIONS.md``), both zipped, and
  ``_build/student/LINKS.md`` (a Colab link per student notebook, for a branch made by ``--branch``).
``--nbgrader`` (``make nbgrader``) writes an nbgrader course directory (default ``_build/nbgrader``):
  ``nbgrader_config.py`` and ``source/chNN/NN_name.ipynb`` per chapter. Each answer cell holds the
  scaffold with the reference solution under each ``...`` between ``### BEGIN SOLUTION`` and
  ``### END SOLUTION`` (``nbgrader generate_assignment`` removes it: the released answer cell is the
  scaffold of the student version); each check becomes a locked test cell worth points that loads the
  check afresh from the installed package (redefining ``check_*`` in the notebook changes nothing) and
  fails, with the check's message, unless the check says "correct", with hints off (graded mode);
  each prompt gets a manually graded answer cell; every other cell is locked (read-only).
``--check`` (``make student-check``) also runs every student notebook and fails unless each runs
  without an error and every check says "not attempted".
``--grade NOTEBOOK ...`` grades submitted notebooks without nbgrader: it runs each (errors do not stop
  it), then runs every check of its chapter afresh on the student's answers, in graded mode, and prints
  one tab-separated row per exercise; a notebook whose check cells were deleted is still graded.
``--summary`` prints each chapter's time, prerequisites and exercises for the instructor page.
``--branch NAME`` commits ``_build/student`` to the branch NAME (default ``students``) without touching
  the working tree; push it and the Colab links in LINKS.md open the student notebooks.

Chapter markers (cell metadata), for authors:
- tag ``solution`` on the cell after the check that holds the reference solution (and its check call);
- tag ``prompt`` on a markdown cell that asks for a written answer (found by itself when a sentence
  starts with "Predict", "Explain", "Guess", "What do you expect", "Then predict", "Before you run
  ..., predict" or "use it to explain"; not in the first cell, nor under "Going further", "Summary"
  or "References"); tag ``not-a-prompt`` where that finding is wrong. The answer goes in the next
  markdown cell as ``<details><summary>Answer</summary>`` ... ``</details>`` (the student versions
  drop it; the nbgrader course makes it the model answer of the graded answer cell);
- ``"attn_course": {"points": 2}`` on a check cell or a prompt cell: its points in the nbgrader course
  (default: 1 per exercise, shared among its checks; 1 per prompt; ``--points``, ``--prompt-points``).

``make student`` and ``make nbgrader`` need Python 3.9+ and nothing else (no torch, no Jupyter);
``--check`` and ``--grade`` run notebooks, so they need the course's environment (``.venv``).
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOLUTION_TAG = "solution"
PROMPT_TAG = "prompt"
NOT_A_PROMPT_TAG = "not-a-prompt"
NOT_ATTEMPTED = "not attempted"
CHECK_CALL = re.compile(r"^\s*(?:print\()?\s*(check_\w+)\s*\(", re.MULTILINE)
EXERCISE_HEADING = re.compile(r"^#+\s*(Exercise(?!s)\b.*)$", re.MULTILINE)
ANY_HEADING = re.compile(r"^#{1,6}\s", re.MULTILINE)
# A placeholder line of a scaffold: `...`, `...  # your code here`, or `name = ...  # your answer`.
HOLE = re.compile(r"^(?P<indent>[ \t]*)(?:[A-Za-z_]\w*\s*=\s*)?\.\.\.\s*(?:#.*)?$")
# A sentence of an exercise's statement that asks for a written answer.
PROMPT = re.compile(
    r"(?:^|(?<=[.!?:])\s+|\n)(?:[-*]\s+)?(?:then\s+)?(?:before you [^.,;:!?]*,\s*)?\**"
    r"(?:predict|explain|guess|what do you expect|use (?:it|them|this) to (?:explain|predict))\b",
    re.IGNORECASE,
)
# A collapsed answer to a prompt, as the chapters write it.
ANSWER_BLOCK = re.compile(r"<details>\s*<summary>\s*Answer\b.*?</details>\s*", re.IGNORECASE | re.DOTALL)
# Sections whose questions are optional: no answer cells there.
UNGRADED_SECTION = re.compile(r"^#+\s*(?:\d+\.\s*)?(?:Going further|Summary|References)\b", re.IGNORECASE | re.MULTILINE)
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
ANSWER_PLACEHOLDER = "*Your answer:*"
GRADED_ENV = "ATTN_COURSE_GRADED"
RESULT_MARKER = "ATTN_COURSE_GRADE_RESULT "
# How graded code loads a check afresh (the package's module is reloaded: names the student redefined
# or patched in the notebook's kernel do not count).
FRESH_CHECK = '_feedback = importlib.reload(importlib.import_module("attn_course.exercises")).fresh_check("{module}", "{name}")'

# The chapters' prose promises a collapsed solution under each exercise; the student versions have
# none. Each rule rewrites one phrasing; tests/test_student.py fails while any markdown cell of a
# student version still says "solution", so a new phrasing needs a rule here (or other words).
STUDENT_PROSE = [
    (r"(a\s+cell\s+for\s+your\s+answer),?\s+(?:then\s+)?(a\s+check\s+that\s+[^.,]*?wrong(?:,\s+if\s+anything)?),?\s+"
     r"(?:and\s+)?(?:then\s+)?a\s+collapsed\s+solution(?:\s+after\s+it)?\s*\(try\s+first!\)", r"\1 and \2"),
    (r",?\s+(?:and\s+)?(?:then\s+)?a\s+collapsed\s+solution(?:\s+after\s+it)?\s*\(try\s+first!\)", ""),
    (r"a\s+collapsed\s+solution,\s+", ""),
    (r"In\s+the\s+student\s+version\s+the\s+solutions\s+are\s+removed\s+and\s+the\s+checks\s+say", "The checks say"),
    (r"\b([Tt]he)\s+cell\s+after\s+the\s+solution", r"\1 cell after the check"),
]

STUDENT_README = """\
attn-course: student notebooks
==============================

One notebook per chapter. Open one in Jupyter, JupyterLab, VS Code or Google Colab
(File > Upload notebook, or a link from your instructor) and run it from the top: the first cell
installs the course's package `attn_course` if it is missing.

Each exercise has a statement, a scaffold to fill in (replace `...` with your code) and a check.
Run the check after each attempt: it says "correct", what is wrong, or "not attempted yet" while
the scaffold is untouched. Questions that ask you to predict or explain have a cell
"Your answer:" below them: write your answer there.

Hand in the notebook file itself (File > Download .ipynb), with your answers and their checks run.
"""

NBGRADER_CONFIG = '''\
"""nbgrader configuration for attn-course, written by `make nbgrader` (tools/make_student.py).

Assignments: {assignments}. Points: {points_note}.
Install attn_course {version} in the image that students and the autograder use (the chapters'
first cells install it only where it is missing, which needs the internet).
"""
import os

c = get_config()  # noqa: F821 (nbgrader provides it)
c.CourseDirectory.course_id = "attn-course"

# Each answer cell keeps the chapter's placeholder line (`...  # your code here`) above its solution
# region, so the stub that replaces the region is empty: the released cell is the chapter's scaffold.
c.ClearSolutions.code_stub = {{"python": ""}}
c.ClearSolutions.text_stub = "{text_stub}"

# Graded mode: checks say right or wrong and name the mistake, without hints (the test cells also
# switch it on in the student's kernel). Kernels that autograde starts inherit this environment.
os.environ["{graded_env}"] = "1"
# Chapter 07 trains a model in the notebook (about a minute on a laptop CPU).
c.Execute.timeout = 600
'''


# --------------------------------------------------------------------------------------------------
# Reading the chapters


def toc_chapters() -> list[pathlib.Path]:
    """The chapter notebooks listed in _toc.yml, in order (read without a YAML library)."""
    files = re.findall(r"^\s*-?\s*file:\s*['\"]?([^'\"\s#]+)", (ROOT / "_toc.yml").read_text(), re.MULTILINE)
    return [ROOT / f"{f}.ipynb" for f in files if (ROOT / f"{f}.ipynb").exists()]


def select_chapters(spec: str | None) -> list[pathlib.Path]:
    """The chapters of _toc.yml, or those whose number or name is in ``spec`` ("03,05" or "03 05")."""
    chapters = toc_chapters()
    if not spec:
        return chapters
    wanted = [w for w in re.split(r"[,\s]+", spec) if w]
    chosen = []
    for want in wanted:
        key = want.removeprefix("ch").removesuffix(".ipynb").split("/")[-1]
        matches = [p for p in chapters if p.stem == key or p.stem.split("_")[0] == key.zfill(2)]
        if not matches:
            raise SystemExit(f"--chapters: no chapter {want!r} in _toc.yml (have {', '.join(p.stem for p in chapters)})")
        chosen += [m for m in matches if m not in chosen]
    return chosen


def read_notebook(path: pathlib.Path) -> dict:
    return json.loads(pathlib.Path(path).read_text(encoding="utf-8"))


def write_notebook(nb: dict, path: pathlib.Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def source(cell: dict) -> str:
    text = cell.get("source", "")
    return "".join(text) if isinstance(text, list) else text


def tags(cell: dict) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def _show(path: pathlib.Path) -> str:
    try:
        return str(pathlib.Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def chapter_id(path: pathlib.Path) -> str:
    """``ch02`` for ``chapters/02_simple_self_attention.ipynb``: the nbgrader assignment's name."""
    return "ch" + pathlib.Path(path).stem.split("_")[0]


def _is_check(cell: dict) -> bool:
    text = source(cell)
    return (cell["cell_type"] == "code" and SOLUTION_TAG not in tags(cell) and bool(CHECK_CALL.search(text))
            and not text.lstrip().startswith(("from ", "import ")))


def _is_scaffold(cell: dict) -> bool:
    return cell["cell_type"] == "code" and any(HOLE.match(line) for line in source(cell).splitlines())


def check_modules(nb: dict) -> dict[str, str]:
    """Each imported ``check_*`` name and the module it comes from (``check_x`` -> ``ch02``)."""
    found = {}
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        for match in re.finditer(r"from\s+attn_course\.exercises\.(\w+)\s+import\s+\(?([\w\s,]+)\)?", source(cell)):
            for name in re.split(r"[\s,]+", match.group(2)):
                if name.startswith("check_"):
                    found[name] = match.group(1)
    return found


@dataclass
class Check:
    cell: int          # index of the chapter's check cell
    name: str          # check_stable_softmax
    module: str        # ch02
    args: str          # the arguments as written in the chapter: "stable_softmax"
    points: float = 1.0


@dataclass
class Prompt:
    cell: int                  # index of the markdown cell that asks
    points: float = 1.0
    answer: str = ""           # the chapter's collapsed answer (Markdown), if it has one


@dataclass
class Exercise:
    number: int                # 1, 2, ... in the chapter
    heading: str               # "Exercise 1: a softmax that does not overflow (warm-up)"
    heading_cell: int
    scaffolds: list[int] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    solution: int | None = None

    @property
    def statement(self) -> range:
        """The markdown cells of the statement: from the heading to the first code cell."""
        code = self.scaffolds + [c.cell for c in self.checks] + ([self.solution] if self.solution is not None else [])
        return range(self.heading_cell, min(code) if code else self.heading_cell + 1)


def _calls(cell_source: str) -> list[tuple[str, str]]:
    """The ``check_*(...)`` calls of a cell: (name, argument text)."""
    try:
        tree = ast.parse(cell_source)
    except SyntaxError:
        return [(m.group(1), "") for m in CHECK_CALL.finditer(cell_source)]
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id.startswith("check_"):
            parts = [ast.get_source_segment(cell_source, a) for a in node.args]
            parts += [f"{k.arg}={ast.get_source_segment(cell_source, k.value)}" if k.arg else
                      f"**{ast.get_source_segment(cell_source, k.value)}" for k in node.keywords]
            calls.append((node.func.id, ", ".join(parts)))
    return sorted(calls, key=lambda call: cell_source.find(call[0] + "("))


def _points(cell: dict, default: float) -> float:
    value = cell.get("metadata", {}).get("attn_course", {}).get("points", default)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"attn_course.points must be a positive number, got {value!r}")
    return float(value)


def asks(cell: dict) -> bool:
    """A markdown cell that asks for a written answer: tagged ``prompt``, or a sentence that starts
    with "Predict", "Explain", ... (outside headings and collapsed answers), unless ``not-a-prompt``."""
    if cell["cell_type"] != "markdown" or NOT_A_PROMPT_TAG in tags(cell) or SOLUTION_TAG in tags(cell):
        return False
    if PROMPT_TAG in tags(cell):
        return True
    text = ANSWER_BLOCK.sub("", source(cell))
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    return bool(PROMPT.search(text))


def prompts(nb: dict, prompt_points: float = 1.0) -> list[Prompt]:
    """The chapter's prompts for a written answer, each with the collapsed answer that follows it."""
    cells, found, graded = nb["cells"], [], True
    for index, cell in enumerate(cells):
        if cell["cell_type"] != "markdown":
            continue
        if ANY_HEADING.search(source(cell)):
            headings = re.findall(r"^#+\s.*$", source(cell), re.MULTILINE)
            graded = not UNGRADED_SECTION.match(headings[-1]) if headings else graded
        if index == 0 or not graded or not asks(cell):
            continue
        answer = ""
        following = next((c for c in cells[index + 1:] if c["cell_type"] == "markdown"), None)
        for text in (ANSWER_BLOCK.search(source(cell)), following and ANSWER_BLOCK.search(source(following))):
            if text:
                answer = re.sub(r"^<details>\s*<summary>.*?</summary>|</details>\s*$", "", text.group(0).strip(),
                                flags=re.DOTALL | re.IGNORECASE).strip()
                break
        found.append(Prompt(index, _points(cell, prompt_points), answer))
    return found


def plan(nb: dict, points: float = 1.0) -> list[Exercise]:
    """Read a chapter into its exercises (scaffolds, checks, solution), by cell index."""
    modules = check_modules(nb)
    cells = nb["cells"]
    found: list[Exercise] = []
    current: Exercise | None = None
    for index, cell in enumerate(cells):
        text = source(cell)
        if cell["cell_type"] == "markdown":
            heading = EXERCISE_HEADING.search(text)
            if heading:
                current = Exercise(len(found) + 1, heading.group(1).strip(), index)
                found.append(current)
            elif current is not None and ANY_HEADING.search(text) and current.solution is not None:
                current = None  # the next section (Summary, Going further, ...) ends the exercises
        if current is None:
            continue
        if SOLUTION_TAG in tags(cell) and cell["cell_type"] == "code":
            if current.solution is None:
                current.solution = index
        elif current.solution is None and _is_check(cell):
            for name, args in _calls(text):
                if name not in modules:
                    raise ValueError(f"cell {index}: {name} is called but never imported from attn_course.exercises.<module>")
                current.checks.append(Check(index, name, modules[name], args))
        elif current.solution is None and not current.checks and _is_scaffold(cell):
            current.scaffolds.append(index)
    for exercise in found:
        share = points / max(len(exercise.checks), 1)
        for check in exercise.checks:
            check.points = _points(cells[check.cell], share)
    return found


def exercises(nb: dict) -> list[dict]:
    """Each exercise: its heading, its (first) check's name and its solution's source."""
    result = []
    for exercise in plan(nb):
        if not exercise.checks:
            continue
        result.append({
            "heading": exercise.heading,
            "check": exercise.checks[0].name,
            "checks": [c.name for c in exercise.checks],
            "solution": source(nb["cells"][exercise.solution]) if exercise.solution is not None else None,
        })
    return result


# --------------------------------------------------------------------------------------------------
# Solutions inside the scaffolds (for nbgrader's BEGIN/END SOLUTION regions)


class MergeError(ValueError):
    """A solution cell that does not fit its scaffold: the message says which line."""


def split_solution(solution: str) -> tuple[list[str], list[str]]:
    """A solution cell's code (without the Colab title line) up to its first check call, and what
    follows that call (a worked answer to the exercise's question, if any; check calls removed)."""
    lines = solution.splitlines()
    if lines and lines[0].startswith("#@title"):
        lines = lines[1:]
    first = next((i for i, line in enumerate(lines) if CHECK_CALL.match(line) and not line[:1].isspace()), None)
    if first is None:
        return lines, []
    code, after, in_call = lines[:first], [], False
    for line in lines[first:]:
        if CHECK_CALL.match(line) and not line[:1].isspace():
            in_call = True
        elif in_call and (line[:1].isspace() or line.lstrip().startswith(")")):
            continue
        else:
            in_call = False
            after.append(line)
        if in_call and line.rstrip().endswith(")") and line.count("(") <= line.count(")"):
            in_call = False
    while code and not code[-1].strip():
        code.pop()
    while after and not after[0].strip():
        after.pop(0)
    for number, line in enumerate(code):
        if CHECK_CALL.search(line):
            raise MergeError(f"the solution calls a check inside its code (line {number + 1}: {line.strip()!r})")
    return code, [line for line in after if not CHECK_CALL.search(line)]


def _same(a: str, b: str) -> bool:
    strip = lambda s: re.sub(r"\s+#.*$", "", s).rstrip()  # noqa: E731
    return a.rstrip() == b.rstrip() or strip(a) == strip(b)


def merge_solution(scaffolds: list[str], solution: str) -> list[str]:
    """Put the solution's code under each ``...`` of the scaffold(s), between BEGIN/END SOLUTION.

    The scaffold's other lines must appear in the solution in the same order (they anchor the
    regions); every solution line between two anchors belongs to the placeholder between them. The
    placeholder line itself stays above its region, so that removing the region (nbgrader's
    ``generate_assignment``, with an empty stub) gives back the scaffold.
    """
    sol = split_solution(solution)[0]
    items = [(k, line) for k, text in enumerate(scaffolds) for line in text.rstrip().splitlines()]
    out: list[list[str]] = [[] for _ in scaffolds]
    cursor, pending = 0, None  # pending: (cell, position in out[cell], indent) of a hole without its region yet

    def fill(region: list[str], where: str) -> None:
        nonlocal pending
        while region and not region[0].strip():
            region = region[1:]
        trailing = []
        while region and not region[-1].strip():
            trailing.append(region.pop())
        if pending is None:
            if region:
                raise MergeError(f"solution lines {region[0].strip()!r}... are not under a `...` of the scaffold ({where})")
            return
        cell, position, indent = pending
        if not region:
            raise MergeError(f"the solution has nothing for the placeholder {out[cell][position - 1].strip()!r}")
        out[cell][position:position] = [indent + BEGIN] + region + [indent + END]
        pending = None

    for cell, line in items:
        if not line.strip():
            out[cell].append(line)
            continue
        hole = HOLE.match(line)
        if hole:
            if pending is not None:  # two placeholders in a row: the first one's region ends where the
                depth = len(pending[2])  # solution comes back out of its indentation
                end = next((j for j in range(cursor, len(sol)) if sol[j].strip()
                            and len(sol[j]) - len(sol[j].lstrip()) < depth), None)
                if not depth or end is None:
                    raise MergeError(f"two placeholders with no scaffold line between them: {line.strip()!r}")
                fill(sol[cursor:end], f"before {line.strip()!r}")
                cursor = end
            out[cell].append(line)
            pending = (cell, len(out[cell]), hole.group("indent"))
            continue
        match = next((j for j in range(cursor, len(sol)) if _same(sol[j], line)), None)
        if match is None:
            raise MergeError(f"the scaffold's line {line.strip()!r} is not in the solution (after line {cursor})")
        fill(sol[cursor:match], f"before {line.strip()!r}")
        out[cell].append(line)
        cursor = match + 1
    fill(sol[cursor:], "at the end")
    return ["\n".join(lines).rstrip("\n") for lines in out]


def clear_regions(text: str) -> str:
    """What ``generate_assignment`` makes of an answer cell (the stub is empty): used by the tests."""
    lines, skipping = [], False
    for line in text.split("\n"):
        if BEGIN in line:
            skipping = True
            lines.append(re.match(r"\s*", line).group(0))
        elif END in line:
            skipping = False
        elif not skipping:
            lines.append(line)
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Writing the versions


def _clean(cell: dict) -> dict:
    """A copy without outputs, execution counts, execution times, and the solutions' hiding metadata."""
    cell = copy.deepcopy(cell)
    metadata = cell.setdefault("metadata", {})
    for key in ("execution", "collapsed", "scrolled"):
        metadata.pop(key, None)
    if cell["cell_type"] == "code":
        cell["outputs"], cell["execution_count"] = [], None
    if isinstance(cell.get("source"), list):
        cell["source"] = "".join(cell["source"])
    return cell


def _student_prose(text: str) -> str:
    for pattern, replacement in STUDENT_PROSE:
        text = re.sub(pattern, replacement, text)
    return text


def _new_cell(kind: str, text: str, cell_id: str, metadata: dict | None = None) -> dict:
    cell = {"cell_type": kind, "id": cell_id, "metadata": metadata or {}, "source": text}
    if kind == "code":
        cell.update(outputs=[], execution_count=None)
    return cell


def test_cell_source(check: Check, exercise: Exercise, graded: bool = True) -> str:
    """The code of an nbgrader test cell: the real check, loaded afresh, must say "correct"."""
    points = f"{check.points:g} point" + ("" if check.points == 1 else "s")
    mode = (f'os.environ["{GRADED_ENV}"] = "1"  # graded mode: the check names the mistake, without hints\n'
            if graded else "")
    return (
        f"# Graded check of {exercise.heading.split(':')[0]} ({points}). Do not edit or delete this cell: it loads\n"
        f"# {check.name} afresh from the installed attn_course (redefining check functions in\n"
        f"# this notebook changes nothing) and fails unless the check says \"correct\".\n"
        f"import importlib, os\n"
        f"{mode}"
        f"{FRESH_CHECK.format(module=check.module, name=check.name)}({check.args})\n"
        f"_feedback.assert_correct()\n"
        f"print(_feedback)"
    )


def _nbgrader(grade_id: str, *, solution=False, grade=False, locked=False, points: float | None = None) -> dict:
    meta = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3, "solution": solution}
    if grade:
        meta["points"] = points
    return {"nbgrader": meta}


def build_notebook(nb: dict, path: pathlib.Path, *, nbgrader: bool, points: float = 1.0,
                   prompt_points: float = 1.0, graded: bool = True) -> dict:
    """The student version (``nbgrader=False``) or the nbgrader source version of one chapter.

    Both drop the solution cells and the collapsed answers, clear outputs, and put an answer cell
    under each prompt. The nbgrader version also puts each solution inside its scaffold (between
    BEGIN/END SOLUTION), turns each check into a locked test cell worth points, makes the answer
    cells of the prompts graded by hand (the chapter's collapsed answer as the model answer), and
    locks every other cell.
    """
    exercises_ = plan(nb, points)
    prefix = chapter_id(path)
    role: dict[int, tuple] = {}
    for exercise in exercises_:
        for k, index in enumerate(exercise.scaffolds):
            role[index] = ("scaffold", exercise, k)
        by_cell: dict[int, list[Check]] = {}
        for check in exercise.checks:
            by_cell.setdefault(check.cell, []).append(check)
        for index, checks in by_cell.items():
            role[index] = ("check", exercise, checks)
    asking = {prompt.cell: prompt for prompt in prompts(nb, prompt_points)}

    def owner(index: int) -> Exercise | None:
        """The exercise whose statement, scaffold or check holds cell ``index``."""
        return next((e for e in reversed(exercises_) if e.heading_cell <= index
                     and (e.solution is None or index < e.solution)), None)

    merged: dict[int, str] = {}
    if nbgrader:
        for exercise in exercises_:
            if not exercise.scaffolds:
                continue
            if exercise.solution is None:
                raise MergeError(f"{path.name}: {exercise.heading} has a scaffold but no cell tagged 'solution'")
            try:
                texts = merge_solution([source(nb["cells"][i]) for i in exercise.scaffolds],
                                       source(nb["cells"][exercise.solution]))
            except MergeError as error:
                raise MergeError(f"{path.name}, {exercise.heading}: {error}") from None
            merged.update(zip(exercise.scaffolds, texts))

    cells = []
    for index, original in enumerate(nb["cells"]):
        if SOLUTION_TAG in tags(original):
            continue
        kind, exercise, extra = role.get(index, ("other", None, None))
        cell = _clean(original)
        if cell["cell_type"] == "markdown":
            cell["source"] = _student_prose(ANSWER_BLOCK.sub("", cell["source"])).rstrip()
            if not cell["source"].strip():
                continue  # the cell held nothing but a collapsed answer
        if kind == "scaffold" and nbgrader:
            cell["source"] = merged[index]
            cell["metadata"].update(_nbgrader(f"{prefix}-ex{exercise.number}-answer{extra + 1}", solution=True))
            cells.append(cell)
        elif kind == "check" and nbgrader:
            for check in extra:
                test_id = f"{prefix}-ex{exercise.number}-{check.name.removeprefix('check_').replace('_', '-')}"[:64]
                cells.append(_new_cell("code", test_cell_source(check, exercise, graded), test_id,
                                       _nbgrader(test_id, grade=True, locked=True, points=check.points)))
        else:
            if nbgrader:
                cell["metadata"].update(_nbgrader(f"{prefix}-cell{index:03d}", locked=True))
            cells.append(cell)
        if index in asking:
            prompt, exercise = asking[index], owner(index)
            answer_id = f"{prefix}-written{index:03d}"
            if not nbgrader:
                cells.append(_new_cell("markdown", ANSWER_PLACEHOLDER, answer_id))
                continue
            model = prompt.answer
            worked = split_solution(source(nb["cells"][exercise.solution]))[1] if exercise and exercise.solution else []
            if worked:
                model += "\n\nThe solution's worked answer:\n\n```python\n" + "\n".join(worked) + "\n```"
            model = model.strip() or "(The chapter gives no model answer.)"
            cells.append(_new_cell("markdown", f"{BEGIN}\n{model}\n{END}", answer_id,
                                   _nbgrader(answer_id, solution=True, grade=True, points=prompt.points)))
    result = {key: copy.deepcopy(value) for key, value in nb.items() if key != "cells"}
    result["metadata"].pop("widgets", None)
    result["metadata"]["attn_course"] = {"chapter": pathlib.Path(path).stem}
    result["cells"] = cells
    return result


def student_version(nb: dict, path: pathlib.Path | str = "chapter.ipynb") -> dict:
    """The notebook without solution cells, outputs, execution counts or widget state."""
    return build_notebook(nb, pathlib.Path(path), nbgrader=False)


def nbgrader_source(nb: dict, path: pathlib.Path | str, **options) -> dict:
    """The chapter as an nbgrader source notebook (solutions in regions, test cells, locked prose)."""
    return build_notebook(nb, pathlib.Path(path), nbgrader=True, **options)


# --------------------------------------------------------------------------------------------------
# make student


def _paragraph(nb: dict, label: str) -> str:
    """The text after a bold label such as **Time.** in the chapter's first cell, on one line."""
    first = source(nb["cells"][0])
    match = re.search(rf"\*\*{label}\.?\*\*\.?\s*(.*?)(?:\n\s*\n|\Z)", first, re.DOTALL)
    return " ".join(match.group(1).split()) if match else "(not stated)"


def _title(nb: dict) -> str:
    return source(nb["cells"][0]).splitlines()[0].lstrip("# ").strip()


def summary() -> str:
    """Markdown for instructor.md: one block per chapter notebook (listed in _toc.yml or not yet)."""
    lines = []
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        nb = read_notebook(path)
        found = exercises(nb)
        lines += [f"### {_title(nb)}", "", f"- Notebook: `{path.relative_to(ROOT).as_posix()}`",
                  f"- Time: {_paragraph(nb, 'Time')}", f"- Prerequisites: {_paragraph(nb, 'Prerequisites')}",
                  f"- Exercises ({len(found)}):"]
        lines += [f"  - {e['heading']}, check{'s' if len(e['checks']) > 1 else ''} "
                  + ", ".join(f"`{name}`" for name in e["checks"]) for e in found]
        lines.append("")
    return "\n".join(lines)


def solutions_markdown(chapters: list[tuple[pathlib.Path, dict]]) -> str:
    lines = ["# attn-course: solutions (for instructors; do not hand out)", ""]
    for path, nb in chapters:
        lines += [f"## {_title(nb)} (`{path.name}`)", ""]
        for exercise in exercises(nb):
            lines += [f"### {exercise['heading']}", "", "Check: " + ", ".join(f"`{n}`" for n in exercise["checks"]), ""]
            if exercise["solution"]:
                lines += ["```python", exercise["solution"].rstrip(), "```", ""]
    return "\n".join(lines) + "\n"


def repository() -> str:
    """``owner/name`` of ``repository.url`` in _config.yml."""
    text = (ROOT / "_config.yml").read_text()
    block = re.search(r"^repository:\s*\n((?:[ \t]+.*\n?)*)", text, re.MULTILINE)
    url = re.search(r"^\s*url:\s*['\"]?(\S+?)['\"]?\s*$", block.group(1), re.MULTILINE).group(1) if block else ""
    match = re.search(r"github\.com/([^/]+/[^/]+?)(?:\.git)?/?$", url)
    if not match:
        raise SystemExit(f"_config.yml: repository.url {url!r} is not a GitHub repository")
    return match.group(1)


def colab_url(name: str, branch: str) -> str:
    return f"https://colab.research.google.com/github/{repository()}/blob/{branch}/{name}"


def links_markdown(paths: list[pathlib.Path], branch: str) -> str:
    lines = ["# attn-course: student notebooks in Colab", "",
             f"These links open the student notebooks from the branch `{branch}` of "
             f"https://github.com/{repository()}. They work once that branch is pushed:",
             f"`python tools/make_student.py --branch {branch}` and `git push origin {branch}`.", ""]
    lines += [f"- [{p.stem}]({colab_url(p.name, branch)})" for p in paths]
    return "\n".join(lines) + "\n"


def write_zip(folder: pathlib.Path, archive: pathlib.Path, prefix: str) -> None:
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as bundle:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                bundle.write(path, f"{prefix}/{path.relative_to(folder).as_posix()}")


def build(out: pathlib.Path, chapters: list[pathlib.Path] | None = None, branch: str = "students") -> list[pathlib.Path]:
    """``make student``: student versions, the solutions bundle, both zipped, and the Colab links."""
    out = pathlib.Path(out)
    student_dir, solutions_dir = out / "student", out / "solutions"
    for folder in (student_dir, solutions_dir):
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
    written, loaded = [], []
    for path in chapters or toc_chapters():
        nb = read_notebook(path)
        loaded.append((path, nb))
        student = student_version(nb, path)
        assert not any(SOLUTION_TAG in tags(c) for c in student["cells"]), f"{path.name}: a solution cell is left"
        target = student_dir / path.name
        write_notebook(student, target)
        shutil.copy2(path, solutions_dir / path.name)
        written.append(target)
        print(f"{_show(target)}: {sum(SOLUTION_TAG in tags(c) for c in nb['cells'])} solution cell(s) removed, "
              f"{sum(len(e.checks) for e in plan(nb))} check(s) kept, {len(prompts(nb))} answer cell(s) for written answers")
    (student_dir / "README.txt").write_text(STUDENT_README)
    (student_dir / "LINKS.md").write_text(links_markdown(written, branch))
    (solutions_dir / "SOLUTIONS.md").write_text(solutions_markdown(loaded))
    write_zip(student_dir, out / "attn-course-student.zip", "attn-course-student")
    write_zip(solutions_dir, out / "attn-course-solutions.zip", "attn-course-solutions")
    print(f"student versions: {_show(student_dir)}/ and {_show(out / 'attn-course-student.zip')}")
    print(f"solutions (keep them to yourself): {_show(solutions_dir)}/ and {_show(out / 'attn-course-solutions.zip')}")
    return written


def commit_to_branch(folder: pathlib.Path, branch: str, message: str, repo: pathlib.Path = ROOT) -> str:
    """Commit the files of ``folder`` (at the root of the tree) to ``branch`` of ``repo``; its working
    tree, index and HEAD stay as they are. Returns the new commit's id."""
    git_dir = subprocess.run(["git", "-C", str(repo), "rev-parse", "--absolute-git-dir"], check=True,
                             capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as scratch:
        env = dict(os.environ, GIT_INDEX_FILE=str(pathlib.Path(scratch) / "index"), GIT_DIR=git_dir,
                   GIT_WORK_TREE=str(pathlib.Path(folder).resolve()))
        run = lambda *args: subprocess.run(["git", *args], check=True, capture_output=True, text=True,  # noqa: E731
                                           env=env, cwd=folder).stdout.strip()
        run("add", "--all", "--force", ".")
        tree = run("write-tree")
        parent = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}"], env=env,
                                capture_output=True, text=True, cwd=folder).stdout.strip()
        commit = run("commit-tree", tree, *(["-p", parent] if parent else []), "-m", message)
        run("update-ref", f"refs/heads/{branch}", commit)
    return commit


# --------------------------------------------------------------------------------------------------
# make nbgrader


def build_nbgrader(out: pathlib.Path, chapters: list[pathlib.Path] | None = None, *, assignment: str | None = None,
                   points: float = 1.0, prompt_points: float = 1.0, graded: bool = True) -> list[pathlib.Path]:
    """``make nbgrader``: ``nbgrader_config.py`` and ``source/<assignment>/<chapter>.ipynb``."""
    out = pathlib.Path(out)
    source_dir = out / "source"
    if source_dir.exists():
        shutil.rmtree(source_dir)
    written, assignments = [], []
    for path in chapters or toc_chapters():
        name = assignment or chapter_id(path)
        nb = nbgrader_source(read_notebook(path), path, points=points, prompt_points=prompt_points, graded=graded)
        target = source_dir / name / path.name
        write_notebook(nb, target)
        written.append(target)
        if name not in assignments:
            assignments.append(name)
        grades = [c["metadata"]["nbgrader"] for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade")]
        auto = sum(g["points"] for g in grades if "written" not in g["grade_id"])
        manual = sum(g["points"] for g in grades if "written" in g["grade_id"])
        print(f"{_show(target)}: {sum(1 for g in grades if 'written' not in g['grade_id'])} autograded test cell(s) "
              f"({auto:g} points), {sum(1 for g in grades if 'written' in g['grade_id'])} written answer(s) "
              f"graded by hand ({manual:g} points)")
    version = re.search(r'^__version__\s*=\s*["\']([^"\']+)', (ROOT / "attn_course" / "__init__.py").read_text(), re.MULTILINE)
    (out / "nbgrader_config.py").write_text(NBGRADER_CONFIG.format(
        assignments=", ".join(assignments), version=version.group(1) if version else "(unknown)",
        text_stub=ANSWER_PLACEHOLDER, graded_env=GRADED_ENV,
        points_note=f"{points:g} per exercise (shared among its checks), {prompt_points:g} per written answer, "
                    "unless a chapter's cell says otherwise (metadata attn_course.points)"))
    print(f"nbgrader course: {_show(out)}/ (nbgrader_config.py and source/); next, in that folder: "
          f"nbgrader generate_assignment {assignments[0] if assignments else 'ch02'}")
    return written


# --------------------------------------------------------------------------------------------------
# Running notebooks: make student-check and --grade


def _grading_cell(checks: list[tuple[str, Check]]) -> str:
    table = [(label, c.module, c.name, c.args) for label, c in checks]
    return (
        "import importlib as _il, json as _json, os as _os\n"
        f'_os.environ["{GRADED_ENV}"] = "1"\n'
        "_results = []\n"
        f"for _label, _module, _name, _args in {table!r}:\n"
        "    try:\n"
        "        _fresh = _il.reload(_il.import_module('attn_course.exercises')).fresh_check(_module, _name)\n"
        "        _values = eval('(' + _args + ',)') if _args.strip() else ()\n"
        "    except NameError as _error:\n"
        "        _results.append([_label, _name, 'missing', f'not defined in the notebook: {_error}'])\n"
        "        continue\n"
        "    except Exception as _error:\n"
        "        _results.append([_label, _name, 'error', f'{type(_error).__name__}: {_error}'])\n"
        "        continue\n"
        "    _feedback = _fresh(*_values)\n"
        "    _results.append([_label, _name, _feedback.status, str(_feedback)])\n"
        f"print({RESULT_MARKER!r} + _json.dumps(_results))\n"
    )


def run_and_grade(nb: dict, chapter: dict, *, cwd: pathlib.Path, timeout: int = 900) -> tuple[list, list[str]]:
    """Run a notebook (errors do not stop it), then every check of ``chapter`` afresh on its answers.

    Returns ``(results, errors)``: one ``[exercise, check, status, message]`` per check, and the
    errors the notebook's own cells raised ("Cell 12: ValueError: ...").
    """
    import nbformat
    from nbclient import NotebookClient

    checks = [(e.heading.split(":")[0], c) for e in plan(chapter) for c in e.checks]
    nb = copy.deepcopy(nb)
    nb["cells"] = [_clean(c) for c in nb["cells"]] + [_new_cell("code", _grading_cell(checks), "attn-course-grading")]
    notebook = nbformat.from_dict(nb)
    client = NotebookClient(notebook, timeout=timeout, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(cwd)}})
    client.execute()
    errors = [f"cell {i}: {o.get('ename')}: {o.get('evalue')}" for i, cell in enumerate(notebook.cells[:-1])
              if cell.cell_type == "code" for o in cell.outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in notebook.cells[-1].outputs if o.get("output_type") == "stream")
    marker = next((line for line in text.splitlines() if line.startswith(RESULT_MARKER)), None)
    if marker is None:
        failure = [o for o in notebook.cells[-1].outputs if o.get("output_type") == "error"]
        reason = f"{failure[0]['ename']}: {failure[0]['evalue']}" if failure else "the grading cell printed nothing"
        return [[label, c.name, "error", f"grading failed: {reason}"] for label, c in checks], errors
    return json.loads(marker[len(RESULT_MARKER):]), errors


def chapter_of(nb: dict, path: pathlib.Path) -> pathlib.Path | None:
    """The chapter a submission was made from: its metadata, else its file name, else its title."""
    chapters = {p.stem: p for p in sorted((ROOT / "chapters").glob("*.ipynb"))}
    stem = nb.get("metadata", {}).get("attn_course", {}).get("chapter")
    if stem in chapters:
        return chapters[stem]
    for key, chapter in chapters.items():
        if key in path.stem or path.stem.startswith(key.split("_")[0] + "_"):
            return chapter
    try:
        title = _title(nb)
    except (IndexError, KeyError):
        return None
    return next((p for p in chapters.values() if _title(read_notebook(p)) == title), None)


def grade(paths: list[pathlib.Path], chapter: str | None = None) -> int:
    """Print one row per exercise check of each submission: notebook, exercise, check, status, note."""
    print("notebook\texercise\tcheck\tstatus\tnote")
    for path in paths:
        path = pathlib.Path(path).resolve()
        try:
            nb = read_notebook(path)
            if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
                raise ValueError("no list of cells")
        except (OSError, ValueError) as error:
            print(f"{path.name}\t-\t-\tunreadable\tnot a notebook: {error}", flush=True)
            continue
        origin = select_chapters(chapter)[0] if chapter else chapter_of(nb, path)
        if origin is None:
            print(f"{path.name}\t-\t-\tunknown chapter\tgive --chapter NN", flush=True)
            continue
        reference = read_notebook(origin)
        submitted = "\n".join(source(c) for c in nb["cells"] if c.get("cell_type") == "code")
        try:
            results, errors = run_and_grade(nb, reference, cwd=path.parent)
        except Exception as error:  # a dead kernel, a timeout
            print(f"{path.name}\t-\t-\tnot run\t{type(error).__name__}: {error}", flush=True)
            continue
        for label, name, status, message in results:
            notes = [] if f"{name}(" in submitted else ["its check cell is missing from the submission"]
            if status not in ("correct", NOT_ATTEMPTED):
                notes.append(" ".join(message.splitlines()[1:2]) or message)
            print(f"{path.name}\t{label}\t{name}\t{status}\t{'; '.join(notes)}", flush=True)
        for error in errors:
            print(f"{path.name}\t-\t-\tcell error\t{error}", flush=True)
    return 0


def check(paths: list[pathlib.Path]) -> int:
    """``make student-check``: every student notebook runs without an error, every check not attempted."""
    failures = 0
    for path in paths:
        start = time.perf_counter()
        chapter = read_notebook(ROOT / "chapters" / path.name)
        results, errors = run_and_grade(read_notebook(path), chapter, cwd=ROOT / "chapters")
        wrong = [r for r in results if r[2] != NOT_ATTEMPTED]
        ok = results and not wrong and not errors
        failures += not ok
        print(f"{path.name}: ran in {time.perf_counter() - start:.0f} s, {len(results)} check(s), "
              f"{len(results) - len(wrong)} say 'not attempted' [{'ok' if ok else 'FAILED'}]"
              + (f" unexpected: {wrong}" if wrong else "") + (f" errors: {errors}" if errors else ""))
    return 1 if failures else 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="output folder (default _build, or _build/nbgrader with --nbgrader)")
    parser.add_argument("--chapters", help="chapters to use, by number or name: '03,05' (default: all of _toc.yml)")
    parser.add_argument("--check", action="store_true", help="also run every student notebook")
    parser.add_argument("--summary", action="store_true", help="print the chapters' exercises and checks for instructor.md")
    parser.add_argument("--grade", nargs="+", metavar="NOTEBOOK", help="grade submitted notebooks by running the checks afresh")
    parser.add_argument("--chapter", help="with --grade: the chapter the submissions come from (else read from each)")
    parser.add_argument("--nbgrader", action="store_true", help="write an nbgrader course directory")
    parser.add_argument("--assignment", help="with --nbgrader: put every chapter into this one assignment")
    parser.add_argument("--points", type=float, default=1.0, help="with --nbgrader: points per exercise (default 1)")
    parser.add_argument("--prompt-points", type=float, default=1.0, help="with --nbgrader: points per written answer")
    parser.add_argument("--hints", action="store_true", help="with --nbgrader: test cells show the checks' hints")
    parser.add_argument("--branch", nargs="?", const="students", metavar="NAME",
                        help="commit the student versions to branch NAME (default 'students') for the Colab links")
    args = parser.parse_args(argv)
    if args.points <= 0 or args.prompt_points <= 0:
        parser.error(f"--points and --prompt-points must be positive, got {args.points} and {args.prompt_points}")
    if args.grade:
        return grade([pathlib.Path(p) for p in args.grade], args.chapter)
    if args.summary:
        print(summary())
        return 0
    chapters = select_chapters(args.chapters)
    if args.nbgrader:
        build_nbgrader(pathlib.Path(args.out or ROOT / "_build" / "nbgrader").resolve(), chapters,
                       assignment=args.assignment, points=args.points, prompt_points=args.prompt_points,
                       graded=not args.hints)
        return 0
    out = pathlib.Path(args.out or ROOT / "_build").resolve()
    written = build(out, chapters, branch=args.branch or "students")
    if args.branch:
        commit = commit_to_branch(out / "student", args.branch, "Student versions of the chapters (make student)")
        print(f"branch {args.branch}: {commit[:12]}; push it (git push origin {args.branch}) for the links in LINKS.md")
    return check(written) if args.check else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
