"""Execute chapters in place, as `make book` and nbval will, store outputs and widget state, and check
that what nbval will compare is the same on another numerical path.

Notebooks are committed executed (so that GitHub and Colab show the figures). Run this after
editing a chapter: it runs the notebook top to bottom from the chapters/ folder, keeps the
widgets' state (so that explorables work on the static site), and prints the run time that the
notebook now records (the cells' ``metadata.execution`` timestamps) in the words the chapter's
header uses for it ("runs top to bottom in about 55 s on a 2-core CPU"): copy it into the header's
**Time** line (tests/test_notebook_rules.py keeps the two within reach of each other).

Then it runs the chapter a second time on the scalar CPU kernels with one thread
(``ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1``, the second pass of ``make test``) and compares
the outputs of every cell that nbval compares (every code cell not tagged ``nbval-ignore-output``
or ``nbval-skip``) exactly as nbval compares them: with nbval's own functions for reading
``tests/nbval_sanitize.cfg``, sanitising and merging streams (``compared_outputs``). A cell whose output
differs prints something that depends on the machine (the digits of a trained model's score, which
sentences it gets wrong, a timing): the next machine, and CI, would fail on it. The script lists
those cells and exits with status 1; the executed notebook is written either way. Make such a cell
print what holds on every machine (see "Outputs that hold on every machine" in CONTRIBUTING.md).

Usage: python tools/execute.py [--no-check] chapters/02_simple_self_attention.ipynb [...]
"""

from __future__ import annotations

import copy
import os
import pathlib
import re
import sys
import time
from collections import OrderedDict, defaultdict

import nbformat
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parent.parent
OTHER_PATH = {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"}


def execute(nb, path: pathlib.Path, env: dict | None = None, timeout: int = 900) -> float:
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", store_widget_state=True,
        resources={"metadata": {"path": str(path.parent)}},
    )
    start = time.perf_counter()
    client.execute(**({"env": env} if env is not None else {}))
    return time.perf_counter() - start


# What nbval compares, by nbval's own code (nbval.plugin, the version in .venv): the sanitizing file
# read by nbval's parser (``get_sanitize_patterns``: each "regex:" line is taken whole, up to the end
# of the line, trailing spaces included; configparser would strip them), the patterns applied in
# file order with ``re.sub``, stream chunks merged (``coalesce_streams``, which also resolves \r and
# \b), and every output key and MIME type compared except those nbval skips without --nbdime.
SANITIZE_FILE = ROOT / "tests" / "nbval_sanitize.cfg"
NBVAL_SKIP_COMPARE = ("metadata", "traceback", "prompt_number", "output_type", "name", "execution_count",
                      "application/vnd.jupyter.widget-view+json", "image/png", "image/jpeg")


def sanitize_patterns(path: pathlib.Path = SANITIZE_FILE) -> "OrderedDict[str, str]":
    """The (regex, replacement) pairs as nbval reads them (``--nbval-sanitize-with path``)."""
    from nbval.plugin import get_sanitize_patterns

    patterns: OrderedDict[str, str] = OrderedDict()  # nbval's IPyNbFile.sanitize_patterns
    patterns.update(get_sanitize_patterns(pathlib.Path(path).read_text()))
    return patterns


def sanitize(text, patterns) -> str:
    """nbval's IPyNbCell.sanitize: every pattern in turn, with re.sub; anything but a string as it is."""
    if not isinstance(text, str):
        return text
    for regex, replacement in patterns.items():
        text = re.sub(regex, replacement, text)
    return text


