"""Run the tests under the newest PyTorch on PyPI, as a student on Colab or a fresh laptop gets it
(``make test-newest-torch``; not part of ``make test``).

It makes a separate virtual environment, ``.venv-newest`` (git ignores it), with Python 3.12 where
one can be found (``python3.12``, pyenv's 3.12, ``uv python find 3.12``; else the Python running
this script), installs the newest torch and the newest release of everything in requirements.txt
allowed there (``pip install --upgrade --upgrade-strategy eager``; PyPI's torch for Linux is a
CUDA build, about 2.6 GB to download, 5 GB installed), prints what it installed, then runs

1. the package tests (``tests/`` without the website and Colab tests, which do not depend on the
   torch version: they read the committed notebooks), and
2. every chapter under nbval, as ``make test``'s first pass does.

A chapter that prints a warning fails under nbval (the warning is an output the committed notebook
does not have), so the chapters' pass also shows the warnings a student would see.

Where pip's own configuration caps torch (a ``constraint`` file naming torch, as on machines that
keep a local copy of an older torch), the installs into ``.venv-newest`` ignore pip's configuration
files (``PIP_CONFIG_FILE=/dev/null``) and say so; nothing outside ``.venv-newest`` changes.

Usage: python3 tools/newest_torch.py [pytest arguments, e.g. -x or -k 03]
Environment: NEWEST_VENV (default .venv-newest), NEWEST_PYTHON (the Python to build it with).
Exit status: 0 when both runs pass, 1 otherwise.
"""

from __future__ import annotations

import glob
import os
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
VENV = ROOT / os.environ.get("NEWEST_VENV", ".venv-newest")
NBVAL = ["--nbval", "--nbval-current-env", "--nbval-sanitize-with", "tests/nbval_sanitize.cfg"]
NOT_TORCH_DEPENDENT = ["--ignore=tests/test_site.py", "--ignore=tests/test_colab.py"]


def _say(message: str) -> None:
    print(f"[test-newest-torch] {message}", flush=True)


def _works(python: str) -> str | None:
    """The version a Python prints, or None if it does not run (a pyenv shim without that version, say)."""
    try:
        result = subprocess.run([python, "-c", "import sys, venv; print('%d.%d.%d' % sys.version_info[:3])"],
                                capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def find_python() -> tuple[str, str]:
    """A Python 3.12 if there is one, else the one running this script: (path, version)."""
    candidates = [os.environ["NEWEST_PYTHON"]] if os.environ.get("NEWEST_PYTHON") else []
    candidates += [shutil.which("python3.12") or ""]
    pyenv_root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates += sorted(glob.glob(os.path.join(pyenv_root, "versions", "3.12*", "bin", "python3.12")), reverse=True)
    if shutil.which("uv"):
        found = subprocess.run(["uv", "python", "find", "3.12"], capture_output=True, text=True)
        candidates += [found.stdout.strip()] if found.returncode == 0 else []
    for candidate in filter(None, candidates):
        version = _works(candidate)
        if version and (version.startswith("3.12.") or candidate == os.environ.get("NEWEST_PYTHON")):
            return candidate, version
    _say("no Python 3.12 found (python3.12, pyenv, uv): using the Python that runs this script")
    return sys.executable, "%d.%d.%d" % sys.version_info[:3]


def pip_environment(python: str) -> dict:
    """The environment for pip: pip's configuration files ignored where they cap torch."""
    env = dict(os.environ)
    listed = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        if key.strip().endswith(".constraint"):
            for path in value.strip().strip("'\"").split():
                try:
                    capped = [c for c in pathlib.Path(path).read_text().splitlines() if c.strip().startswith("torch")]
                except OSError:
                    continue
                if capped:
                    _say(f"pip's configuration caps torch ({key.strip()} = {path}: {', '.join(capped)}); the installs "
                         f"into {VENV.name} ignore pip's configuration files (PIP_CONFIG_FILE={os.devnull})")
                    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def run(command: list[str], env: dict | None = None) -> int:
    _say("$ " + " ".join(command))
    return subprocess.run(command, cwd=ROOT, env=env).returncode


def main(argv: list[str]) -> int:
    py = VENV / "bin" / "python"
    if not py.exists():
        python, version = find_python()
        _say(f"creating {VENV.name} with Python {version} ({python})")
        if run([python, "-m", "venv", str(VENV)]) != 0:
            return 1
    env = pip_environment(str(py))
    if run([str(py), "-m", "pip", "install", "--quiet", "--upgrade", "pip"], env) != 0:
        return 1
    if run([str(py), "-m", "pip", "install", "--upgrade", "--upgrade-strategy", "eager", "torch",
            "-r", "requirements.txt"], env) != 0:
        _say("the installation failed (PyPI's torch for Linux is a CUDA build: about 2.6 GB to download, 5 GB on disk)")
        return 1
    newest = subprocess.run([str(py), "-m", "pip", "index", "versions", "torch"], capture_output=True, text=True,
                            env=env).stdout.splitlines()
    report = subprocess.run([str(py), "-c", (
        "import sys, torch, numpy, matplotlib, nbval, onnx; "
        "print(f'Python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}, "
        "GPU available: {torch.cuda.is_available()}), numpy {numpy.__version__}, matplotlib {matplotlib.__version__}, "
        "onnx {onnx.__version__}, nbval {nbval.__version__}')")], capture_output=True, text=True)
    _say("installed: " + (report.stdout.strip() or report.stderr.strip()))
    if newest:
        _say(f"PyPI's newest: {newest[0]}")
    env = {**os.environ, "GOMP_SPINCOUNT": os.environ.get("GOMP_SPINCOUNT", "10000")}
    package = run([str(py), "-m", "pytest", "tests", *NOT_TORCH_DEPENDENT, "-p", "no:cacheprovider", "-q",
                   *argv], env)
    chapters = run([str(py), "-m", "pytest", "chapters", *NBVAL, "-p", "no:cacheprovider", "-q", *argv], env)
    _say(f"package tests: {'passed' if package == 0 else 'FAILED'}; chapters under nbval: "
         f"{'passed' if chapters == 0 else 'FAILED'} (with {report.stdout.strip()})")
    return 0 if package == 0 and chapters == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
