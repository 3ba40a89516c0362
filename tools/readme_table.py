"""Write the chapter table of README.md from the chapters themselves, or check that it is current.

Every row is made from one chapter notebook's header (its first cell): the number and title from the
heading ``# NN · Title``, the time from its **Time.** paragraph (the study time and the run time, as
the header states them), the page on the website and an "Open in Colab" link to the notebook at the
release tag ``v<attn_course.__version__>``. Only the "What it teaches" column is written by hand, in
README.md itself: the tool keeps each chapter's text there and asks for one where a chapter has none.

Chapters come from ``_toc.yml``, in its order, then those announced in ``ANNOUNCED`` below that it
does not list yet: from the announcement while the notebook does not exist (the row says "being
written"), from the notebook's header once it does. Delete a chapter's entry once _toc.yml lists it.

The website's address is ``html.baseurl`` in ``_config.yml`` where it is set, otherwise GitHub Pages
for ``repository.url`` (``https://github.com/OWNER/REPO`` is served at ``https://OWNER.github.io/REPO/``).

The same times appear on two pages of the book, and the tool writes them there too: the columns of
study and run time of the chapter tables in ``intro.md`` and ``instructor.md`` (the other columns are
written by hand), and each chapter block's ``- Time:`` line on ``instructor.md`` (the header's Time
paragraph itself). A page the repository lacks is skipped.

Usage:
    python3 tools/readme_table.py            rewrite the table in README.md and the times on the pages (make readme)
    python3 tools/readme_table.py --check    exit 1, showing the difference, unless all of them are current
    python3 tools/readme_table.py --print    print the table

Plain Python 3.9+, no packages: it reads the notebooks as JSON and the YAML files with regular expressions.
"""

from __future__ import annotations

import argparse
import difflib
import json
import pathlib
import re
import sys
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

BEGIN = ("<!-- chapter table: written by tools/readme_table.py from the chapters' headers (`make readme`); "
         "edit only the \"What it teaches\" column here -->")
END = "<!-- end of the chapter table -->"
HEADER = ("| # | Chapter (on the website) | What it teaches | Time: study; run | Notebook |\n"
          "|:-:|---|---|---|:-:|")
NO_TEACHES = "WRITE ONE LINE: what this chapter teaches"
COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"


@dataclass(frozen=True)
class Announced:
    """A chapter that is being written: its row until its notebook exists."""

    title: str
    teaches: str
    time: str


# Chapters announced but not written yet, until _toc.yml lists them (once a notebook exists, its header is the source).
# Example: "13_x": Announced(title=..., teaches=..., time="planned: runs in about a minute on a 2-core CPU").
ANNOUNCED: dict[str, Announced] = {}


@dataclass(frozen=True)
class Row:
    number: str
    stem: str
    title: str
    time: str
    teaches: str
    written: bool  # False: announced, its notebook does not exist yet


class TableError(Exception):
    """Something in a chapter or in the configuration that the table cannot be made from."""


# ---------------------------------------------------------------------------------------------------
# Reading the repository

def toc_chapters(root: pathlib.Path = ROOT) -> list[str]:
    """The stems of the chapters in _toc.yml, in its order (``chapters/02_simple_self_attention`` -> its stem)."""
    text = (root / "_toc.yml").read_text(encoding="utf-8")
    return re.findall(r"^\s*-?\s*file:\s*['\"]?chapters/([\w.-]+?)(?:\.ipynb)?['\"]?\s*(?:#.*)?$", text, re.MULTILINE)


def _yaml_section(text: str, section: str) -> str:
    """The indented lines under a top-level key of a YAML file (enough for _config.yml's flat sections)."""
    match = re.search(rf"^{section}:[ \t]*\n((?:[ \t]+.*\n|[ \t]*\n)*)", text + "\n", re.MULTILINE)
    return match.group(1) if match else ""


def _yaml_value(section_text: str, key: str) -> str | None:
    match = re.search(rf"^[ \t]+{key}:[ \t]*['\"]?([^'\"#\s]+)['\"]?", section_text, re.MULTILINE)
    return match.group(1) if match else None


def repository(root: pathlib.Path = ROOT) -> tuple[str, str]:
    """(owner, repo) from ``repository.url`` in _config.yml."""
    url = _yaml_value(_yaml_section((root / "_config.yml").read_text(encoding="utf-8"), "repository"), "url")
    match = re.fullmatch(r"https://github\.com/([\w.-]+)/([\w.-]+?)(?:\.git)?/?", url or "")
    if not match:
        raise TableError(f"_config.yml: repository.url should be https://github.com/OWNER/REPO, got {url!r}")
    return match.group(1), match.group(2)