def compared_outputs(outputs, patterns) -> dict:
    """What nbval compares of a cell's outputs (IPyNbCell.compare_outputs): for each output key and
    MIME type that nbval does not skip, the list of sanitised values in order. Two cells pass nbval's
    comparison exactly when these are equal."""
    from nbval.plugin import coalesce_streams, transform_streams_for_comparison

    outputs = transform_streams_for_comparison(coalesce_streams(copy.deepcopy(list(outputs))))
    compared: dict[str, list] = {}
    for output in outputs:
        for key, value in output.items():
            if key in NBVAL_SKIP_COMPARE:
                continue
            if key == "data":
                for mime, content in value.items():
                    if mime not in NBVAL_SKIP_COMPARE:
                        compared.setdefault(mime, []).append(sanitize(content, patterns))
            else:
                compared.setdefault(key, []).append(sanitize(value, patterns))
    return compared


def compared_by_nbval(cell) -> bool:
    """Whether nbval (run with --nbval) compares this code cell's outputs: its tags and comment markers."""
    from nbval.plugin import find_comment_markers, find_metadata_tags

    options = defaultdict(bool, find_metadata_tags(cell.get("metadata", {})))
    options.update(find_comment_markers(cell.get("source", "")))
    options.setdefault("check", True)
    return bool(options["check"]) and not options["skip"] and cell.get("execution_count") is not None


def differing_cells(first, second) -> list[int]:
    """Numbers (as nbval counts them: code cells from 0) of the compared cells whose outputs differ."""
    patterns = sanitize_patterns()
    code_first = [c for c in first.cells if c.cell_type == "code"]
    code_second = [c for c in second.cells if c.cell_type == "code"]
    return [
        number for number, (a, b) in enumerate(zip(code_first, code_second))
        if compared_by_nbval(a)
        and compared_outputs(a.get("outputs", []), patterns) != compared_outputs(b.get("outputs", []), patterns)
    ]


# The run time a chapter states: its header's **Time** paragraph says "runs top to bottom in about
# N s on <machine>" (or "about N min"), and tests/test_notebook_rules.py keeps N within
# RUN_TIME_TOLERANCE of the time the committed notebook records.
RUN_TIME_PHRASE = re.compile(r"runs\s+top\s+to\s+bottom\s+in\s+about\s+(?P<value>\d+(?:\.\d+)?)\s+(?P<unit>s|min)\b"
                             r"(?P<machine>\s+on\s+[^.;(]+)?")
RUN_TIME_TOLERANCE = (0.67, 1.5)  # stated / recorded


def recorded_seconds(nb) -> float | None:
    """Seconds from the first code cell's start to the last one's reply, as nbclient recorded them
    (``metadata.execution``: ``iopub.execute_input`` and ``shell.execute_reply``); None without a record."""
    import datetime

    def moment(cell, key):
        stamp = cell.get("metadata", {}).get("execution", {}).get(key)
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")) if stamp else None

    code = [cell for cell in nb["cells"] if cell["cell_type"] == "code"]
    if not code:
        return None
    start, end = moment(code[0], "iopub.execute_input"), moment(code[-1], "shell.execute_reply")
    return (end - start).total_seconds() if start and end else None


def run_time_phrase(seconds: float, machine: str | None = None) -> str:
    """The header's words for a recorded run time: about 55 s, about 130 s, about 12 min."""
    if machine is None:
        machine = f"a {os.cpu_count() or 1}-core CPU"
    if seconds < 100:
        value, unit = max(5, 5 * round(seconds / 5)), "s"
    elif seconds < 600:
        value, unit = 10 * round(seconds / 10), "s"
    else:
        value, unit = round(seconds / 60), "min"
    return f"runs top to bottom in about {value} {unit} on {machine}"


def stated_seconds(match: re.Match) -> float:
    return float(match["value"]) * (60 if match["unit"] == "min" else 1)


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
        recorded = recorded_seconds(nb)
        if recorded is None:
            print(f"{path}: executed in {elapsed:.1f} s (the notebook records no cell times)", flush=True)
        else:
            print(f"{path}: executed in {elapsed:.1f} s; the notebook records {recorded:.1f} s from its first cell to "
                  f"its last. For the header's **Time** line: \"{run_time_phrase(recorded)}\"", flush=True)
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
