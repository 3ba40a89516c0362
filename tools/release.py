"""Make a release: set the version everywhere, rewrite the chapters' first cells, commit, tag vX.Y.Z.

The version is set in one place, ``__version__`` in ``attn_course/__init__.py``; pyproject.toml reads
it (setuptools' dynamic version), every chapter's first cell installs ``git+<repository.url>@v<version>``
(``tools/sync_setup_cells.py``), and CITATION.cff carries it with its release date. This script:

1. checks VERSION (X.Y.Z), that the tag vX.Y.Z does not exist yet, and that no tracked file has
   uncommitted changes (the release commit must hold exactly what was tested);
2. writes the version into attn_course/__init__.py and CITATION.cff (with today's date), and rewrites
   the first cell of every chapter (the same as ``make sync``), and README.md's chapter table, whose
   Colab links open the notebooks at the tag (the same as ``make readme``);
3. commits those files ("Release vX.Y.Z"; nothing to commit when they already say X.Y.Z) and creates
   the annotated tag vX.Y.Z on that commit.

It pushes nothing: push the commit and the tag yourself (``git push origin main vX.Y.Z``); the
notebooks' first cells and the Colab links of a pinned course resolve only once the tag is public.

Usage: python tools/release.py X.Y.Z [--dry-run]      (``make release VERSION=X.Y.Z``)
"""

from __future__ import annotations

import datetime
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import readme_table  # noqa: E402  (tools/readme_table.py)
import sync_setup_cells  # noqa: E402  (tools/sync_setup_cells.py)

PACKAGE_INIT = ROOT / "attn_course" / "__init__.py"
CITATION = ROOT / "CITATION.cff"
VERSION_PATTERN = re.compile(r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$")


def git(*args: str, check: bool = True) -> str:
    result = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise SystemExit(f"git {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout.strip()


def set_package_version(version: str) -> None:
    text = PACKAGE_INIT.read_text()
    new, count = re.subn(r'^__version__ = "[^"]*"', f'__version__ = "{version}"', text, count=1, flags=re.M)
    if count != 1:
        raise SystemExit(f"{PACKAGE_INIT}: no line `__version__ = \"...\"` to update")
    PACKAGE_INIT.write_text(new)


def set_citation(version: str, date: str) -> None:
    text = CITATION.read_text()
    for key, value in (("version", version), ("date-released", date)):
        text, count = re.subn(rf"^{key}: .*$", f"{key}: {value}", text, count=1, flags=re.M)
        if count != 1:
            raise SystemExit(f"{CITATION}: no top-level `{key}:` line to update")
    CITATION.write_text(text)


def main(argv: list[str]) -> int:
    dry_run = "--dry-run" in argv
    args = [a for a in argv if not a.startswith("--")]
    if len(args) != 1 or not VERSION_PATTERN.match(args[0]):
        got = args[0] if len(args) == 1 else " ".join(args) or "nothing"
        print(f"VERSION must be X.Y.Z (three numbers, e.g. 0.3.0), got {got!r}", file=sys.stderr)
        print("usage: python tools/release.py X.Y.Z [--dry-run]   (make release VERSION=X.Y.Z)", file=sys.stderr)
        return 2
    version = args[0]
    tag = f"v{version}"
    if git("tag", "--list", tag):
        print(f"the tag {tag} exists already; pick another version", file=sys.stderr)
        return 1
    dirty = git("status", "--porcelain", "--untracked-files=no")
    if dirty:
        print(f"uncommitted changes to tracked files; commit them first, so that {tag} holds what you tested:\n{dirty}",
              file=sys.stderr)
        return 1
    current = sync_setup_cells.package_version()
    date = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    chapters = sorted((ROOT / "chapters").glob("*.ipynb"))
    print(f"release {tag}: attn_course {current} -> {version}, CITATION.cff date-released {date}, "
          f"first cells of {len(chapters)} chapters")
    if dry_run:
        return 0
    set_package_version(version)
    set_citation(version, date)
    if sync_setup_cells.main([str(c) for c in chapters]) != 0:
        raise SystemExit("could not rewrite the chapters' first cells")
    if readme_table.main([]) != 0:
        raise SystemExit("could not rewrite README.md's chapter table")
    pages = [ROOT / "README.md", *(ROOT / name for name in readme_table.PAGES if (ROOT / name).exists())]
    paths = [str(p.relative_to(ROOT)) for p in (PACKAGE_INIT, CITATION, *chapters, *pages)]
    if git("status", "--porcelain", "--", *paths):
        git("add", "--", *paths)
        git("commit", "--quiet", "-m", f"Release {tag}", "--", *paths)
    git("tag", "--annotate", tag, "--message", f"attn-course {version}")
    print(f"tagged {git('rev-parse', '--short', 'HEAD')} as {tag}; publish it with: git push origin HEAD {tag}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