def site_url(root: pathlib.Path = ROOT) -> str:
    """The website's base address, ending in '/': html.baseurl, else GitHub Pages for repository.url."""
    baseurl = _yaml_value(_yaml_section((root / "_config.yml").read_text(encoding="utf-8"), "html"), "baseurl")
    if baseurl:
        return baseurl.rstrip("/") + "/"
    owner, repo = repository(root)
    return f"https://{owner.lower()}.github.io/{repo}/"


def version(root: pathlib.Path = ROOT) -> str:
    """attn_course.__version__, read from attn_course/__init__.py without importing it."""
    text = (root / "attn_course" / "__init__.py").read_text(encoding="utf-8")
    match = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    if not match:
        raise TableError("attn_course/__init__.py sets no __version__")
    return match.group(1)


def release_tag(root: pathlib.Path = ROOT) -> str:
    return f"v{version(root)}"


def colab_url(stem: str, root: pathlib.Path = ROOT) -> str:
    owner, repo = repository(root)
    return f"https://colab.research.google.com/github/{owner}/{repo}/blob/{release_tag(root)}/chapters/{stem}.ipynb"


def page_url(stem: str, root: pathlib.Path = ROOT) -> str:
    return f"{site_url(root)}chapters/{stem}.html"


# ---------------------------------------------------------------------------------------------------
# A chapter's header

def header(path: pathlib.Path) -> str:
    """The text of a notebook's first cell."""
    cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
    if not cells or cells[0].get("cell_type") != "markdown":
        raise TableError(f"{path.name}: the first cell is not the markdown header")
    source = cells[0].get("source", "")
    return "".join(source) if isinstance(source, list) else source


def title(header_text: str, stem: str) -> str:
    """'Why attention' from '# 01 · Why attention'."""
    match = re.match(r"#\s+(\d\d)\s+·\s+(.+?)\s*$", header_text.lstrip().splitlines()[0] if header_text.strip() else "")
    if not match or match.group(1) != stem[:2]:
        raise TableError(f"{stem}.ipynb: the header should start with '# {stem[:2]} · <title>'")
    return match.group(2)


def time_paragraph(header_text: str, stem: str = "the chapter") -> str:
    """The header's **Time.** paragraph, on one line."""
    for paragraph in re.split(r"\n\s*\n", header_text):
        if paragraph.lstrip().startswith("**Time"):
            return " ".join(paragraph.split())
    raise TableError(f"{stem}: the header has no '**Time.**' paragraph")


_NUMBER = r"(?:\d+(?:\.\d+)?|a|one|two|three|four|five|ten|fifteen|twenty|thirty|forty|fifty|sixty|ninety)"
_UNIT = r"(?:s|min|seconds?|minutes?)"
STUDY = re.compile(r"\babout\s+(\d+)\s+minutes\b", re.IGNORECASE)
STUDY_EXTRA = re.compile(r"\bplus\s+(\d+)(?:\s+to\s+(\d+))?\s+minutes\s+for\s+the\s+(?:\w+\s+)?exercises\b", re.IGNORECASE)
RUN = re.compile(r"\bruns\s+(?:top\s+to\s+bottom\s+)?in\s+"
                 rf"(?P<claim>(?:well\s+under|under|about|less\s+than)\s+{_NUMBER}\s+{_UNIT})"
                 r"(?:\s+on\s+(?P<machine>(?:a|an|one)\s+[^.;,(]+?))?(?=\s+with\b|\s*[.;,(]|\s*$)", re.IGNORECASE)


def time_summary(paragraph: str, stem: str = "the chapter") -> str:
    """'75 min; runs in about 90 s on a 2-core CPU' from a header's Time paragraph.

    The study time is the first 'about N minutes' (with 'plus A to B minutes for the exercises' where the
    header adds one); the run time is the header's own claim about the notebook ('runs top to bottom in
    about 90 s on a 2-core CPU', 'runs in under a minute on a laptop CPU').
    """
    study = STUDY.search(paragraph)
    run = RUN.search(paragraph)
    if not study:
        raise TableError(f"{stem}: the Time paragraph states no study time ('About N minutes to read ...')")
    if not run:
        raise TableError(f"{stem}: the Time paragraph states no run time ('runs top to bottom in about N s on a 2-core CPU')")
    text = f"{study.group(1)} min"
    extra = STUDY_EXTRA.search(paragraph)
    if extra:
        text += f" + {extra.group(1)}{'–' + extra.group(2) if extra.group(2) else ''} min exercises"
    text += "; runs in " + " ".join(run.group("claim").split())
    if run.group("machine"):
        text += " on " + " ".join(run.group("machine").split())
    return text


