"""The README is a front door that stays true (issue 18, item 7).

- Its chapter table has one row per chapter of _toc.yml, in that order (plus announced chapters that
  _toc.yml does not list yet); each row's title and time are what the notebook's header says, its
  Colab link opens the notebook that exists at the tag of the package's version, and its page link
  is that notebook's page on the website. The table is written by ``tools/readme_table.py``
  (``make readme``), and ``--check`` fails while it is out of date.
- Every ``make`` target that README.md or CONTRIBUTING.md names exists in the Makefile; every local
  file they link exists; the benchmark options CONTRIBUTING.md lists are the benchmark's options.
- The package example in the README runs and shows what it says.
- Nothing in the repository points at files outside it.

The table's rows are read here with a parser of its own, not the tool's, so that a bug in the tool
does not hide itself.
"""

from __future__ import annotations

import ast
import json
import pathlib
import re
import subprocess
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import readme_table  # noqa: E402  (tools/readme_table.py)

README = (ROOT / "README.md").read_text(encoding="utf-8")
CONTRIBUTING = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())


def _version() -> str:
    tree = ast.parse((ROOT / "attn_course" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("attn_course/__init__.py sets no __version__")


VERSION = _version()
OWNER_REPO = re.fullmatch(r"https://github\.com/([^/]+/[^/]+?)/?", CONFIG["repository"]["url"]).group(1)
OWNER, REPO = OWNER_REPO.split("/")
# html.baseurl where _config.yml sets it, otherwise GitHub Pages for repository.url (the README says so)
SITE = (CONFIG.get("html", {}).get("baseurl") or f"https://{OWNER.lower()}.github.io/{REPO}").rstrip("/") + "/"


def _toc_chapters() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [entry["file"] for part in toc.get("parts", []) for entry in part.get("chapters", [])]
    return [f.split("/", 1)[1] for f in files if f.startswith("chapters/")]


def _header(stem: str) -> str:
    cells = json.loads((ROOT / "chapters" / f"{stem}.ipynb").read_text())["cells"]
    return "".join(cells[0]["source"])


def _table_rows(text: str) -> list[list[str]]:
    """The chapter table's body rows (the lines of the first table whose header starts with '| # |')."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| # |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]])
    return rows


ROWS = _table_rows(README)
ROW_BY_NUMBER = {row[0]: row for row in ROWS}
LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")


def _colab(row) -> str:
    urls = re.findall(r"\((https://colab\.research\.google\.com/github/[^)\s]+)\)", row[4])
    assert len(urls) == 1, f"row {row[0]}: expected one Colab link in the last column, found {urls}"
    return urls[0]


# ---------------------------------------------------------------------------------------------------
# The chapter table

def test_the_table_is_what_the_chapters_say():
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "readme_table.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_chapter_of_the_toc_has_one_row_in_order():
    numbers = [row[0] for row in ROWS]
    assert len(numbers) == len(set(numbers)), f"a chapter has two rows: {numbers}"
    toc = _toc_chapters()
    assert numbers[:len(toc)] == [stem[:2] for stem in toc], "the rows do not follow _toc.yml"
    for row in ROWS[len(toc):]:
        stem = _colab(row).rsplit("/", 1)[1].removesuffix(".ipynb")
        assert stem in readme_table.ANNOUNCED, f"row {row[0]} ({stem}) is neither in _toc.yml nor announced"


@pytest.mark.parametrize("stem", _toc_chapters())
def test_row_title_and_time_match_the_header(stem):
    row = ROW_BY_NUMBER[stem[:2]]
    header = _header(stem)
    heading = header.splitlines()[0]
    titles = LINK.findall(row[1])
    assert len(titles) == 1, f"row {row[0]}: the title should be one link to the chapter's page"
    assert heading == f"# {stem[:2]} · {titles[0][0]}", f"row {row[0]} says {titles[0][0]!r}, the header {heading!r}"

    time = next(" ".join(p.split()) for p in re.split(r"\n\s*\n", header) if p.lstrip().startswith("**Time"))
    cell = row[3]
    study = re.match(r"(\d+) min", cell)
    assert study and re.search(rf"\babout {study.group(1)} minutes\b", time, re.IGNORECASE), (
        f"row {row[0]}: study time {cell!r}, the header says {time!r}")
    extra = re.search(r"\+ (\d+)(?:–(\d+))? min exercises", cell)
    if extra:
        stated = f"{extra.group(1)} to {extra.group(2)}" if extra.group(2) else extra.group(1)
        assert re.search(rf"\bplus {stated} minutes for the\b", time), f"row {row[0]}: {cell!r} against {time!r}"
    else:
        assert not re.search(r"\bplus \d+", time), f"row {row[0]}: {cell!r} leaves out the exercises' time in {time!r}"
    run = re.search(r"runs in (.+?)(?: on (.+))?$", cell)
    assert run, f"row {row[0]}: no run time in {cell!r}"
    claim = rf"runs (?:top to bottom )?in {re.escape(run.group(1))}"
    if run.group(2):
        claim += rf" on {re.escape(run.group(2))}"
    assert re.search(claim, time), f"row {row[0]}: {cell!r}, the header says {time!r}"
    # the header's measured phrase (tools/execute.py writes it), where it has one, is the one quoted
    import execute  # tools/execute.py

    measured = execute.RUN_TIME_PHRASE.search(time)
    if measured:
        assert run.group(1) == f"about {measured['value']} {measured['unit']}", (row[0], cell, measured.group(0))


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row[0])
def test_colab_link_opens_the_notebook_at_the_release_tag(row):
    url = _colab(row)
    match = re.fullmatch(r"https://colab\.research\.google\.com/github/([^/]+/[^/]+)/blob/([^/]+)/(chapters/[\w.-]+\.ipynb)", url)
    assert match, url
    assert match.group(1) == OWNER_REPO, f"{url}: not the repository of _config.yml ({OWNER_REPO})"
    assert match.group(2) == f"v{VERSION}", f"{url}: not the tag of attn_course.__version__ (v{VERSION})"
    path = ROOT / match.group(3)
    assert path.name.startswith(row[0] + "_"), f"row {row[0]} links {path.name}"
    stem = path.stem
    if stem in _toc_chapters():
        assert path.exists(), f"{url}: {match.group(3)} does not exist"
    else:  # announced: its row says so until the notebook exists
        assert path.exists() or "being written" in row[1], f"row {row[0]}: {path.name} does not exist"
    pages = [url for _, url in LINK.findall(row[1])]
    if path.exists():
        assert pages == [f"{SITE}chapters/{stem}.html"], f"row {row[0]}: {pages} is not the page of {stem}"


def test_the_pinned_install_and_site_links_use_the_version_and_repository():
    assert f'pip install "attn-course @ git+https://github.com/{OWNER_REPO}@v{VERSION}"' in README
    assert f"{SITE}instructor.html" in README
    assert f"--branch v{VERSION}" in README


# ---------------------------------------------------------------------------------------------------
# The tool that writes the table, on a repository of its own

def _repo(tmp_path: pathlib.Path, time_line="**Time.** About 45 minutes to read and do the exercises; the notebook runs top to "
                               "bottom in about 20 s on a 2-core CPU.", baseurl=None):
    (tmp_path / "chapters").mkdir(parents=True)
    (tmp_path / "attn_course").mkdir()
    (tmp_path / "attn_course" / "__init__.py").write_text('__version__ = "1.4.2"\n')
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: intro\nparts:\n  - caption: Chapters\n    chapters:\n"
                                       "      - file: chapters/02_simple\n  - caption: Teaching\n    chapters:\n"
                                       "      - file: instructor\n")
    config = "title: x\nrepository:\n  url: https://github.com/Someone/some-course\n  branch: main\n"
    if baseurl:
        config += f"html:\n  use_issues_button: true\n  baseurl: {baseurl}\n"
    (tmp_path / "_config.yml").write_text(config)
    header = f"# 02 · Simple things\n\nWhy.\n\n{time_line}\n"
    (tmp_path / "chapters" / "02_simple.ipynb").write_text(json.dumps(
        {"cells": [{"cell_type": "markdown", "metadata": {}, "source": header.splitlines(keepends=True)}],
         "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    (tmp_path / "README.md").write_text(f"# x\n\n{readme_table.BEGIN}\n{readme_table.END}\n\nmore\n")
    return tmp_path


def test_the_tool_writes_rows_from_the_headers_and_keeps_what_it_teaches(tmp_path):
    root = _repo(tmp_path)
    readme = readme_table.updated_readme((root / "README.md").read_text(), root)
    rows = _table_rows(readme)
    numbers = [row[0] for row in rows]
    assert numbers == ["02"] + [stem[:2] for stem in sorted(readme_table.ANNOUNCED)]
    row = rows[0]
    assert row[1] == "[Simple things](https://someone.github.io/some-course/chapters/02_simple.html)"
    assert row[2] == readme_table.NO_TEACHES
    assert row[3] == "45 min; runs in about 20 s on a 2-core CPU"
    assert "https://colab.research.google.com/github/Someone/some-course/blob/v1.4.2/chapters/02_simple.ipynb" in row[4]
    assert readme.endswith(f"{readme_table.END}\n\nmore\n")
    (root / "README.md").write_text(readme)
    assert any("02" in problem and "teach" in problem for problem in readme_table.problems(root))

    # the hand-written column survives a rewrite, a '|' inside it too; a changed header makes the table stale
    (root / "README.md").write_text(readme.replace(readme_table.NO_TEACHES, "sums \\| products"))
    assert readme_table.problems(root) == []
    header = json.loads((root / "chapters" / "02_simple.ipynb").read_text())
    header["cells"][0]["source"] = [line.replace("20 s", "35 s") for line in header["cells"][0]["source"]]
    (root / "chapters" / "02_simple.ipynb").write_text(json.dumps(header))
    stale = readme_table.problems(root)
    assert len(stale) == 1 and "make readme" in stale[0] and "about 35 s" in stale[0]
    rewritten = readme_table.updated_readme((root / "README.md").read_text(), root)
    assert "| sums \\| products | 45 min; runs in about 35 s on a 2-core CPU |" in rewritten


def test_the_tool_writes_the_times_on_the_pages_and_keeps_the_rest(tmp_path):
    root = _repo(tmp_path)
    (root / "intro.md").write_text("| Chapter | What you build | Reading + exercises | Runs in (CPU) |\n|---|---|---|---|\n"
                                   "| [02 Simple things](chapters/02_simple.ipynb) | sums \\| products | 30 min | about 2 min |\n")
    (root / "instructor.md").write_text(
        "| Chapter | What it teaches | Needs | Student time | Runs in (CPU) |\n|---|---|---|---|---|\n"
        "| 02 · Simple things | sums | nothing | about 30 min | about 2 min |\n\n## Chapter by chapter\n\n"
        "### 02 · Simple things\n\n- Teaches: sums.\n- Time: about 30 minutes; the notebook runs in\n"
        "  about 2 min on a laptop.\n- Exercises:\n  - Exercise 1: sums, check `check_sum`\n\n## Handing out\n")
    pages = readme_table.updated_pages(root)
    intro, instructor = pages["intro.md"][1], pages["instructor.md"][1]
    assert "| [02 Simple things](chapters/02_simple.ipynb) | sums \\| products | 45 min | about 20 s on a 2-core CPU |" in intro
    assert "| 02 · Simple things | sums | nothing | about 45 min | about 20 s on a 2-core CPU |" in instructor
    assert ("- Time: About 45 minutes to read and do the exercises; the notebook runs top to bottom in about 20 s "
            "on a 2-core CPU.\n- Exercises:\n  - Exercise 1: sums, check `check_sum`\n") in instructor
    assert "about 2 min" not in instructor and "## Handing out" in instructor
    (root / "README.md").write_text(readme_table.updated_readme((root / "README.md").read_text(), root)
                                    .replace(readme_table.NO_TEACHES, "sums"))
    stale = readme_table.problems(root)
    assert len(stale) == 2 and all("make readme" in problem for problem in stale)
    for name, (_, text) in pages.items():
        (root / name).write_text(text)
    assert readme_table.problems(root) == []


def test_the_tool_reads_the_site_address_from_the_config_where_it_is_set(tmp_path):
    root = _repo(tmp_path, baseurl="https://course.example.org/attention")
    assert readme_table.site_url(root) == "https://course.example.org/attention/"
    assert readme_table.page_url("02_simple", root) == "https://course.example.org/attention/chapters/02_simple.html"


def test_the_tool_says_what_a_header_lacks(tmp_path):
    root = _repo(tmp_path, time_line="**Time.** About an hour.")
    with pytest.raises(readme_table.TableError, match="no study time"):
        readme_table.updated_readme((root / "README.md").read_text(), root)
    root = _repo(tmp_path / "b", time_line="**Time.** About 45 minutes to read.")
    with pytest.raises(readme_table.TableError, match="no run time"):
        readme_table.updated_readme((root / "README.md").read_text(), root)
    root = _repo(tmp_path / "c", time_line="Forty-five minutes.")
    with pytest.raises(readme_table.TableError, match=r"no '\*\*Time"):
        readme_table.updated_readme((root / "README.md").read_text(), root)
    (root / "chapters" / "02_simple.ipynb").unlink()
    with pytest.raises(readme_table.TableError, match="does not exist"):
        readme_table.updated_readme((root / "README.md").read_text(), root)
    (root / "README.md").write_text("# no markers\n")
    with pytest.raises(readme_table.TableError, match="markers"):
        readme_table.updated_readme("# no markers\n", root)


@pytest.mark.parametrize("paragraph, expected", [
    ("**Time.** About 75 minutes to read and do the four exercises. The notebook runs top to bottom in about\n90 s "
     "on a 2-core CPU; most of that trains small models.", "75 min; runs in about 90 s on a 2-core CPU"),
    ("**Time.** About 60 minutes to read and run, plus 30 to 45 minutes for the exercises. The notebook runs\nin "
     "under a minute on a laptop CPU (it trains five tiny models).",
     "60 min + 30–45 min exercises; runs in under a minute on a laptop CPU"),
    ("**Time.** About 60 minutes to read and run, plus 40 minutes for the three exercises. The notebook runs top "
     "to bottom in about 60 s on a 2-core CPU, most of it training.", "60 min + 40 min exercises; runs in about 60 s on a 2-core CPU"),
    ("**Time.** About 80 minutes. It runs top to bottom in about 60 s on a 2-core CPU with little else running.",
     "80 min; runs in about 60 s on a 2-core CPU"),
    ("**Time.** About 50 minutes; the notebook runs in about twenty seconds on a laptop CPU.",
     "50 min; runs in about twenty seconds on a laptop CPU"),
    ("**Time.** About 12 minutes; runs top to bottom in about 12 min.", "12 min; runs in about 12 min"),
])
def test_time_summary(paragraph, expected):
    assert readme_table.time_summary(" ".join(paragraph.split())) == expected


# ---------------------------------------------------------------------------------------------------
# What the README and CONTRIBUTING name exists

def _make_targets() -> set[str]:
    targets = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        match = re.match(r"^([A-Za-z][\w-]*(?:\s+[A-Za-z][\w-]*)*)\s*:(?!=)", line)
        if match:
            targets.update(match.group(1).split())
    return targets


@pytest.mark.parametrize("name, text", [("README.md", README), ("CONTRIBUTING.md", CONTRIBUTING)], ids=["README", "CONTRIBUTING"])
def test_every_make_target_named_exists(name, text):
    named = set(re.findall(r"`make ([a-z][\w-]*)", text)) | set(re.findall(r"^make ([a-z][\w-]*)", text, re.MULTILINE))
    assert named, f"{name} names no make target"
    missing = named - _make_targets()
    assert not missing, f"{name} names make targets the Makefile lacks: {sorted(missing)}"


def test_make_help_lists_the_targets_the_readme_names():
    help_text = subprocess.run(["make", "--no-print-directory", "help"], cwd=ROOT, capture_output=True, text=True).stdout
    for target in set(re.findall(r"`make ([a-z][\w-]*)", README)) - {"help"}:
        assert f"make {target}" in help_text, f"`make help` does not list make {target}"


@pytest.mark.parametrize("name, text", [("README.md", README), ("CONTRIBUTING.md", CONTRIBUTING)], ids=["README", "CONTRIBUTING"])
def test_local_links_and_paths_exist(name, text):
    links = [url for _, url in LINK.findall(text) if not re.match(r"[a-z]+:", url) and not url.startswith("#")]
    paths = re.findall(r"`((?:tools|tests|attn_course|_static)/[\w./-]+\.(?:py|js|css|cfg))`", text)
    assert links or paths
    missing = [p for p in links + paths if "NN" not in p and not (ROOT / p.split("#")[0]).exists()]
    assert not missing, f"{name} points at files that do not exist: {missing}"


@pytest.mark.parametrize("name, text", [("README.md", README), ("CONTRIBUTING.md", CONTRIBUTING)], ids=["README", "CONTRIBUTING"])
def test_no_stray_html_tags(name, text):
    """A placeholder such as <title> outside a code span is an HTML tag to GitHub: it hides the rest."""
    prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    prose = re.sub(r"(`+)(.+?)\1", "", prose, flags=re.DOTALL)
    prose = re.sub(r"<!--.*?-->|<https?://[^>]+>", "", prose, flags=re.DOTALL)
    tags = re.findall(r"</?[A-Za-z][^>]*>", prose)
    assert not tags, f"{name}: {tags} would be read as HTML; put them in backticks"


def test_the_benchmark_options_contributing_lists_exist():
    bench = (ROOT / "attn_course" / "bench.py").read_text()
    options = set(re.findall(r"add_argument\(\s*\"(--[\w-]+)\"", bench)) | {"--help"}  # argparse adds --help
    section = CONTRIBUTING[CONTRIBUTING.index("## The benchmark"):]
    section = section[:section.index("\n## ", 1)]
    listed = set(re.findall(r"`(--[\w-]+)", section))
    assert {"--gqa", "--mla", "--linear", "--memory"} <= listed
    assert listed <= options, f"CONTRIBUTING.md lists benchmark options that do not exist: {sorted(listed - options)}"


def test_the_package_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README, re.DOTALL)
    assert len(blocks) == 1, "the README has one Python example"
    code = blocks[0]
    assert len([line for line in code.splitlines() if line.strip() and not line.startswith("import")]) <= 5
    printed = []
    namespace = {"print": lambda *args: printed.append(args)}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 (our own README)
    (weights,) = printed[0]
    assert tuple(weights.shape) == (5, 5), "the comment says (L, S)"
    assert bool((weights.triu(1) == 0).all()), "query i has weight only on keys 0..i"


# ---------------------------------------------------------------------------------------------------
# Nothing points outside the repository

def test_nothing_in_the_repository_points_at_files_outside_it():
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: " + listed.stderr.strip())
    outside = re.compile(r"\.\./" + "shared" + r"\b|\bshared/(?:STYLE|REVIEW)\b|\.\./\.\./")
    found = []
    for name in listed.stdout.splitlines():
        path = ROOT / name
        if path.suffix not in {".md", ".py", ".ipynb", ".yml", ".yaml", ".toml", ".txt", ".cfg", ".js", ".css", ""} \
                or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if outside.search(line):
                found.append(f"{name}:{number}: {line.strip()[:120]}")
    assert not found, "files that point outside the repository:\n" + "\n".join(found)
