"""Static checks of the chapter notebooks and the table of contents (nothing is executed here;
nbval executes every chapter in the same `make test` run)."""

import json
import pathlib
import re
import subprocess
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import solution_cells  # noqa: E402  (tools/solution_cells.py)
CHAPTER_ORDER = [
    "01_why_attention", "02_simple_self_attention", "03_scaled_dot_product_attention", "04_causal_attention",
    "05_multi_head_attention", "06_positional_encoding", "07_character_translator", "08_efficient_attention",
    "09_rotary_and_alibi", "10_grouped_query_attention", "11_latent_attention", "12_linear_attention",
]
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))


def _toc_files():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = []
    for part in toc.get("parts", []):
        files += [entry["file"] for entry in part.get("chapters", [])]
    return toc["root"], files


def test_toc_lists_written_chapters_in_course_order():
    root, files = _toc_files()
    assert (ROOT / f"{root}.md").exists()
    chapter_entries = [f.split("/")[-1] for f in files if f.startswith("chapters/")]
    assert chapter_entries == [c for c in CHAPTER_ORDER if c in chapter_entries], "chapters out of order in _toc.yml"
    assert sorted(chapter_entries) == sorted(p.stem for p in CHAPTERS), "every chapter notebook, and only those, in _toc.yml"
    for f in files:
        assert (ROOT / f"{f}.ipynb").exists() or (ROOT / f"{f}.md").exists(), f


def test_setup_cells_match_the_template():
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "sync_setup_cells.py"), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# Chapters that need a GPU runtime on Colab (none so far: every chapter runs on a 2-core CPU in about
# a minute). A chapter listed here may ask Colab for one in its metadata; no other chapter may.
CHAPTERS_NEEDING_A_GPU: set[str] = set()


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_no_chapter_asks_colab_for_an_accelerator_it_does_not_need(path):
    metadata = json.loads(path.read_text())["metadata"]
    asked = {key: value for key, value in (("accelerator", metadata.get("accelerator")),
                                            ("colab.gpuType", metadata.get("colab", {}).get("gpuType"))) if value}
    if path.stem not in CHAPTERS_NEEDING_A_GPU:
        assert not asked, f"{path.name} asks Colab for {asked} but is not in CHAPTERS_NEEDING_A_GPU"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_anatomy(path):
    nb = json.loads(path.read_text())
    cells = nb["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    text = "\n".join("".join(c["source"]) for c in cells)
    assert cells[0]["cell_type"] == "markdown" and "".join(cells[0]["source"]).startswith(f"# {path.stem[:2]} · ")
    for heading in ("Learning objectives", "Prerequisites", "Time", "Exercise", "Summary", "References"):
        assert heading in text, f"{path.name}: no '{heading}'"
    # Committed executed, in order, without errors.
    assert all(c.get("execution_count") for c in code), f"{path.name}: not every code cell was executed"
    counts = [c["execution_count"] for c in code]
    assert counts == sorted(counts), f"{path.name}: cells executed out of order"
    assert not any(o.get("output_type") == "error" for c in code for o in c.get("outputs", []))
    # Exercises: at least three solutions, each after its check and collapsed wherever the notebook is
    # opened (tools/solution_cells.py says which rule a cell breaks).
    solutions = [c for c in cells if "solution" in c.get("metadata", {}).get("tags", [])]
    assert len(solutions) >= 3, f"{path.name}: {len(solutions)} solution cells"
    assert not solution_cells.problems(nb), f"{path.name}: {solution_cells.problems(nb)}"
    # "Run all" grades the student: the check before each solution ran on the untouched scaffold.
    for index, cell in enumerate(cells):
        if "solution" in cell.get("metadata", {}).get("tags", []):
            check = next(c for c in reversed(cells[:index]) if c["cell_type"] == "code")
            if "solution" in check.get("metadata", {}).get("tags", []):
                continue  # a second solution cell of the same exercise
            shown = "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
                            for o in check.get("outputs", []))
            assert "not attempted" in shown, f"{path.name} cell {index}: the check before the solution said {shown!r}"
    # An explorable, with its widget state stored so that it works on the static site.
    assert "explorable(" in text
    assert "application/vnd.jupyter.widget-state+json" in nb["metadata"].get("widgets", {}), f"{path.name}: no widget state"
    # Runs anywhere: no hard-coded CUDA device.
    hard_coded = re.compile(r"""(\.to\(\s*|device\s*=\s*|torch\.device\(\s*)['"]cuda|\.cuda\(\s*\)""")
    assert not any(hard_coded.search("".join(c["source"])) for c in code)
    assert "torch.set_printoptions(precision=3, sci_mode=False)" in "".join(code[0]["source"])


def test_package_never_hard_codes_cuda():
    """Only get_device() picks the CUDA device; everything else follows its inputs' device
    (comparing ``device.type`` with a name is fine, moving tensors to a named device is not)."""
    hard_coded = re.compile(r"""(\.to\(\s*|device\s*=\s*|torch\.device\(\s*)['"]cuda|\.cuda\(\s*\)""")
    for path in (ROOT / "attn_course").rglob("*.py"):
        if path.name == "utils.py":
            continue
        assert not hard_coded.search(path.read_text()), f"{path} hard-codes a cuda device"
