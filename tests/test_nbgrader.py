"""`make nbgrader` with the real tool: nbgrader generates, autogrades and writes feedback.

The course that tools/make_student.py writes for every chapter goes through nbgrader's
generate_assignment. For chapters 02 and 03 (the fastest to run) submissions are made from the
released student version:

- alice: every answer right (the reference solutions pasted into the answer cells);
- bob: one exercise wrong in a way its check names, another left as released; the feedback must
  carry the check's message, without the hint (the test cells run in graded mode);
- chapter 02 only: mallory, nothing answered, the check functions redefined and patched in a cell of her own
  (the names the chapter imports, the chapter's module, the package), and every locked test cell
  replaced by ``print("correct")``: nbgrader puts the test cells back, and they score nothing (one chapter
  is enough: the locked cells and the checks work alike in every chapter, and each submission graded costs
  a run of the chapter);
- chapter 02 only: trudy, nothing answered, ``Feedback.assert_correct`` patched (fresh_check refuses a changed mechanism);
- chapter 02 only: dave, whose file is not valid JSON (nbgrader reports it; the others are graded).

nbgrader's autograde then runs every submission and the scores recorded in the gradebook are
asserted per test cell. The calls go through nbgrader's Python API (what its formgrader uses), one
process per phase, since every start of nbgrader costs seconds. nbgrader (requirements.txt) runs
``alembic`` from PATH: the environment's ``bin`` comes first. Static tests check the course of
every chapter without running nbgrader.
"""

from __future__ import annotations

import html
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import make_student  # noqa: E402  (tools/make_student.py)

if importlib.util.find_spec("nbgrader") is None:
    raise ImportError("nbgrader is missing: `make test` installs requirements.txt, which lists it (nbgrader>=0.9.6,<0.10)")

BIN = pathlib.Path(sys.executable).parent
CHAPTERS = {"ch02": "02_simple_self_attention", "ch03": "03_scaled_dot_product_attention"}
# One exercise per chapter answered wrong, with a mistake its check names, and one left as released.
WRONG = {
    "ch02": (1, "def stable_softmax(scores):\n    e = torch.exp(scores - scores.max())\n    return e / e.sum(dim=-1, keepdim=True)",
             "You subtracted one maximum for the whole tensor"),
    "ch03": (2, "def softmax_jacobian(p):\n    return torch.diag(p)", "your matrix is diagonal"),
}
STUB = {"ch02": 2, "ch03": 3}
EXERCISES = {"ch02": 5, "ch03": 4}  # one autograded test cell and one point per exercise
CHEAT = """\
# Pass every check without answering: redefine the names, patch the modules.
import attn_course.exercises as _package, attn_course.exercises.{module} as _module

class _Pass:
    status = "correct"
    def __bool__(self): return True
    def assert_correct(self): pass
    def __str__(self): return "✅ correct."

def _always(*args, **kwargs):
    return _Pass()

for _name in dir(_module):
    if _name.startswith("check_"):
        setattr(_module, _name, _always)
        globals()[_name] = _always
_package.call = lambda *args, **kwargs: None
_package.fresh_check = lambda *args, **kwargs: _always
"""
# The same, on the class of the checks' verdicts, which fresh_check does not load afresh (it keeps
# its identity in attn_course.exercises._core so that checks imported earlier keep working).
CHEAT_FEEDBACK = """\
import attn_course.exercises as _package
_package.Feedback.assert_correct = lambda self: self
_package.Feedback.__bool__ = lambda self: True
"""


# nbgrader's own Python API (what its formgrader calls), in one process per phase: starting nbgrader
# costs seconds each time, and the test runs inside `make test`.
DRIVER = r"""
import json, os, sys, time
from traitlets.config.loader import PyFileConfigLoader
from nbgrader.apps import NbGraderAPI

course, phase, plan = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
os.chdir(course)
config = PyFileConfigLoader("nbgrader_config.py", path=course).load_config()
config.CourseDirectory.root = course
api = NbGraderAPI(config=config)
report = {"timings": {}, "results": {}}
for assignment, students in plan.items():
    start = time.perf_counter()
    if phase == "generate":
        report["results"][assignment] = api.generate_assignment(assignment)
    else:
        for student in students:
            begin = time.perf_counter()
            report["results"][f"{assignment}/{student}"] = api.autograde(assignment, student)
            report["timings"][f"autograde {assignment} {student}"] = time.perf_counter() - begin
        begin = time.perf_counter()
        report["results"][f"{assignment}/feedback"] = api.generate_feedback(assignment)
        report["timings"][f"generate_feedback {assignment}"] = time.perf_counter() - begin
    report["timings"][f"{phase} {assignment}"] = time.perf_counter() - start
print("NBGRADER-REPORT " + json.dumps(report))
"""


