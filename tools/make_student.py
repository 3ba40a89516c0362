"""Write the student versions of the chapters, and a matching solutions bundle for the instructor.

For every chapter listed in _toc.yml:

- ``_build/student/NN_name.ipynb``: the chapter with every cell tagged ``solution`` removed and every
  output cleared (no figures, no widget state, no execution counts). The exercise scaffolds
  (``...  # your code here``) and the cells that call the checks stay, so the notebook runs top to
  bottom and each check answers "not attempted yet" until the student fills in the scaffold.
- ``_build/solutions/NN_name.ipynb``: the full chapter as committed (executed, with the solutions),
  and ``_build/solutions/SOLUTIONS.md``: every exercise with its check and its solution code, for
  grading at a glance.
- ``_build/attn-course-student.zip`` and ``_build/attn-course-solutions.zip``: the same two folders,
  ready to upload to a learning platform. Keep the solutions zip to yourself.

Usage: python tools/make_student.py [--check] [--out _build] [--summary]
``--check`` also executes every student notebook (as ``make student-check`` does) and fails unless
each runs without an error and every exercise check says it was not attempted.
``--grade FILE.ipynb ...`` re-runs submitted notebooks (errors in them do not stop it) and prints
every check's verdict per notebook, tab-separated (notebook, check, status).
``--summary`` only prints, for the instructor page (instructor.md), each chapter's time,
prerequisites and exercises with the names of their checks, as read from the notebooks.
"""

from __future__ import annotations

import argparse
import copy
import json
import pathlib
import re
import shutil
import sys
import time
import zipfile

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOLUTION_TAG = "solution"
NOT_ATTEMPTED = "not attempted"
CHECK_CALL = re.compile(r"^\s*(check_\w+)\s*\(", re.MULTILINE)

STUDENT_README = """\
attn-course: student notebooks
==============================

One notebook per chapter. Open one in Jupyter, JupyterLab, VS Code or Google Colab
(File > Upload notebook) and run it from the top: the first cell installs the course's
package `attn_course` if it is missing.

Each exercise has three cells: the statement, a scaffold to fill in (replace `...` with your
code) and a check. Run the check after each attempt: it says "correct", what is wrong and a
hint, or "not attempted yet" while the scaffold is untouched.

Hand in the notebook file itself (File > Download .ipynb), with your answers and their
checks run.
"""


def toc_chapters() -> list[pathlib.Path]:
    """The chapter notebooks listed in _toc.yml, in order."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files: list[str] = []

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                files.append(entry["file"])
            walk(entry.get("sections"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    return [ROOT / f"{f}.ipynb" for f in files if (ROOT / f"{f}.ipynb").exists()]


def _show(path: pathlib.Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def tags(cell: dict) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def student_version(nb: dict) -> dict:
    """The notebook without solution cells, outputs, execution counts or widget state."""
    student = copy.deepcopy(nb)
    student["cells"] = [cell for cell in student["cells"] if SOLUTION_TAG not in tags(cell)]
    for cell in student["cells"]:
        cell.get("metadata", {}).pop("execution", None)
        if cell["cell_type"] == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
    student["metadata"].pop("widgets", None)
    return student


def exercises(nb: dict) -> list[dict]:
    """Each exercise: its heading, its check's name and its solution's source."""
    found, heading = [], None
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            match = re.search(r"^#+\s*(Exercise(?!s)\b.*)$", source, re.MULTILINE)
            if match:
                heading = match.group(1).strip()
        elif SOLUTION_TAG in tags(cell):
            # The solution follows its exercise's check (so that "Run all" grades the student's answer).
            if found and found[-1]["solution"] is None:
                found[-1]["solution"] = source
        elif heading and CHECK_CALL.search(source) and not source.lstrip().startswith(("from ", "import ")):
            found.append({"heading": heading, "check": CHECK_CALL.search(source).group(1), "solution": None})
            heading = None
    return found


def _paragraph(nb: dict, label: str) -> str:
    """The text after a bold label such as **Time.** in the chapter's first cell, on one line."""
    first = "".join(nb["cells"][0]["source"])
    match = re.search(rf"\*\*{label}\.?\*\*\.?\s*(.*?)(?:\n\s*\n|\Z)", first, re.DOTALL)
    return " ".join(match.group(1).split()) if match else "(not stated)"


def summary() -> str:
    """Markdown for instructor.md: one block per chapter notebook (listed in _toc.yml or not yet)."""
    lines = []
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        nb = json.loads(path.read_text())
        title = "".join(nb["cells"][0]["source"]).splitlines()[0].lstrip("# ").strip()
        lines += [f"### {title}", "", f"- Notebook: `{path.relative_to(ROOT).as_posix()}`",
                  f"- Time: {_paragraph(nb, 'Time')}", f"- Prerequisites: {_paragraph(nb, 'Prerequisites')}",
                  "- Exercises:"]
        lines += [f"  - {e['heading']}, check `{e['check']}`" for e in exercises(nb)]
        lines.append("")
    return "\n".join(lines)


