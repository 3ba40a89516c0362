"""A version that holds still, and licences that agree (issue 18, items 4 and 5).

- The version is set once (``attn_course.__version__``); pyproject.toml, CITATION.cff and every
  chapter's first cell (which installs ``git+<repository.url>@v<version>``) say the same.
- ``tools/release.py`` (``make release VERSION=X.Y.Z``) bumps, syncs, commits and tags: tried in a
  throwaway git repository, never here.
- LICENSE (MIT, the code) and LICENSE-CONTENT (CC BY 4.0, text and figures) hold the standard
  texts; README, pyproject.toml, CITATION.cff and the site's footer name the same licences and authors.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import types

import pytest
import yaml

try:
    import tomllib  # Python 3.11+
except ModuleNotFoundError:  # Python 3.9 and 3.10: the TOML parser pip carries
    from pip._vendor import tomli as tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import readme_table  # noqa: E402
import sync_setup_cells  # noqa: E402  (tools/sync_setup_cells.py)

CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
CITATION = yaml.safe_load((ROOT / "CITATION.cff").read_text())
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# SHA-256 of the CC BY 4.0 legal code as Creative Commons publishes it (legalcode.txt), word for word
# the text of the npm package spdx-license-list 6.12.0 (spdx-full.json, "CC-BY-4.0").
CC_BY_4_LEGAL_CODE_SHA256 = "f5b745ef98087f531e719ee8ca6a96809444573ecc7173c6fa68eaad39b3cc3f"


def _first_cell(path: pathlib.Path) -> str:
    nb = json.loads(path.read_text())
    return "".join(next(c for c in nb["cells"] if c["cell_type"] == "code")["source"])


# ---------------------------------------------------------------------------------------------------
# The version


def test_the_version_is_set_once_and_read_everywhere():
    import attn_course

    version = attn_course.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), f"attn_course.__version__ = {version!r}: not X.Y.Z"
    assert sync_setup_cells.package_version() == version
    project = PYPROJECT["project"]
    if "version" in project:  # a static version would have to be the same
        assert project["version"] == version, f"pyproject.toml says {project['version']}, the package {version}"
    else:
        assert "version" in project.get("dynamic", []), "pyproject.toml has neither a version nor a dynamic one"
        assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "attn_course.__version__"}
    assert str(CITATION["version"]) == version, f"CITATION.cff says {CITATION['version']}, the package {version}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_first_cell_installs_the_release_it_was_written_for(path):
    version = sync_setup_cells.package_version()
    source = _first_cell(path)
    assert f'WRITTEN_FOR = "{version}"' in source, f"{path.name}: first cell not written for {version}; run `make sync`"
    url = CONFIG["repository"]["url"].rstrip("/")
    assert f'"ATTN_COURSE_PIP_SOURCE", f"git+{url}@v{{WRITTEN_FOR}}"' in source, f"{path.name}: does not install the tag"
    assert "if ac.__version__ != WRITTEN_FOR:" in source, f"{path.name}: does not say when another version is imported"


def _release_sandbox(tmp_path: pathlib.Path) -> tuple[pathlib.Path, dict]:
    """A small git repository with the release machinery and two chapters' first cells."""
    root = tmp_path / "repo"
    for relative in ("tools/release.py", "tools/sync_setup_cells.py", "tools/readme_table.py", "attn_course/__init__.py",
                     "_config.yml", "CITATION.cff", "pyproject.toml"):
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / relative, root / relative)
    (root / "chapters").mkdir()
    (root / "_toc.yml").write_text("format: jb-book\nroot: intro\nchapters:\n  - file: chapters/01_a\n  - file: chapters/02_b\n")
    (root / "README.md").write_text(f"# A course\n\n{readme_table.BEGIN}\n{readme_table.END}\n")
    for name in ("01_a.ipynb", "02_b.ipynb"):
        header = (f"# {name[:2]} · A chapter\n\n**Time.** About 30 minutes to read and do the exercises; the notebook "
                  "runs top to bottom in about 20 s on a 2-core CPU.\n")
        nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": [header]},
                        {"cell_type": "code", "execution_count": 1, "metadata": {}, "outputs": [],
                         "source": [f"{sync_setup_cells.MARKER} (an old template)\n", "import attn_course as ac"]}],
              "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
        (root / "chapters" / name).write_text(json.dumps(nb, indent=1) + "\n")
    env = {**os.environ, "GIT_AUTHOR_NAME": "Test", "GIT_AUTHOR_EMAIL": "test@example.org",
           "GIT_COMMITTER_NAME": "Test", "GIT_COMMITTER_EMAIL": "test@example.org", "GIT_CONFIG_GLOBAL": os.devnull}
    for command in (["init", "--quiet", "--initial-branch=main"], ["add", "."], ["commit", "--quiet", "-m", "start"]):
        subprocess.run(["git", *command], cwd=root, env=env, check=True, capture_output=True)
    return root, env


