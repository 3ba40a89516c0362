"""Execute chapters in place, as `make book` and nbval will, store outputs and widget state, and check
that what nbval will compare is the same on another numerical path.

Notebooks are committed executed (so that GitHub and Colab show the figures). Run this after
editing a chapter: it runs the notebook top to bottom from the chapters/ folder, keeps the
widgets' state (so that explorables work on the static site), and prints the time it took.

Then it runs the chapter a second time on the scalar CPU kernels with one thread
(``ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1``, the second pass of ``make test``) and compares
the text outputs of every cell that nbval compares (every code cell not tagged
``nbval-ignore-output`` or ``nbval-skip``), after the same sanitising as nbval. A cell whose output
differs prints something that depends on the machine (the digits of a trained model's score, which
sentences it gets wrong, a timing): the next machine, and CI, would fail on it. The script lists
those cells and exits with status 1; the executed notebook is written either way. Make such a cell
print what holds on every machine (see "Writing a chapter" in README.md).

Usage: python tools/execute.py [--no-check] chapters/02_simple_self_attention.ipynb [...]
"""

from __future__ import annotations

import configparser
import copy
import os
import pathlib
import re
import sys
import time

import nbformat
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parent.parent
OTHER_PATH = {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"}
IGNORED_TAGS = {"nbval-ignore-output", "nbval-skip"}


def execute(nb, path: pathlib.Path, env: dict | None = None, timeout: int = 900) -> float:
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", store_widget_state=True,
        resources={"metadata": {"path": str(path.parent)}},
    )
    start = time.perf_counter()
    client.execute(**({"env": env} if env is not None else {}))
    return time.perf_counter() - start


def _sanitizers() -> list[tuple[re.Pattern, str]]:
    parser = configparser.ConfigParser()
    parser.read(ROOT / "tests" / "nbval_sanitize.cfg")
    return [(re.compile(parser[s]["regex"]), parser[s]["replace"]) for s in parser.sections()]


def compared_text(cell, sanitizers) -> str:
    """The text nbval compares for one cell: streams and text/plain of results, sanitised."""
    parts = []
    streams = {}  # nbval merges the chunks of each stream (coalesce_streams): so do we
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            if output.name not in streams:
                streams[output.name] = len(parts)
                parts.append(f"{output.name}: ")
            parts[streams[output.name]] += output.text
        elif output.output_type in ("execute_result", "display_data"):
            data = output.get("data", {})
            if "text/plain" in data and not any(k.startswith("image/") or "widget" in k for k in data):
                parts.append(data["text/plain"])
        elif output.output_type == "error":
            parts.append(f"error: {output.ename}")
    text = "".join(parts)
    for pattern, replacement in sanitizers:
        text = pattern.sub(replacement, text)
    return text


def differing_cells(first, second) -> list[int]:
    """Numbers (as nbval counts them: code cells from 0) of the compared cells whose outputs differ."""
    sanitizers = _sanitizers()
    code_first = [c for c in first.cells if c.cell_type == "code"]
    code_second = [c for c in second.cells if c.cell_type == "code"]
    return [
        number for number, (a, b) in enumerate(zip(code_first, code_second))
        if not IGNORED_TAGS & set(a.metadata.get("tags", []))
        and compared_text(a, sanitizers) != compared_text(b, sanitizers)
    ]


def main(argv: list[str]) -> int:
    check = "--no-check" not in argv
    paths = [pathlib.Path(arg) for arg in argv if arg != "--no-check"]
    if not paths:
        print(__doc__)
        return 2
    status = 0
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        source = copy.deepcopy(nb)
        elapsed = execute(nb, path)
        nbformat.write(nb, path)
        print(f"{path}: executed in {elapsed:.1f} s", flush=True)
        if not check:
            continue
        other = copy.deepcopy(source)
        elapsed = execute(other, path, env={**os.environ, **OTHER_PATH})
        differ = differing_cells(nb, other)
        if differ:
            status = 1
            print(f"{path}: run again with {OTHER_PATH} ({elapsed:.1f} s), the output of compared cell(s) "
                  f"{', '.join(map(str, differ))} (nbval's 'Cell N') changed: that output depends on the machine. "
                  "Print what holds on every machine, or tag the cell nbval-ignore-output and assert its lesson.",
                  flush=True)
        else:
            print(f"{path}: same compared outputs with {OTHER_PATH} ({elapsed:.1f} s)", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
