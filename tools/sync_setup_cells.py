"""Write every chapter's first code cell from one template, with the repository URL of _config.yml.

The first cell of a chapter makes it self-sufficient: on Colab (or anywhere attn_course is missing)
it installs the package, from $ATTN_COURSE_PIP_SOURCE when that is set, otherwise the release the
notebook was written for, `git+<repository.url>@v<version>` (the tag of `attn_course.__version__`).
In a clone of the repository it uses the clone. When the attn_course it imports has another version
it says so in one line (and goes on). Run `make sync` after changing `repository.url` in _config.yml
or the version in attn_course/__init__.py; a test checks that every chapter's first cell matches
this template.

Usage: python tools/sync_setup_cells.py [--check] [chapters/NN_name.ipynb ...]
"""

from __future__ import annotations

import ast
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
MARKER = "# Setup: runs everywhere"


def repository_url() -> str:
    import yaml

    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    return config["repository"]["url"].rstrip("/")


def package_version() -> str:
    """``attn_course.__version__``, read from the source without importing the package (or torch)."""
    tree = ast.parse((ROOT / "attn_course" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            return ast.literal_eval(node.value)
    raise SystemExit("attn_course/__init__.py sets no __version__")


def setup_cell_source(url: str | None = None, version: str | None = None) -> str:
    url = url or repository_url()
    version = version or package_version()
    return f'''{MARKER} (local, Colab, Binder). Installs attn_course only where it is missing.
import importlib.util, os, subprocess, sys
WRITTEN_FOR = "{version}"  # the attn_course release this notebook was written for (tag v{version})
if importlib.util.find_spec("attn_course") is None and os.path.isdir("../attn_course"):
    sys.path.insert(0, os.path.abspath(".."))  # a clone of the repository: use it as it is
if importlib.util.find_spec("attn_course") is None:  # Colab, or a notebook downloaded alone
    source = os.environ.get("ATTN_COURSE_PIP_SOURCE", f"git+{url}@v{{WRITTEN_FOR}}")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", source], check=True)

import matplotlib.pyplot as plt
import torch
import attn_course as ac

if ac.__version__ != WRITTEN_FOR:
    print(f"Note: this notebook was written for attn_course {{WRITTEN_FOR}}; the installed one is {{ac.__version__}}.")
device = ac.get_device()  # CUDA, then Apple MPS, then the CPU
ac.set_seed(0)
torch.set_printoptions(precision=3, sci_mode=False)
print(f"attn_course {{ac.__version__}}, torch {{torch.__version__}}, device: {{device}}")'''


def first_code_cell(nb: dict) -> dict | None:
    return next((c for c in nb["cells"] if c["cell_type"] == "code"), None)


def sync(path: pathlib.Path, source: str, check: bool) -> bool:
    """Return True when the chapter's first cell is (now) the template."""
    nb = json.loads(path.read_text())
    cell = first_code_cell(nb)
    if cell is None:
        raise SystemExit(f"{path}: has no code cell")
    current = "".join(cell["source"])
    if current == source:
        return True
    if not current.startswith(MARKER):
        raise SystemExit(f"{path}: the first code cell must start with {MARKER!r}")
    if check:
        return False
    cell["source"] = source.splitlines(keepends=True)
    tags = cell.setdefault("metadata", {}).setdefault("tags", [])
    if "nbval-ignore-output" not in tags:  # it prints versions and the device, which vary
        tags.append("nbval-ignore-output")
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    print(f"updated {path}")
    return True


def main(argv: list[str]) -> int:
    check = "--check" in argv
    paths = [pathlib.Path(a) for a in argv if not a.startswith("--")] or sorted((ROOT / "chapters").glob("*.ipynb"))
    source = setup_cell_source()
    stale = [p for p in paths if not sync(p, source, check)]
    for p in stale:
        print(f"{p}: first cell differs from the template; run `make sync`")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
