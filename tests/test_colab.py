"""Colab, simulated: a chapter runs in an environment that has never seen attn_course.

A virtual environment with only what Colab has (torch, matplotlib, ipywidgets, a Jupyter kernel and
nbclient) runs a chapter copied to a folder outside the repository, with ATTN_COURSE_PIP_SOURCE
pointing at this checkout. The chapter's first cell must install attn_course from there, and every
cell must then run without an error.

The environment is cached in ``_build/colab-venv`` (created once, ~1-2 minutes; torch comes from the
local wheel when pip can see one, ``pip install --no-index --no-deps torch``, then its dependencies);
attn_course is uninstalled from it before every run, so each run starts as Colab does. Chapter 02 runs
by default; ATTN_COURSE_COLAB_CHAPTERS=all (or a comma-separated list of chapter stems) runs others.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
VENV = ROOT / "_build" / "colab-venv"
VENV_PYTHON = VENV / "bin" / "python"
READY = VENV / ".attn-course-colab-ready"
COLAB_PACKAGES = ["torch>=2.2", "matplotlib", "ipywidgets>=8", "ipykernel", "nbclient"]


def _chapters() -> list[pathlib.Path]:
    wanted = os.environ.get("ATTN_COURSE_COLAB_CHAPTERS", "02_simple_self_attention")
    chapters = sorted((ROOT / "chapters").glob("*.ipynb"))
    if wanted != "all":
        names = {name.strip() for name in wanted.split(",")}
        chapters = [c for c in chapters if c.stem in names]
    return chapters


def _run(command: list[str], timeout: int = 1200, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


@contextlib.contextmanager
def _exclusive(lock_path: pathlib.Path):
    """One test run at a time uses the shared environment (others wait), even across processes."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="module")
def colab_venv():
    """The cached Colab-like environment (held, locked, for the whole module)."""
    with _exclusive(VENV.parent / "colab-venv.lock"):
        yield _prepare_venv()


@pytest.fixture
def colab_python(colab_venv) -> pathlib.Path:
    """Its python, without attn_course: every test starts as Colab does."""
    subprocess.run([str(colab_venv), "-m", "pip", "uninstall", "--yes", "--quiet", "attn-course"], capture_output=True)
    probe = subprocess.run([str(colab_venv), "-c", "import attn_course"], capture_output=True, cwd="/")
    assert probe.returncode != 0, "attn_course is importable in the fresh environment; the test would prove nothing"
    return colab_venv


def _prepare_venv() -> pathlib.Path:
    key = json.dumps(COLAB_PACKAGES)
    if not (READY.exists() and READY.read_text() == key and VENV_PYTHON.exists()):
        shutil.rmtree(VENV, ignore_errors=True)
        _run([sys.executable, "-m", "venv", str(VENV)])
        pip = [str(VENV_PYTHON), "-m", "pip", "install", "--quiet", "--no-compile"]
        # A torch wheel pip can already see on this machine (its find-links) saves a large download.
        local = subprocess.run([*pip, "--no-index", "--no-deps", "torch>=2.2"], capture_output=True, text=True)
        if local.returncode != 0:
            print("no local torch wheel; installing torch from the package index", flush=True)
        _run([*pip, *COLAB_PACKAGES])
        READY.write_text(key)
    return VENV_PYTHON


RUNNER = textwrap.dedent('''
    import json, sys
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    path, report = sys.argv[1], sys.argv[2]
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.cells.append(nbformat.v4.new_code_cell(
        "import sys, attn_course\\nprint('ATTN-COLAB', sys.prefix, attn_course.__file__)"))
    client = NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": sys.argv[3]}})
    error = None
    try:
        client.execute()
    except CellExecutionError as failure:
        error = str(failure)[-4000:]
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    errors = [o.get("ename", "") + ": " + o.get("evalue", "") for o in outputs if o.get("output_type") == "error"]
    json.dump({"error": error, "errors": errors, "stdout": text[-20000:]}, open(report, "w"))
''')


@pytest.mark.slow
@pytest.mark.parametrize("chapter", _chapters(), ids=lambda p: p.stem)
def test_chapter_runs_on_a_fresh_colab_like_environment(colab_python, chapter, tmp_path):
    workdir = tmp_path / "content"  # Colab's working folder; far from the repository
    workdir.mkdir()
    assert ROOT not in workdir.resolve().parents
    notebook = workdir / chapter.name
    shutil.copy2(chapter, notebook)
    (tmp_path / "runner.py").write_text(RUNNER)
    report = tmp_path / "report.json"
    env = {
        key: value for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "VIRTUAL_ENV", "JUPYTER_PATH", "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR")
    }
    env.update({
        "ATTN_COURSE_PIP_SOURCE": str(ROOT),
        "JUPYTER_DATA_DIR": str(tmp_path / "jupyter-data"),  # no kernels but the environment's own
        "PATH": f"{colab_python.parent}{os.pathsep}{env.get('PATH', '')}",
    })
    _run([str(colab_python), str(tmp_path / "runner.py"), str(notebook), str(report), str(workdir)],
         timeout=1500, cwd=workdir, env=env)
    result = json.loads(report.read_text())
    assert result["error"] is None, f"a cell failed:\n{result['error']}"
    assert not result["errors"], result["errors"]
    marker = [line for line in result["stdout"].splitlines() if line.startswith("ATTN-COLAB")]
    assert marker, result["stdout"][-2000:]
    _, prefix, package_file = marker[-1].split(" ", 2)
    assert pathlib.Path(prefix).resolve() == VENV.resolve(), f"the kernel ran in {prefix}, not in the Colab-like environment"
    assert "site-packages" in package_file and pathlib.Path(package_file).resolve().is_relative_to(VENV.resolve()), (
        f"attn_course was imported from {package_file}, not installed into the environment by the first cell")
