"""Keep every chapter's solution cells where they cannot overwrite the student's answer.

An exercise is a statement, a scaffold (``...  # your code here``), a check cell and then the
solution. The solution comes *after* the check, so that "Run all" grades what the student wrote
before the solution redefines the same name; and it is collapsed wherever the notebook is opened:

- on the website: the tag ``hide-input`` (with ``solution``, which the student versions remove);
- in JupyterLab and Notebook 7: the cell metadata ``jupyter.source_hidden``;
- in Colab: the form view (``cellView: form`` and a first line ``#@title ...``), which shows the
  title and hides the code until the reader double-clicks it.

The solution cell ends with the exercise's check called on the solution, so readers of the site see
it pass.

Usage: python tools/solution_cells.py [--check] [chapters/NN_name.ipynb ...]
Without paths it treats every chapter. ``--check`` changes nothing and exits 1 (listing the cells)
where a chapter does not follow the rules; without it, the chapters are rewritten to follow them
(move each solution after its check, add the metadata and the title line; execute them again
afterwards with tools/execute.py).
"""

from __future__ import annotations

import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
TITLE = "#@title Solution (double-click to show the code)"
CHECK_CALL = re.compile(r"^\s*(check_\w+)\s*\(", re.MULTILINE)


def _source(cell) -> str:
    return "".join(cell["source"])


def _tags(cell) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def _is_check(cell) -> bool:
    source = _source(cell)
    return (cell["cell_type"] == "code" and "solution" not in _tags(cell) and bool(CHECK_CALL.search(source))
            and not source.lstrip().startswith(("from ", "import ")))


def problems(nb: dict) -> list[str]:
    """What is wrong with the solution cells of one notebook (empty when nothing is)."""
    found = []
    cells = nb["cells"]
    for index, cell in enumerate(cells):
        if "solution" not in _tags(cell):
            continue
        source = _source(cell)
        where = f"cell {index}"
        if "hide-input" not in _tags(cell):
            found.append(f"{where}: no hide-input tag (the site would show the solution)")
        if not cell.get("metadata", {}).get("jupyter", {}).get("source_hidden"):
            found.append(f"{where}: no jupyter.source_hidden metadata (JupyterLab would show the solution)")
        if cell.get("metadata", {}).get("cellView") != "form" or not source.startswith("#@title"):
            found.append(f"{where}: not in Colab's form view (cellView: form and a first line '#@title ...')")
        previous = next((c for c in reversed(cells[:index]) if c["cell_type"] == "code"), None)
        if previous is None or not (_is_check(previous) or "solution" in _tags(previous)):
            found.append(f"{where}: does not follow its exercise's check ('Run all' would grade the solution)")
        elif _is_check(previous) and CHECK_CALL.search(_source(previous)).group(1) not in source:
            found.append(f"{where}: does not end with {CHECK_CALL.search(_source(previous)).group(1)}(...) on the solution")
    return found


def fix(nb: dict) -> dict:
    """Move each solution after the check that follows it, and add the metadata and the title line."""
    cells = nb["cells"]
    index = 0
    while index < len(cells):
        cell = cells[index]
        if "solution" in _tags(cell):
            following = next((j for j in range(index + 1, len(cells)) if cells[j]["cell_type"] == "code"), None)
            if following is not None and _is_check(cells[following]):
                check = cells.pop(following)
                cells.insert(index, check)
                index += 1  # the solution now sits one further down
                call = _source(check).strip()
                if CHECK_CALL.search(call).group(1) not in _source(cell):
                    cell["source"] = _source(cell).rstrip("\n") + "\n\n" + call
            metadata = cell.setdefault("metadata", {})
            metadata.setdefault("jupyter", {})["source_hidden"] = True
            metadata["cellView"] = "form"
            for tag in ("hide-input",):
                if tag not in metadata.setdefault("tags", []):
                    metadata["tags"].append(tag)
            if not _source(cell).startswith("#@title"):
                cell["source"] = TITLE + "\n" + _source(cell)
        index += 1
    return nb


def main(argv: list[str]) -> int:
    check_only = "--check" in argv
    paths = [pathlib.Path(a) for a in argv if a != "--check"] or sorted((ROOT / "chapters").glob("*.ipynb"))
    status = 0
    for path in paths:
        nb = json.loads(path.read_text())
        if check_only:
            for problem in problems(nb):
                print(f"{path.name}: {problem}")
                status = 1
        else:
            path.write_text(json.dumps(fix(nb), indent=1, ensure_ascii=False) + "\n")
            left = problems(nb)
            print(f"{path.name}: " + ("; ".join(left) if left else "solutions after their checks, collapsed everywhere"))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
