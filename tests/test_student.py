"""`make student`: student notebooks without solutions that still run, the instructor's bundle, the
Colab links, grading without nbgrader (`--grade`), and the instructor page's numbers.

The static checks cover every chapter of _toc.yml. Executing a student notebook costs as much as the
chapter itself, so this file executes chapter 02 (the model chapter) by default; set
ATTN_COURSE_STUDENT_ALL=1 (``make student-check`` runs them all) to execute every chapter.
The nbgrader course made from the same plan is tested in tests/test_nbgrader.py.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import make_student  # noqa: E402  (tools/make_student.py)

CHAPTERS = make_student.toc_chapters()
EXECUTED_BY_DEFAULT = {"02_simple_self_attention"}
RUN_ALL = os.environ.get("ATTN_COURSE_STUDENT_ALL") == "1"
NUMBER_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("student-build")
    make_student.build(out)
    return out


def _solution_sources(path: pathlib.Path) -> list[str]:
    nb = json.loads(path.read_text())
    return [make_student.source(c) for c in nb["cells"] if make_student.SOLUTION_TAG in make_student.tags(c)]


def test_every_toc_chapter_gets_a_student_version(bundle):
    assert CHAPTERS, "no chapter in _toc.yml"
    assert sorted(p.name for p in (bundle / "student").glob("*.ipynb")) == sorted(p.name for p in CHAPTERS)
    assert sorted(p.name for p in (bundle / "solutions").glob("*.ipynb")) == sorted(p.name for p in CHAPTERS)


def test_make_student_needs_only_the_standard_library(tmp_path):
    """`make student` runs with any Python 3.9+, without torch, Jupyter or PyYAML (the Makefile uses python3)."""
    script = ("import sys, builtins\n"
              "real = builtins.__import__\n"
              "def guard(name, *args, **kwargs):\n"
              "    if name.split('.')[0] in {'torch', 'yaml', 'nbformat', 'nbclient', 'numpy', 'attn_course'}:\n"
              "        raise ImportError('not in the small environment: ' + name)\n"
              "    return real(name, *args, **kwargs)\n"
              "builtins.__import__ = guard\n"
              f"sys.argv = ['make_student.py', '--out', {str(tmp_path)!r}, '--chapters', '02']\n"
              "import runpy\n"
              f"runpy.run_path({str(ROOT / 'tools' / 'make_student.py')!r}, run_name='__main__')\n")
    result = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "student" / "02_simple_self_attention.ipynb").exists()


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_student_version_has_no_solutions_and_no_outputs(bundle, chapter):
    original = json.loads(chapter.read_text())
    student = json.loads((bundle / "student" / chapter.name).read_text())
    solutions = _solution_sources(chapter)
    assert solutions, f"{chapter.name}: no cell tagged 'solution'"
    student_text = "\n".join(make_student.source(c) for c in student["cells"])
    for solution in solutions:
        assert solution not in student_text
    assert not any(make_student.SOLUTION_TAG in make_student.tags(c) for c in student["cells"])
    code = [c for c in student["cells"] if c["cell_type"] == "code"]
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in code)
    assert "widgets" not in student["metadata"]
    assert student["metadata"]["attn_course"]["chapter"] == chapter.stem
    # Every code cell but the solutions is kept as it is, in order: the scaffolds and the check calls too.
    kept = [make_student.source(c) for c in original["cells"]
            if c["cell_type"] == "code" and make_student.SOLUTION_TAG not in make_student.tags(c)]
    assert [make_student.source(c) for c in code] == kept
    found = make_student.exercises(original)
    assert len(found) >= 3, f"{chapter.name}: {len(found)} exercise checks found"
    assert all(f"{name}(" in student_text for e in found for name in e["checks"])
    # One answer cell under each prompt for a written answer; the collapsed answers are gone.
    prompts = make_student.prompts(original)
    answers = [c for c in student["cells"] if make_student.source(c) == make_student.ANSWER_PLACEHOLDER]
    assert len(answers) == len(prompts)
    assert not re.search(r"<details>\s*<summary>\s*Answer", student_text, re.IGNORECASE)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_student_version_promises_no_solution(bundle, chapter):
    """The student versions have no solutions, so their prose must not promise one (issue 18)."""
    student = json.loads((bundle / "student" / chapter.name).read_text())
    said = [(i, m.group(0)) for i, c in enumerate(student["cells"]) if c["cell_type"] == "markdown"
            for m in re.finditer(r"[^.\n]*\bsolutions?\b[^.\n]*", make_student.source(c), re.IGNORECASE)]
    assert not said, (f"{chapter.name}: the student version still mentions a solution: {said}; reword the "
                      "chapter or add a rule to STUDENT_PROSE in tools/make_student.py")


def test_prompts_are_found_and_tags_override(tmp_path):
    cell = lambda text, tags=(): {"cell_type": "markdown", "metadata": {"tags": list(tags)}, "source": text}  # noqa: E731
    assert make_student.asks(cell("Before you run the check, predict: how many keys?"))
    assert make_student.asks(cell("Write it. Then **predict**: what would the loss do?"))
    assert make_student.asks(cell("Then use it to explain the last column of Table 3."))
    assert make_student.asks(cell("Guess the order of magnitude before you compute it."))
    assert make_student.asks(cell("Anything at all.", ["prompt"]))
    assert not make_student.asks(cell("Before you run the check, predict: how many keys?", ["not-a-prompt"]))
    assert not make_student.asks(cell("A language model predicts the next word."))
    assert not make_student.asks(cell("so that you can predict what attention will do"))
    assert not make_student.asks(cell("### Exercise 4: predict a receptive field"))
    assert not make_student.asks(cell("<details><summary>Answer</summary>\n\nPredict: no.\n</details>"))
    nb = {"cells": [cell("# Title"), cell("## 1. Go"), cell("Predict first: which?"),
                    cell("<details><summary>Answer</summary>\n\nThis one.\n\n</details>"),
                    cell("## Going further (not checked)\n\n- Predict which one wins, then run it.")]}
    found = make_student.prompts(nb)
    assert [(p.cell, p.answer) for p in found] == [(2, "This one.")]


def test_scaffold_and_solution_merge_into_regions():
    scaffold = "from torch import nn\n\nclass M(nn.Module):\n    def forward(self, x):\n        ...  # your code here\n\nanswer = ...  # a number"
    solution = ("#@title Solution\nfrom torch import nn\n\nclass M(nn.Module):\n    def forward(self, x):\n"
                "        y = x + 1\n        return y\n\nanswer = 42\n\ncheck_m(M, answer)\n# the worked answer")
    (merged,) = make_student.merge_solution([scaffold], solution)
    assert merged == ("from torch import nn\n\nclass M(nn.Module):\n    def forward(self, x):\n        ...  # your code here\n"
                      "        ### BEGIN SOLUTION\n        y = x + 1\n        return y\n        ### END SOLUTION\n\n"
                      "answer = ...  # a number\n### BEGIN SOLUTION\nanswer = 42\n### END SOLUTION")
    assert make_student.clear_regions(merged).replace("        \n", "").replace("\n\n\n", "\n\n").startswith(scaffold)
    assert make_student.split_solution(solution)[1] == ["# the worked answer"]
    with pytest.raises(make_student.MergeError, match="'def f\\(y\\):' is not in the solution"):
        make_student.merge_solution(["def f(y):\n    ..."], "def f(x):\n    return x")
    with pytest.raises(make_student.MergeError, match="not under a `...`"):
        make_student.merge_solution(["def f(x):\n    ..."], "import math\ndef f(x):\n    return x")


def test_bundles_are_zipped_and_the_student_zip_holds_no_solution(bundle):
    with zipfile.ZipFile(bundle / "attn-course-student.zip") as archive:
        names = archive.namelist()
        text = "\n".join(archive.read(n).decode() for n in names)
    assert {"attn-course-student/README.txt", "attn-course-student/LINKS.md"} <= set(names)
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


def test_colab_links_open_the_student_notebooks_of_the_branch(bundle, tmp_path):
    owner_repo = make_student.repository()
    assert re.fullmatch(r"[\w.-]+/[\w.-]+", owner_repo)
    links = (bundle / "student" / "LINKS.md").read_text()
    for chapter in CHAPTERS:
        assert f"https://colab.research.google.com/github/{owner_repo}/blob/students/{chapter.name}" in links
    # --branch commits the student folder to a branch without touching the work tree, index or HEAD.
    repo = tmp_path / "repo"
    git = lambda *args: subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout  # noqa: E731
    repo.mkdir()
    git("init", "-q", "-b", "main")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "start")
    env_before = git("rev-parse", "HEAD"), git("status", "--porcelain")
    os.environ.setdefault("GIT_AUTHOR_NAME", "test"), os.environ.setdefault("GIT_AUTHOR_EMAIL", "t@t")
    os.environ.setdefault("GIT_COMMITTER_NAME", "test"), os.environ.setdefault("GIT_COMMITTER_EMAIL", "t@t")
    make_student.commit_to_branch(bundle / "student", "students", "student versions", repo=repo)
    assert (git("rev-parse", "HEAD"), git("status", "--porcelain")) == env_before
    files = git("ls-tree", "--name-only", "students").split()
    assert sorted(files) == sorted(["LINKS.md", "README.txt"] + [c.name for c in CHAPTERS])


@pytest.mark.slow
@pytest.mark.parametrize("chapter", [c for c in CHAPTERS if RUN_ALL or c.stem in EXECUTED_BY_DEFAULT], ids=lambda p: p.stem)
def test_student_version_runs_top_to_bottom(bundle, chapter):
    assert make_student.check([bundle / "student" / chapter.name]) == 0


@pytest.mark.slow
def test_grading_runs_the_real_checks_afresh(tmp_path, capsys):
    """`make_student.py --grade`: the checks run afresh on the answers, whatever the notebook printed,
    redefined or deleted; a file that is not a notebook is reported."""
    chapter = ROOT / "chapters" / "02_simple_self_attention.ipynb"
    nb = make_student.student_version(json.loads(chapter.read_text()), chapter)
    found = make_student.plan(json.loads(chapter.read_text()))
    solutions = {e.number: make_student.source(json.loads(chapter.read_text())["cells"][e.solution]) for e in found}
    scaffold = {e.number: make_student.source(json.loads(chapter.read_text())["cells"][e.scaffolds[0]]) for e in found}
    cells = nb["cells"]
    for cell in cells:
        text = make_student.source(cell)
        if text == scaffold[1]:   # exercise 1 answered right (its check call stays in the solution's text)
            cell["source"] = solutions[1]
        elif text == scaffold[2]:  # exercise 2 crashes
            cell["source"] = text.replace("...  # your code here", 'raise ValueError("a bug")')
        elif text == scaffold[3]:  # exercise 3 answered right, but its check cell is deleted below
            cell["source"] = solutions[3].replace("check_attention_without_self(attention_without_self)", "")
        elif text == scaffold[4]:  # exercise 4 untouched, and the check redefined to say "correct"
            cell["source"] = text + '\n\ncheck_cosine_self_attention = lambda *args: print("✅ correct.")'
    nb["cells"] = [c for c in cells if make_student.source(c).strip() != "check_attention_without_self(attention_without_self)"]
    submission = tmp_path / "alice_02.ipynb"
    submission.write_text(json.dumps(nb))
    broken = tmp_path / "bob_02.ipynb"
    broken.write_text("{ not json")
    assert make_student.main(["--grade", str(submission), str(broken)]) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.strip().splitlines()]
    assert rows[0] == ["notebook", "exercise", "check", "status", "note"]
    graded = {row[2]: row for row in rows[1:] if row[0] == "alice_02.ipynb" and row[2] != "-"}
    assert {name: row[3] for name, row in graded.items()} == {
        "check_stable_softmax": "correct", "check_batched_self_attention": "error",
        "check_attention_without_self": "correct", "check_cosine_self_attention": "not attempted",
        "check_shuffled_attention": "not attempted"}, rows
    assert "its check cell is missing" in graded["check_attention_without_self"][4]
    assert "a bug" in graded["check_batched_self_attention"][4]
    assert any(row[0] == "bob_02.ipynb" and row[3] == "unreadable" for row in rows), rows


def test_instructor_page_names_every_chapter_and_check():
    """instructor.md stays current: `python tools/make_student.py --summary` prints what to paste."""
    page = (ROOT / "instructor.md").read_text()
    for chapter in CHAPTERS:
        assert f"chapters/{chapter.name}" in page, f"instructor.md does not describe {chapter.name}"
        for exercise in make_student.exercises(json.loads(chapter.read_text())):
            for name in exercise["checks"]:
                assert f"`{name}`" in page, (
                    f"instructor.md does not name {name} ({chapter.name}); "
                    "run `python tools/make_student.py --summary` and update the chapter's block")


def test_instructor_page_counts_exercises_as_the_notebooks_do():
    """Every "N exercises" on the instructor page, and each chapter block's list, match the notebook."""
    page = (ROOT / "instructor.md").read_text()
    counts = {c.stem[:2]: len(make_student.exercises(json.loads(c.read_text()))) for c in CHAPTERS}
    wrong = []
    for number, count in counts.items():
        block = re.search(rf"^### {number} ·.*?(?=^### |^## |\Z)", page, re.MULTILINE | re.DOTALL)
        assert block, f"instructor.md has no block '### {number} · ...'"
        listed = len(re.findall(r"^\s+- Exercise", block.group(0), re.MULTILINE))
        if listed != count:
            wrong.append(f"chapter {number}'s block lists {listed} exercises, the notebook has {count}")
    # A number of exercises in a sentence belongs to the last chapter named before it in that paragraph.
    for paragraph in re.split(r"\n\s*\n", page):
        for match in re.finditer(r"\b(one|two|three|four|five|six|seven|eight|\d+)\s+exercises\b", paragraph, re.IGNORECASE):
            before = paragraph[:match.start()]
            named = re.findall(r"(?:[Cc]hapter |^### )(\d\d)\b", before, re.MULTILINE)
            said = NUMBER_WORDS.get(match.group(1).lower()) or int(match.group(1))
            if named and named[-1] in counts and said != counts[named[-1]]:
                wrong.append(f"'{match.group(0)}' for chapter {named[-1]}, which has {counts[named[-1]]}")
    assert not wrong, "instructor.md: " + "; ".join(wrong) + " (python tools/make_student.py --summary)"