def _env() -> dict:
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", OMP_NUM_THREADS="1")
    env.pop("ATTN_COURSE_GRADED", None)  # the course's own configuration must switch graded mode on
    return env


def nbgrader(course: pathlib.Path, phase: str, plan: dict) -> dict:
    """Run nbgrader's API on the course: ``generate`` the assignments, or ``grade`` the submissions
    (autograde each student, then generate_feedback). Returns each call's result and the timings."""
    result = subprocess.run([sys.executable, "-c", DRIVER, str(course), phase, json.dumps(plan)], cwd=course,
                            env=_env(), capture_output=True, text=True, timeout=900)
    line = next((l for l in result.stdout.splitlines() if l.startswith("NBGRADER-REPORT ")), None)
    if result.returncode != 0 or line is None:
        raise AssertionError(f"nbgrader {phase} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return json.loads(line.removeprefix("NBGRADER-REPORT "))


def _grade_id(cell) -> str:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")


def _answers(source_nb: dict) -> dict[str, str]:
    """The reference answer of every answer cell: the source cell without the region markers."""
    answers = {}
    for cell in source_nb["cells"]:
        meta = cell["metadata"].get("nbgrader", {})
        if meta.get("solution"):
            lines = [line for line in make_student.source(cell).split("\n")
                     if make_student.BEGIN not in line and make_student.END not in line]
            answers[meta["grade_id"]] = "\n".join(lines) if cell["cell_type"] == "code" else "My prediction, in words."
    return answers


def _submission(released: dict, replace: dict[str, str], extra: str | None = None, tests: str | None = None) -> dict:
    nb = json.loads(json.dumps(released))
    for cell in nb["cells"]:
        grade_id = _grade_id(cell)
        if grade_id in replace:
            cell["source"] = replace[grade_id]
        elif tests is not None and cell["metadata"].get("nbgrader", {}).get("grade") and cell["cell_type"] == "code":
            cell["source"] = tests
    if extra is not None:  # a cell of the student's own, after the imports of the checks
        where = next(i for i, c in enumerate(nb["cells"]) if "from attn_course.exercises." in make_student.source(c))
        nb["cells"].insert(where + 1, {"cell_type": "code", "id": "cheat", "metadata": {}, "execution_count": None,
                                       "outputs": [], "source": extra})
    return nb


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """The course for chapters 02 and 03, generated, submitted, autograded, with feedback."""
    root = tmp_path_factory.mktemp("nbgrader-course")
    make_student.build_nbgrader(root)  # every chapter: generate_assignment must accept them all
    generated = nbgrader(root, "generate", {make_student.chapter_id(c): [] for c in make_student.toc_chapters()})
    plan = {}
    for assignment, name in CHAPTERS.items():
        source_nb = json.loads((root / "source" / assignment / f"{name}.ipynb").read_text())
        released = json.loads((root / "release" / assignment / f"{name}.ipynb").read_text())
        right = _answers(source_nb)
        wrong_exercise, wrong_code, _ = WRONG[assignment]
        bob = {k: v for k, v in right.items() if not k.startswith(f"{assignment}-ex{STUB[assignment]}-")}
        bob[f"{assignment}-ex{wrong_exercise}-answer1"] = wrong_code
        submissions = {"alice": _submission(released, right), "bob": _submission(released, bob)}
        if assignment == "ch02":
            submissions["mallory"] = _submission(released, {}, extra=CHEAT.format(module=assignment),
                                                 tests='print("✅ correct.")')
        for student, nb in submissions.items():
            target = root / "submitted" / student / assignment / f"{name}.ipynb"
            target.parent.mkdir(parents=True)
            target.write_text(json.dumps(nb))
        if assignment == "ch02":
            broken = root / "submitted" / "dave" / assignment / f"{name}.ipynb"
            broken.parent.mkdir(parents=True)
            broken.write_text('{"cells": [ this is not JSON')
            submissions["dave"] = None
            trudy = _submission(released, {}, extra=CHEAT_FEEDBACK)
            (root / "submitted" / "trudy" / assignment).mkdir(parents=True)
            (root / "submitted" / "trudy" / assignment / f"{name}.ipynb").write_text(json.dumps(trudy))
            submissions["trudy"] = None
        plan[assignment] = list(submissions)
    graded = nbgrader(root, "grade", plan)
    timings = {**generated["timings"], **graded["timings"]}
    (root / "timings.json").write_text(json.dumps(timings, indent=1))
    print("nbgrader timings (s):", json.dumps({k: round(v, 1) for k, v in timings.items()}))
    return root, {**generated["results"], **graded["results"]}


def _scores(course: pathlib.Path, assignment: str, student: str) -> dict[str, float | None]:
    """The gradebook's automatic score of every autograded cell of one submission."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        notebook = gradebook.find_submission_notebook(CHAPTERS[assignment], assignment, student)
        return {grade.name: grade.auto_score for grade in notebook.grades if grade.cell.cell_type == "code"}


def _test_ids(course: pathlib.Path, assignment: str) -> dict[str, float]:
    nb = json.loads((course / "source" / assignment / f"{CHAPTERS[assignment]}.ipynb").read_text())
    return {_grade_id(c): c["metadata"]["nbgrader"]["points"] for c in nb["cells"]
            if c["metadata"].get("nbgrader", {}).get("grade") and c["cell_type"] == "code"}


@pytest.mark.slow
def test_generate_assignment_accepts_every_chapter(course):
    root, results = course
    for chapter in make_student.toc_chapters():
        assignment = make_student.chapter_id(chapter)
        assert results[assignment]["success"], f"{chapter.name}: {results[assignment]}"
        released = json.loads((root / "release" / assignment / chapter.name).read_text())
        assert "BEGIN SOLUTION" not in json.dumps(released)
        assert not any(make_student.SOLUTION_TAG in make_student.tags(c) for c in released["cells"])


@pytest.mark.slow
@pytest.mark.parametrize("assignment", CHAPTERS)
def test_autograde_scores_right_and_wrong(course, assignment):
    root, results = course
    tests = _test_ids(root, assignment)
    assert len(tests) == EXERCISES[assignment] and sum(tests.values()) == EXERCISES[assignment], tests
    for student in ("alice", "bob"):
        assert results[f"{assignment}/{student}"]["success"], results[f"{assignment}/{student}"]
    assert _scores(root, assignment, "alice") == tests, "every answer right: full marks"
    wrong, stub = f"{assignment}-ex{WRONG[assignment][0]}-", f"{assignment}-ex{STUB[assignment]}-"
    assert _scores(root, assignment, "bob") == {k: (0.0 if k.startswith((wrong, stub)) else v) for k, v in tests.items()}


@pytest.mark.slow
def test_redefined_checks_and_edited_test_cells_score_nothing(course):
    root, results = course
    tests = _test_ids(root, "ch02")
    assert results["ch02/mallory"]["success"], results["ch02/mallory"]
    assert _scores(root, "ch02", "mallory") == {k: 0.0 for k in tests}, "redefined checks and edited tests scored"
    # nbgrader put the locked test cells that mallory edited back as they were released
    wrong = f"ch02-ex{WRONG['ch02'][0]}-"
    log = results["ch02/mallory"]["log"]
    assert re.search(rf"Attribute 'checksum' for cell {wrong}\S+ has changed", log, re.IGNORECASE), log


@pytest.mark.slow
@pytest.mark.parametrize("assignment", CHAPTERS)
def test_feedback_carries_the_checks_message_without_hints(course, assignment):
    root, results = course
    assert results[f"{assignment}/feedback"]["success"], results[f"{assignment}/feedback"]
    name = CHAPTERS[assignment]
    page = html.unescape(re.sub(r"<[^>]+>", "", (root / "feedback" / "bob" / assignment / f"{name}.html").read_text()))
    message = WRONG[assignment][2]
    assert message in page, f"the feedback does not quote the check's message {message!r}"
    assert "Not attempted yet" in page, "the exercise left as released says so"
    assert "Hint:" not in page, "graded mode: the feedback must not show the checks' hints"
    right = html.unescape((root / "feedback" / "alice" / assignment / f"{name}.html").read_text())
    assert ": correct." in right and ": incorrect." not in right


@pytest.mark.slow
def test_patching_the_feedback_class_does_not_score(course):
    root, results = course
    assert results["ch02/trudy"]["success"], results["ch02/trudy"]
    assert _scores(root, "ch02", "trudy") == {k: 0.0 for k in _test_ids(root, "ch02")}


@pytest.mark.slow
def test_a_submission_that_is_not_a_notebook_is_reported(course):
    """nbgrader's own handling of bad input: the broken file fails alone, with a message, no score."""
    root, results = course
    result = results["ch02/dave"]
    assert not result["success"] and re.search(r"json|notebook", result["log"] + result.get("error", ""), re.IGNORECASE), result
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gradebook:
        try:
            score = gradebook.find_submission("ch02", "dave").score
        except MissingEntry:
            score = None
    assert not score, f"a submission that is not a notebook scored {score}"


@pytest.mark.slow
def test_released_answer_cells_are_the_student_versions_scaffolds(course, tmp_path):
    """One implementation: what generate_assignment releases is what `make student` writes."""
    course, _ = course
    make_student.build(tmp_path, [ROOT / "chapters" / f"{n}.ipynb" for n in CHAPTERS.values()])

    def normal(text: str) -> str:
        text = re.sub(r"[ \t]+\n", "\n", text + "\n")
        return re.sub(r"\n{3,}", "\n\n", text).strip()

    for assignment, name in CHAPTERS.items():
        released = json.loads((course / "release" / assignment / f"{name}.ipynb").read_text())
        student = json.loads((tmp_path / "student" / f"{name}.ipynb").read_text())
        answers = [normal(make_student.source(c)) for c in released["cells"]
                   if c["metadata"].get("nbgrader", {}).get("solution") and c["cell_type"] == "code"]
        scaffolds = [normal(make_student.source(c)) for c in student["cells"] if make_student._is_scaffold(c)]
        assert answers == scaffolds
        text = json.dumps(released)
        assert "BEGIN SOLUTION" not in text and "#@title" not in text
        written = [c for c in released["cells"] if c["cell_type"] == "markdown"
                   and c["metadata"].get("nbgrader", {}).get("solution")]
        assert written and all(make_student.source(c).strip() == make_student.ANSWER_PLACEHOLDER for c in written)


# --------------------------------------------------------------------------------------------------
# Static: the course for every chapter, without running nbgrader


@pytest.fixture(scope="module")
def every_chapter(tmp_path_factory):
    root = tmp_path_factory.mktemp("nbgrader-all")
    make_student.build_nbgrader(root)
    return root


@pytest.mark.parametrize("chapter", make_student.toc_chapters(), ids=lambda p: p.stem)
def test_every_chapter_becomes_an_nbgrader_source(every_chapter, chapter):
    nb = json.loads((every_chapter / "source" / make_student.chapter_id(chapter) / chapter.name).read_text())
    original = json.loads(chapter.read_text())
    found = make_student.plan(original)
    meta = [c["metadata"].get("nbgrader") for c in nb["cells"]]
    assert all(meta), "every cell carries nbgrader metadata"
    ids = [m["grade_id"] for m in meta]
    assert len(ids) == len(set(ids)), "grade ids are unique"
    tests = [c for c in nb["cells"] if c["metadata"]["nbgrader"]["grade"] and c["cell_type"] == "code"]
    assert len(tests) == sum(len(e.checks) for e in found) >= 3
    assert sum(c["metadata"]["nbgrader"]["points"] for c in tests) == pytest.approx(len([e for e in found if e.checks]))
    for cell in tests:
        text = make_student.source(cell)
        assert cell["metadata"]["nbgrader"]["locked"] and "fresh_check(" in text and ".assert_correct()" in text
        assert 'os.environ["ATTN_COURSE_GRADED"] = "1"' in text
    answers = [c for c in nb["cells"] if c["metadata"]["nbgrader"]["solution"] and c["cell_type"] == "code"]
    assert len(answers) == sum(len(e.scaffolds) for e in found)
    for cell in answers:
        text = make_student.source(cell)
        assert text.count(make_student.BEGIN) == text.count(make_student.END) >= 1
        assert not cell["metadata"]["nbgrader"]["locked"]
    written = [c for c in nb["cells"] if c["metadata"]["nbgrader"]["solution"] and c["cell_type"] == "markdown"]
    assert len(written) == len(make_student.prompts(original))
    assert all(c["metadata"]["nbgrader"]["grade"] and c["metadata"]["nbgrader"]["points"] > 0 for c in written)
    others = [c for c in nb["cells"] if not c["metadata"]["nbgrader"]["solution"]]
    assert all(c["metadata"]["nbgrader"]["locked"] for c in others), "prose and demonstrations are read-only"
    assert not any("solution" in make_student.tags(c) for c in nb["cells"])
    assert all(c.get("outputs", []) == [] for c in nb["cells"])


def test_nbgrader_config_and_command_line(tmp_path):
    out = tmp_path / "course"
    assert make_student.main(["--nbgrader", "--out", str(out), "--chapters", "03,ch05", "--points", "2",
                              "--prompt-points", "0.5"]) == 0
    assert sorted(p.relative_to(out).as_posix() for p in (out / "source").rglob("*.ipynb")) == [
        "source/ch03/03_scaled_dot_product_attention.ipynb", "source/ch05/05_multi_head_attention.ipynb"]
    config = (out / "nbgrader_config.py").read_text()
    assert 'c.ClearSolutions.code_stub = {"python": ""}' in config and "ATTN_COURSE_GRADED" in config
    nb = json.loads((out / "source" / "ch05" / "05_multi_head_attention.ipynb").read_text())
    points = {_grade_id(c): c["metadata"]["nbgrader"]["points"] for c in nb["cells"] if c["metadata"]["nbgrader"]["grade"]}
    assert points["ch05-ex1-split-heads"] == points["ch05-ex1-merge-heads"] == 1.0  # 2 points, two checks
    assert points["ch05-ex2-split-fused-qkv"] == 2.0
    original = json.loads((ROOT / "chapters" / "05_multi_head_attention.ipynb").read_text())
    written = [v for k, v in points.items() if "written" in k]
    assert written and written == [0.5] * len(make_student.prompts(original))  # one answer cell per prompt
    one = tmp_path / "one"
    make_student.main(["--nbgrader", "--out", str(one), "--chapters", "02 03", "--assignment", "week1"])
    assert sorted(p.name for p in (one / "source" / "week1").glob("*.ipynb")) == [
        "02_simple_self_attention.ipynb", "03_scaled_dot_product_attention.ipynb"]
    with pytest.raises(SystemExit, match="no chapter '99'"):
        make_student.main(["--nbgrader", "--out", str(one), "--chapters", "99"])


def test_points_from_cell_metadata():
    nb = json.loads((ROOT / "chapters" / "02_simple_self_attention.ipynb").read_text())
    check = next(e for e in make_student.plan(nb)).checks[0]
    nb["cells"][check.cell]["metadata"]["attn_course"] = {"points": 3}
    prompt = make_student.prompts(nb)[0]
    nb["cells"][prompt.cell]["metadata"]["attn_course"] = {"points": 2}
    source = make_student.nbgrader_source(nb, "02_simple_self_attention.ipynb")
    points = {_grade_id(c): c["metadata"]["nbgrader"]["points"] for c in source["cells"] if c["metadata"]["nbgrader"]["grade"]}
    assert points["ch02-ex1-stable-softmax"] == 3.0
    assert points[f"ch02-written{prompt.cell:03d}"] == 2.0
    nb["cells"][check.cell]["metadata"]["attn_course"] = {"points": -1}
    with pytest.raises(ValueError, match="positive number, got -1"):
        make_student.nbgrader_source(nb, "02_simple_self_attention.ipynb")
