"""Execute chapters in place, as `make book` and nbval will, and store outputs and widget state.

Notebooks are committed executed (so that GitHub and Colab show the figures). Run this after
editing a chapter: it runs the notebook top to bottom from the chapters/ folder, keeps the
widgets' state (so that explorables work on the static site), and prints the time it took.

Usage: python tools/execute.py chapters/02_simple_self_attention.ipynb [...]
"""

from __future__ import annotations

import pathlib
import sys
import time

import nbformat
from nbclient import NotebookClient


def execute(path: pathlib.Path, timeout: int = 900) -> float:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", store_widget_state=True,
        resources={"metadata": {"path": str(path.parent)}},
    )
    start = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - start
    nbformat.write(nb, path)
    return elapsed


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    for arg in argv:
        path = pathlib.Path(arg)
        print(f"{path}: executed in {execute(path):.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
