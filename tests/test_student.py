"""`make student`: student notebooks without solutions that still run, and the instructor's bundle.

The static checks cover every chapter of _toc.yml. Executing a student notebook costs as much as the
chapter itself, so this file executes chapter 02 (the model chapter) by default; set
ATTN_COURSE_STUDENT_ALL=1 (``make student-check`` runs them all) to execute every chapter.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("make_student", ROOT / "tools" / "make_student.py")
make_student = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_student)

CHAPTERS = make_student.toc_chapters()
EXECUTED_BY_DEFAULT = {"02_simple_self_attention"}
RUN_ALL = os.environ.get("ATTN_COURSE_STUDENT_ALL") == "1"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("student-build")
    make_student.build(out)
    return out


def _solution_sources(path: pathlib.Path) -> list[str]:
    nb = json.loads(path.read_text())
    return ["".join(c["source"]) for c in nb["cells"] if make_student.SOLUTION_TAG in make_student.tags(c)]


def test_every_toc_chapter_gets_a_student_version(bundle):
    assert CHAPTERS, "no chapter in _toc.yml"
    assert sorted(p.name for p in (bundle / "student").glob("*.ipynb")) == sorted(p.name for p in CHAPTERS)
    assert sorted(p.name for p in (bundle / "solutions").glob("*.ipynb")) == sorted(p.name for p in CHAPTERS)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_student_version_has_no_solutions_and_no_outputs(bundle, chapter):
    original = json.loads(chapter.read_text())
    student = json.loads((bundle / "student" / chapter.name).read_text())
    solutions = _solution_sources(chapter)
    assert solutions, f"{chapter.name}: no cell tagged 'solution'"
    student_text = "\n".join("".join(c["source"]) for c in student["cells"])
    for solution in solutions:
        assert solution not in student_text
    assert not any(make_student.SOLUTION_TAG in make_student.tags(c) for c in student["cells"])
    code = [c for c in student["cells"] if c["cell_type"] == "code"]
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in code)
    assert "widgets" not in student["metadata"]
    # Everything else is kept, in order: the scaffolds and the check calls too.
    kept = [c["source"] for c in original["cells"] if make_student.SOLUTION_TAG not in make_student.tags(c)]
    assert [c["source"] for c in student["cells"]] == kept
    checks = make_student.exercises(original)
    assert len(checks) >= 3, f"{chapter.name}: {len(checks)} exercise checks found"
    assert all(f"{e['check']}(" in student_text for e in checks)


def test_bundles_are_zipped_and_the_student_zip_holds_no_solution(bundle):
    with zipfile.ZipFile(bundle / "attn-course-student.zip") as archive:
        names = archive.namelist()
        text = "\n".join(archive.read(n).decode() for n in names)
    assert "attn-course-student/README.txt" in names
    for chapter in CHAPTERS:
        assert f"attn-course-student/{chapter.name}" in names
        for solution in _solution_sources(chapter):
            assert solution not in text
    with zipfile.ZipFile(bundle / "attn-course-solutions.zip") as archive:
        assert "attn-course-solutions/SOLUTIONS.md" in archive.namelist()
    solutions_md = (bundle / "solutions" / "SOLUTIONS.md").read_text()
    for chapter in CHAPTERS:
        for exercise in make_student.exercises(json.loads(chapter.read_text())):
            assert f"`{exercise['check']}`" in solutions_md


@pytest.mark.slow
@pytest.mark.parametrize("chapter", [c for c in CHAPTERS if RUN_ALL or c.stem in EXECUTED_BY_DEFAULT], ids=lambda p: p.stem)
def test_student_version_runs_top_to_bottom(bundle, chapter):
    checks = make_student.execute_student(bundle / "student" / chapter.name)
    assert len(checks) >= 3, checks
    for name, text in checks.items():
        assert "not attempted yet" in text.lower(), f"{name} printed: {text!r}"
        assert "Traceback" not in text


@pytest.mark.slow
def test_grading_submissions_tells_correct_error_and_not_attempted(tmp_path):
    """`make_student.py --grade`: a submission with one right answer, one crashing, the rest untouched."""
    import re

    chapter = ROOT / "chapters" / "02_simple_self_attention.ipynb"
    nb = json.loads(chapter.read_text())
    cells, solutions_seen = [], 0
    for cell in nb["cells"]:
        if make_student.SOLUTION_TAG in make_student.tags(cell):
            solutions_seen += 1
            if solutions_seen != 1:  # keep the first solution: that exercise is answered right
                continue
        cells.append(cell)
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    # The second exercise's scaffold now raises, as buggy student code would.
    scaffolds = [c for c in cells if c["cell_type"] == "code" and re.search(r"^\s*\.\.\.", "".join(c["source"]), re.MULTILINE)]
    crashing = scaffolds[1]
    crashing["source"] = re.sub(r"^(\s*)\.\.\..*$", r'\1raise ValueError("a bug")', "".join(crashing["source"]), flags=re.MULTILINE)
    nb["cells"] = cells
    nb["metadata"].pop("widgets", None)
    submission = tmp_path / "alice_02.ipynb"
    submission.write_text(json.dumps(nb))
    checks = make_student.execute_student(submission, allow_errors=True, cwd=ROOT / "chapters")
    verdicts = [make_student.verdict(text) for text in checks.values()]
    assert len(verdicts) >= 3, checks
    assert verdicts == ["correct", "error"] + ["not attempted"] * (len(verdicts) - 2), checks


def test_instructor_page_names_every_chapter_and_check():
    """instructor.md stays current: `python tools/make_student.py --summary` prints what to paste."""
    page = (ROOT / "instructor.md").read_text()
    for chapter in CHAPTERS:
        assert f"chapters/{chapter.name}" in page, f"instructor.md does not describe {chapter.name}"
        for exercise in make_student.exercises(json.loads(chapter.read_text())):
            assert f"`{exercise['check']}`" in page, (
                f"instructor.md does not name {exercise['check']} ({chapter.name}); "
                "run `python tools/make_student.py --summary` and update the chapter's block")