# ---------------------------------------------------------------------------------------------------
# The table

def _cells(line: str) -> list[str]:
    """The cells of one markdown table row (a '|' escaped as '\\|' stays inside its cell)."""
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def table_block(readme_text: str) -> tuple[int, int] | None:
    """(start, end) of the text between the markers, or None without them."""
    begin, end = readme_text.find(BEGIN), readme_text.find(END)
    if begin < 0 or end < begin:
        return None
    return begin + len(BEGIN), end


def current_rows(readme_text: str) -> dict[str, list[str]]:
    """The rows of README.md's table by chapter number: their cells."""
    block = table_block(readme_text)
    rows = {}
    for line in (readme_text[block[0]:block[1]] if block else "").splitlines():
        cells = _cells(line) if line.startswith("|") else []
        if cells and re.fullmatch(r"\d\d", cells[0]):
            rows[cells[0]] = cells
    return rows


def chapter_rows(root: pathlib.Path = ROOT, readme_text: str | None = None) -> list[Row]:
    """One row per chapter of _toc.yml, then the announced chapters not written yet."""
    if readme_text is None:
        readme_text = (root / "README.md").read_text(encoding="utf-8") if (root / "README.md").exists() else ""
    existing = current_rows(readme_text)
    stems = toc_chapters(root)
    stems += [stem for stem in sorted(ANNOUNCED) if stem not in stems]
    rows = []
    for stem in stems:
        path = root / "chapters" / f"{stem}.ipynb"
        number = stem[:2]
        old = existing.get(number)
        kept = old[2].replace("\\|", "|") if old and len(old) >= 3 and old[2] else None
        if path.exists():
            text = header(path)
            rows.append(Row(number, stem, title(text, stem), time_summary(time_paragraph(text, stem), stem),
                            kept or (ANNOUNCED[stem].teaches if stem in ANNOUNCED else NO_TEACHES), True))
        elif stem in ANNOUNCED:
            announced = ANNOUNCED[stem]
            rows.append(Row(number, stem, announced.title, announced.time, kept or announced.teaches, False))
        else:
            raise TableError(f"_toc.yml lists chapters/{stem}, but chapters/{stem}.ipynb does not exist")
    return rows


def render(rows: list[Row], root: pathlib.Path = ROOT) -> str:
    lines = [HEADER]
    for row in rows:
        colab = f"[![Open in Colab]({COLAB_BADGE})]({colab_url(row.stem, root)})"
        if row.written:
            chapter = f"[{row.title}]({page_url(row.stem, root)})"
        else:
            chapter = f"{row.title} *(being written)*"
        teaches = row.teaches.replace("|", "\\|")
        lines.append(f"| {row.number} | {chapter} | {teaches} | {row.time} | {colab} |")
    return "\n".join(lines)


def updated_readme(readme_text: str, root: pathlib.Path = ROOT) -> str:
    block = table_block(readme_text)
    if block is None:
        raise TableError(f"README.md has no chapter table between the markers {BEGIN!r} and {END!r}")
    table = render(chapter_rows(root, readme_text), root)
    return readme_text[:block[0]] + "\n" + table + "\n" + readme_text[block[1]:]


# ---------------------------------------------------------------------------------------------------
# The times on the book's pages

def _split_time(summary: str) -> tuple[str, str]:
    """('75 min', 'about 85 s on a 2-core CPU') from '75 min; runs in about 85 s on a 2-core CPU'."""
    study, _, run = summary.partition("; runs in ")
    return study, run


def chapter_times(root: pathlib.Path = ROOT) -> dict[str, tuple[str, str, str]]:
    """Chapter number -> (study time, run time, the header's Time paragraph without its label)."""
    times = {}
    for stem in toc_chapters(root):
        path = root / "chapters" / f"{stem}.ipynb"
        if not path.exists():
            continue
        paragraph = time_paragraph(header(path), stem)
        study, run = _split_time(time_summary(paragraph, stem))
        times[stem[:2]] = (study, run, re.sub(r"^\*\*Time\.?\*\*\s*", "", paragraph))
    return times


def _set_cells(line: str, values: dict[int, str]) -> str:
    cells = _cells(line)
    for index, value in values.items():
        cells[index] = value
    return "| " + " | ".join(cells) + " |"