def _release(root: pathlib.Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(root / "tools" / "release.py"), *args], cwd=root, env=env,
                          capture_output=True, text=True)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_release_bumps_syncs_commits_and_tags(tmp_path):
    root, env = _release_sandbox(tmp_path)
    git = lambda *a: subprocess.run(["git", *a], cwd=root, env=env, capture_output=True, text=True).stdout.strip()  # noqa: E731

    for bad in ("1.2", "v1.2.3", "1.2.3rc1", "01.2.3"):
        result = _release(root, env, bad)
        assert result.returncode == 2 and "VERSION must be X.Y.Z" in result.stderr and repr(bad) in result.stderr, bad
    committed = (root / "pyproject.toml").read_text()
    (root / "pyproject.toml").write_text(committed + "\n# uncommitted\n")
    result = _release(root, env, "9.8.7")
    assert result.returncode == 1 and "uncommitted changes" in result.stderr and not git("tag", "--list")
    (root / "pyproject.toml").write_text(committed)

    result = _release(root, env, "9.8.7")
    assert result.returncode == 0, result.stdout + result.stderr
    assert '__version__ = "9.8.7"' in (root / "attn_course" / "__init__.py").read_text()
    citation = yaml.safe_load((root / "CITATION.cff").read_text())
    assert str(citation["version"]) == "9.8.7" and re.fullmatch(r"\d{4}-\d{2}-\d{2}", str(citation["date-released"]))
    for chapter in (root / "chapters").glob("*.ipynb"):
        assert 'WRITTEN_FOR = "9.8.7"' in _first_cell(chapter), chapter.name
    readme = (root / "README.md").read_text()
    assert readme.count("/blob/v9.8.7/chapters/") == 2, "README.md's Colab links do not open the notebooks at the new tag"
    assert git("log", "-1", "--format=%s") == "Release v9.8.7"
    assert git("status", "--porcelain") == "", "the release left files uncommitted"
    assert git("rev-parse", "v9.8.7^{commit}") == git("rev-parse", "HEAD"), "the tag is not on the release commit"
    assert git("cat-file", "-t", "v9.8.7") == "tag", "not an annotated tag"

    result = _release(root, env, "9.8.7")
    assert result.returncode == 1 and "exists already" in result.stderr


# ---------------------------------------------------------------------------------------------------
# Licences and citation


def test_licence_files_hold_the_standard_texts():
    mit = (ROOT / "LICENSE").read_text()
    assert mit.startswith("MIT License\n\nCopyright (c) ") and "The attn-course authors" in mit.splitlines()[2]
    words = " ".join(mit.split())
    for sentence in ("Permission is hereby granted, free of charge, to any person obtaining a copy",
                     "The above copyright notice and this permission notice shall be included in all copies or "
                     "substantial portions of the Software.", 'THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND'):
        assert sentence in words, sentence
    content = (ROOT / "LICENSE-CONTENT").read_text()
    legal_code = content[content.index("Attribution 4.0 International\n\n="):]
    assert hashlib.sha256(legal_code.encode()).hexdigest() == CC_BY_4_LEGAL_CODE_SHA256, \
        "LICENSE-CONTENT's CC BY 4.0 legal code is not the published text"
    assert "see LICENSE" in content[: content.index(legal_code[:40])], "LICENSE-CONTENT does not say what LICENSE covers"


def test_licences_and_authors_agree_everywhere():
    author = CONFIG["author"]
    assert [a.get("name") for a in CITATION["authors"]] == [author], "CITATION.cff's authors are not _config.yml's author"
    assert str(CITATION["cff-version"]) == "1.2.0"
    assert CITATION["license"] == ["MIT", "CC-BY-4.0"]
    assert CITATION["repository-code"].rstrip("/") == CONFIG["repository"]["url"].rstrip("/")
    assert PYPROJECT["project"]["license"] == "MIT" and "LICENSE" in PYPROJECT["project"]["license-files"]
    assert [a["name"] for a in PYPROJECT["project"]["authors"]] == [author]
    readme = (ROOT / "README.md").read_text()
    for needle in ("MIT", "CC BY 4.0", "LICENSE-CONTENT", "CITATION.cff"):
        assert needle in readme, f"README.md does not mention {needle}"


def test_the_site_footer_names_the_licences_and_authors():
    pytest.importorskip("sphinx")
    import site_assets  # tools/site_assets.py (a Sphinx extension)

    url = CONFIG["repository"]["url"].rstrip("/")
    config = types.SimpleNamespace(html_theme_options={"repository_url": url, "repository_branch": "main"})
    site_assets._footer(config)
    footer = config.html_theme_options["extra_footer"]
    assert CONFIG["author"] == "The attn-course authors"  # the theme shows "By <author>" above the footer
    for needle in ("MIT", "CC BY 4.0", f"{url}/blob/main/LICENSE\"",
                   f"{url}/blob/main/LICENSE-CONTENT\"", f"{url}/blob/main/CITATION.cff\""):
        assert needle in footer, f"the footer does not say {needle!r}: {footer}"
    for name in ("LICENSE", "LICENSE-CONTENT", "CITATION.cff"):
        assert (ROOT / name).is_file(), f"the footer links to {name}, which does not exist"
