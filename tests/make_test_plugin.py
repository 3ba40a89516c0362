"""A pytest plugin for `make test` (loaded with ``-p tests.make_test_plugin``): one session for both
numerical paths, the longest files first.

``--nbval-other-cpu`` collects every chapter twice: as nbval collects it, and again as
``chapters/NN_x.ipynb@scalar-kernels``, whose kernel starts with ``ATEN_CPU_CAPABILITY=default
OMP_NUM_THREADS=1`` (PyTorch's scalar CPU kernels, which every CPU has and which round differently from
the AVX2 and AVX-512 ones, on one thread: another summation order). A chapter whose compared outputs hold
only on the CPU that executed it fails here, not on a student's machine or in CI. The second copy is its
own file for pytest-xdist's ``--dist loadfile``, so the two copies of a chapter can run at the same time.

Ordering: pytest-xdist hands out whole files in the order they are collected (with
``--no-loadscope-reorder``; by default it sorts them by their number of tests). A file that takes four
minutes handed out last leaves the other worker idle for most of them, so the files are put in order of
how long they take, longest first (each worker then takes the next file when it is nearly done: a
list schedule, within a few per cent of the best on two workers). A chapter's duration is the run time
its executed notebook records (its cells' timestamps), 1.5 times that on the scalar kernels; the test
files' are measured on 2 cores (the table below; a file not in it counts as a few seconds). The order
changes nothing else: the tests of one file still run in their own order, on one worker.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib

import pytest

OTHER_CPU = {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"}
SUFFIX = "@scalar-kernels"
SCALAR_SLOWDOWN = 1.5
# Seconds on one of two busy cores (make test, from a fresh clone: the site's build trains and exports
# chapter 07's translator, the Colab test builds its environment). Only the order depends on them.
TEST_FILE_SECONDS = {
    "tests/test_site.py": 260,
    "tests/test_nbgrader.py": 90,
    "tests/test_colab.py": 50,
    "tests/test_diagrams.py": 31,
    "tests/test_exercises_ch11.py": 19,
    "tests/test_student.py": 17,
    "tests/test_exercises_ch06.py": 17,
    "tests/test_exercises_ch07.py": 15,
}
DEFAULT_SECONDS = 3


def pytest_addoption(parser):
    parser.addoption("--nbval-other-cpu", action="store_true", default=False,
                     help="with --nbval: run every notebook a second time on PyTorch's scalar CPU kernels "
                          f"with one thread ({' '.join(f'{k}={v}' for k, v in OTHER_CPU.items())})")


def _other_cpu_notebook_class():
    from nbval.plugin import IPyNbFile

    class OtherCPUNotebook(IPyNbFile):
        """A notebook whose kernel starts with OTHER_CPU in its environment."""

        def setup(self):
            saved = {name: os.environ.get(name) for name in OTHER_CPU}
            os.environ.update(OTHER_CPU)  # the kernel inherits the environment when it starts
            try:
                super().setup()
            finally:
                for name, value in saved.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value

    return OtherCPUNotebook


def pytest_collect_file(file_path, parent):
    option = parent.config.option
    if file_path.suffix == ".ipynb" and option.nbval_other_cpu and (option.nbval or option.nbval_lax):
        relative = pathlib.Path(os.path.relpath(file_path, parent.config.rootpath)).as_posix()
        return _other_cpu_notebook_class().from_parent(parent, path=file_path, nodeid=relative + SUFFIX)
    return None


def pytest_configure(config):
    if config.option.nbval_other_cpu and not (config.option.nbval or config.option.nbval_lax):
        raise pytest.UsageError("--nbval-other-cpu needs --nbval (it runs the notebooks a second time)")


def _recorded_seconds(path: pathlib.Path) -> float:
    """The run time an executed notebook records: from its first cell's start to its last cell's end."""
    try:
        cells = json.loads(path.read_text())["cells"]
        times = [c["metadata"]["execution"] for c in cells if "iopub.execute_input" in c["metadata"].get("execution", {})]
        start = datetime.datetime.fromisoformat(times[0]["iopub.execute_input"].replace("Z", "+00:00"))
        end = datetime.datetime.fromisoformat(times[-1]["shell.execute_reply"].replace("Z", "+00:00"))
        return (end - start).total_seconds()
    except (OSError, ValueError, KeyError, IndexError):
        return DEFAULT_SECONDS


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    files: dict[str, float] = {}
    for item in items:
        name = item.nodeid.split("::", 1)[0]
        if name not in files:
            if name.endswith(".ipynb") or name.endswith(".ipynb" + SUFFIX):
                seconds = _recorded_seconds(config.rootpath / name.removesuffix(SUFFIX))
                files[name] = seconds * (SCALAR_SLOWDOWN if name.endswith(SUFFIX) else 1.0)
            else:
                files[name] = TEST_FILE_SECONDS.get(name, DEFAULT_SECONDS)
    order = {name: rank for rank, name in enumerate(sorted(files, key=lambda name: -files[name]))}
    items.sort(key=lambda item: order[item.nodeid.split("::", 1)[0]])  # stable: each file's tests keep their order