def solutions_markdown(chapters: list[tuple[pathlib.Path, dict]]) -> str:
    lines = ["# attn-course: solutions (for instructors; do not hand out)", ""]
    for path, nb in chapters:
        title = "".join(nb["cells"][0]["source"]).splitlines()[0].lstrip("# ").strip()
        lines += [f"## {title} (`{path.name}`)", ""]
        for exercise in exercises(nb):
            lines += [f"### {exercise['heading']}", "", f"Check: `{exercise['check']}`", ""]
            if exercise["solution"]:
                lines += ["```python", exercise["solution"].rstrip(), "```", ""]
    return "\n".join(lines) + "\n"


def write_zip(folder: pathlib.Path, archive: pathlib.Path, prefix: str) -> None:
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as bundle:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                bundle.write(path, f"{prefix}/{path.relative_to(folder).as_posix()}")


def build(out: pathlib.Path) -> list[pathlib.Path]:
    student_dir, solutions_dir = out / "student", out / "solutions"
    for folder in (student_dir, solutions_dir):
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
    written, chapters = [], []
    for path in toc_chapters():
        nb = json.loads(path.read_text())
        chapters.append((path, nb))
        student = student_version(nb)
        removed = len(nb["cells"]) - len(student["cells"])
        left = [c for c in student["cells"] if SOLUTION_TAG in tags(c)]
        assert not left, f"{path.name}: solution cells left in the student version"
        target = student_dir / path.name
        target.write_text(json.dumps(student, indent=1, ensure_ascii=False) + "\n")
        shutil.copy2(path, solutions_dir / path.name)
        written.append(target)
        print(f"{_show(target)}: {removed} solution cell(s) removed, "
              f"{len(exercises(nb))} exercise check(s) kept")
    (student_dir / "README.txt").write_text(STUDENT_README)
    (solutions_dir / "SOLUTIONS.md").write_text(solutions_markdown(chapters))
    write_zip(student_dir, out / "attn-course-student.zip", "attn-course-student")
    write_zip(solutions_dir, out / "attn-course-solutions.zip", "attn-course-solutions")
    print(f"student versions: {_show(student_dir)}/ and {_show(out / 'attn-course-student.zip')}")
    print(f"solutions (keep them to yourself): {_show(solutions_dir)}/ and {_show(out / 'attn-course-solutions.zip')}")
    return written


def execute_student(path: pathlib.Path, timeout: int = 900, allow_errors: bool = False, cwd: pathlib.Path | None = None) -> dict:
    """Run a student notebook (in memory; the file is not changed); return each check's printed output.

    Raises CellExecutionError on the first failing cell unless ``allow_errors``.
    """
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=allow_errors,
                            resources={"metadata": {"path": str(cwd or ROOT / "chapters")}})
    client.execute()
    checks = {}
    for cell in nb.cells:
        match = cell.cell_type == "code" and CHECK_CALL.search(cell.source)
        if match and not cell.source.lstrip().startswith(("from ", "import ")):
            text = "".join(
                out.get("text", "") + "".join(out.get("data", {}).get("text/plain", ""))
                for out in cell.get("outputs", [])
            )
            checks[match.group(1)] = text
    return checks




def verdict(text: str) -> str:
    """The status a check printed ("correct", "incorrect", "error", "not attempted"), or "no output"."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    match = re.search(r":\s*(not attempted|incorrect|correct|error)\.\s*$", first)
    return match.group(1) if match else "no output"


def grade(paths: list[pathlib.Path]) -> int:
    print("notebook\tcheck\tstatus")
    for path in paths:
        path = path.resolve()
        checks = execute_student(path, allow_errors=True, cwd=path.parent)
        for name, text in checks.items():
            print(f"{path.name}\t{name}\t{verdict(text)}", flush=True)
    return 0


def check(paths: list[pathlib.Path]) -> int:
    failures = 0
    for path in paths:
        start = time.perf_counter()
        checks = execute_student(path)
        attempted = {name: text for name, text in checks.items() if NOT_ATTEMPTED not in text.lower()}
        status = "ok" if checks and not attempted else "FAILED"
        failures += status != "ok"
        print(f"{path.name}: ran in {time.perf_counter() - start:.0f} s, {len(checks)} check(s) say "
              f"'not attempted yet' [{status}]" + (f" unexpected: {attempted}" if attempted else ""))
    return 1 if failures else 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "_build"), help="folder for student/, solutions/ and the zips")
    parser.add_argument("--check", action="store_true", help="also execute every student notebook")
    parser.add_argument("--summary", action="store_true", help="print the chapters' exercises and checks for instructor.md")
    parser.add_argument("--grade", nargs="+", metavar="NOTEBOOK", help="re-run submitted notebooks and tabulate their checks")
    args = parser.parse_args(argv)
    if args.grade:
        return grade([pathlib.Path(p) for p in args.grade])
    if args.summary:
        print(summary())
        return 0
    written = build(pathlib.Path(args.out).resolve())
    return check(written) if args.check else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