def updated_intro(text: str, times: dict[str, tuple[str, str, str]]) -> str:
    """intro.md: the 'Reading + exercises' and 'Runs in' cells of the rows '| [NN Title](chapters/...) |'."""
    def row(match: re.Match) -> str:
        number = match.group(1)
        if number not in times:
            return match.group(0)
        study, run, _ = times[number]
        return _set_cells(match.group(0), {2: study, 3: run})
    return re.sub(r"^\| \[(\d\d) [^\n]*\|$", row, text, flags=re.MULTILINE)


def updated_instructor(text: str, times: dict[str, tuple[str, str, str]]) -> str:
    """instructor.md: the glance table's 'Student time' and 'Runs in' cells, and each block's '- Time:' line."""
    def row(match: re.Match) -> str:
        number = match.group(1)
        if number not in times:
            return match.group(0)
        study, run, _ = times[number]
        return _set_cells(match.group(0), {3: "about " + study, 4: run})
    text = re.sub(r"^\| (\d\d) · [^\n]*\|$", row, text, flags=re.MULTILINE)

    def block(match: re.Match) -> str:
        number = match.group(1)
        if number not in times:
            return match.group(0)
        # the item and its continuation lines (indented, not a sub-item)
        return re.sub(r"^- Time: .*(?:\n  (?!\s*- ).*)*", lambda _: "- Time: " + times[number][2], match.group(0),
                      count=1, flags=re.MULTILINE)
    return re.sub(r"^### (\d\d) ·.*?(?=^### |^## |\Z)", block, text, flags=re.MULTILINE | re.DOTALL)


PAGES = {"intro.md": updated_intro, "instructor.md": updated_instructor}


def updated_pages(root: pathlib.Path = ROOT) -> dict[str, tuple[str, str]]:
    """Page name -> (its text, its text with the chapters' times), for the pages the repository has."""
    times = chapter_times(root)
    result = {}
    for name, update in PAGES.items():
        path = root / name
        if path.exists():
            text = path.read_text(encoding="utf-8")
            result[name] = (text, update(text, times))
    return result


def problems(root: pathlib.Path = ROOT) -> list[str]:
    """What --check reports: a table that is not current, or a chapter without its line of what it teaches."""
    readme_text = (root / "README.md").read_text(encoding="utf-8")
    expected = updated_readme(readme_text, root)
    found = []
    if expected != readme_text:
        diff = difflib.unified_diff(readme_text.splitlines(), expected.splitlines(), "README.md", "README.md (from the chapters)",
                                    lineterm="", n=0)
        found.append("README.md's chapter table is not what the chapters say; run `make readme` "
                     "(python3 tools/readme_table.py) and commit README.md:\n" + "\n".join(diff))
    for name, (text, new_text) in updated_pages(root).items():
        if new_text != text:
            diff = difflib.unified_diff(text.splitlines(), new_text.splitlines(), name, f"{name} (from the chapters)",
                                        lineterm="", n=0)
            found.append(f"{name}: the chapters' times are not what their headers say; run `make readme` "
                         f"(python3 tools/readme_table.py) and commit {name}:\n" + "\n".join(diff))
    missing = [row.number for row in chapter_rows(root, expected) if row.teaches == NO_TEACHES]
    if missing:
        found.append(f"write what chapter(s) {', '.join(missing)} teach(es) in README.md's table (the cell that says "
                     f"{NO_TEACHES!r}), then run `make readme`")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 unless README.md's table is current")
    mode.add_argument("--print", action="store_true", help="print the table instead of writing README.md")
    args = parser.parse_args(argv)
    try:
        if args.print:
            print(render(chapter_rows()))
            return 0
        if args.check:
            found = problems()
            for problem in found:
                print(problem)
            return 1 if found else 0
        readme_text = README.read_text(encoding="utf-8")
        new_text = updated_readme(readme_text)
        if new_text != readme_text:
            README.write_text(new_text, encoding="utf-8")
            print("README.md: chapter table rewritten from the chapters")
        else:
            print("README.md: chapter table already current")
        for name, (text, page_text) in updated_pages().items():
            if page_text != text:
                (ROOT / name).write_text(page_text, encoding="utf-8")
                print(f"{name}: the chapters' times rewritten from their headers")
        rows = chapter_rows()
        for row in rows:
            if row.teaches == NO_TEACHES:
                print(f"chapter {row.number}: write what it teaches in README.md's table, in place of {NO_TEACHES!r}")
        return 0
    except TableError as error:
        print(f"readme_table: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
