"""Fetch the website's JavaScript (MathJax 3, RequireJS, the ipywidgets embedder) from npm at build time.

The book's pages load no third-party resources: MathJax and the scripts that bring the explorables
to life on the static site are served from the site itself, under ``_static/vendor/``. This script
downloads them with ``npm pack`` (the packages' own tarballs from the npm registry; no ``node_modules``,
no build step) into the ignored folder ``_vendor/`` and lays them out as::

    _vendor/site/_static/vendor/mathjax/          MathJax 3 (the es5 folder: tex-mml-chtml.js, fonts, extensions)
    _vendor/site/_static/vendor/requirejs/        require.js (the AMD loader the widget embedder needs)
    _vendor/site/_static/vendor/html-manager/     @jupyter-widgets/html-manager dist (embed-amd.js, fonts)
    _vendor/site/_static/vendor/onnxruntime-web/  ort.wasm.min.js and its WebAssembly runtime (chapter 07's
                                                  translator panel loads it on that page only)
    _vendor/site/_static/vendor/manifest.json     what was fetched, with versions
    _vendor/axe-core/axe.min.js                   the accessibility checker the browser test runs in each page
                                                  (not part of the site)

``_vendor/site`` is published with Sphinx's ``html_extra_path`` (copied as it is into the site's root),
not through ``_static/``, because Jupyter Book injects every ``.js`` file under ``_static/`` into every
page. The Sphinx extension ``tools/site_assets.py`` then points ``mathjax_path`` and myst-nb's
``nb_ipywidgets_js`` at these files.

Where no npm registry can be reached (or npm is not installed), nothing is written and the book falls
back to the CDNs (jsDelivr and cdnjs), with a message saying so. Run again to retry.

Usage: python tools/vendor_assets.py [--force]      (``make vendor``; ``make book`` runs it first)
Exit status: 0 when the assets are in place, 3 when the site will use the CDNs.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
VENDOR = ROOT / "_vendor"
SITE = VENDOR / "site"              # html_extra_path
TARGET = SITE / "_static" / "vendor"  # ... which lands at <site>/_static/vendor/
MANIFEST = TARGET / "manifest.json"

# Pinned versions (bump here). html-manager 1.0.x embeds ipywidgets 8 (and 7) controls.
PACKAGES = {
    "mathjax": "3.2.2",
    "requirejs": "2.3.8",
    "@jupyter-widgets/html-manager": "1.0.15",
    "onnxruntime-web": "1.23.2",
    "axe-core": "4.14.1",  # 4.14 counts WCAG 2.5.3 "label in name" (label-content-name-mismatch) as serious
}

# Paths the site loads, relative to the site's _static/ folder (what Sphinx's add_js_file expects).
MATHJAX_JS = "vendor/mathjax/tex-mml-chtml.js"
REQUIRE_JS = "vendor/requirejs/require.js"
EMBED_AMD_JS = "vendor/html-manager/embed-amd.js"
# onnxruntime-web's WebAssembly build (CPU only: no WebGL/WebGPU code, so the smallest runtime). The
# .mjs glue and the .wasm are fetched by ort.wasm.min.js itself from the folder it is told.
ORT_DIR = "vendor/onnxruntime-web/"
ORT_FILES = ("ort.wasm.min.js", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm")
AXE_JS = VENDOR / "axe-core" / "axe.min.js"
# Where embed-amd.js would look for widget modules it does not bundle (it bundles
# @jupyter-widgets/base and /controls, all this course uses): the site itself, never a CDN.
WIDGETS_MODULES_DIR = "vendor/npm/"

FALLBACK_MESSAGE = """
==============================================================================
 attn-course: could not fetch MathJax and the ipywidgets scripts from npm
 ({reason}).
 The website will load them from public CDNs (jsDelivr, cdnjs) instead, so its
 pages need internet access. Run `make vendor` again once a registry is reachable.
==============================================================================
"""


def assets_present() -> bool:
    """True when every file the site loads is in place, for the pinned versions."""
    if not MANIFEST.exists():
        return False
    try:
        fetched = json.loads(MANIFEST.read_text()).get("packages", {})
    except ValueError:
        return False
    wanted = (MATHJAX_JS, REQUIRE_JS, EMBED_AMD_JS, *(ORT_DIR + name for name in ORT_FILES))
    return fetched == PACKAGES and all((SITE / "_static" / p).is_file() for p in wanted) and AXE_JS.is_file()


def _npm_pack(spec: str, into: pathlib.Path) -> pathlib.Path:
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not installed")
    result = subprocess.run(
        [npm, "pack", spec, "--loglevel=error", "--fetch-retries=1", "--fetch-timeout=60000", "--pack-destination", str(into)],
        cwd=into, capture_output=True, text=True, timeout=300,
    )
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"`npm pack {spec}` failed: {last}")
    name = result.stdout.strip().splitlines()[-1]
    return into / name


def _extract(tarball: pathlib.Path, member_prefix: str, destination: pathlib.Path, keep=lambda name: True) -> None:
    """Extract the files under ``package/<member_prefix>`` of an npm tarball into ``destination``."""
    prefix = f"package/{member_prefix}"
    with tarfile.open(tarball) as archive:
        for member in archive.getmembers():
            if not member.isfile() or not member.name.startswith(prefix):
                continue
            relative = member.name[len(prefix):]
            if relative and not relative.startswith("/"):
                continue  # "package/distro" is not under "package/dist"
            relative = relative.lstrip("/")
            if ".." in pathlib.PurePosixPath(relative).parts or (relative and not keep(relative)):
                continue
            out = destination / relative if relative else destination  # a single file: destination is its path
            out.parent.mkdir(parents=True, exist_ok=True)
            with archive.extractfile(member) as source, open(out, "wb") as sink:
                shutil.copyfileobj(source, sink)


def fetch() -> None:
    """Download the pinned packages and lay out ``_vendor/site`` (replacing what was there)."""
    VENDOR.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=VENDOR) as tmp:
        tmp = pathlib.Path(tmp)
        tarballs = {name: _npm_pack(f"{name}@{version}", tmp) for name, version in PACKAGES.items()}
        staged = tmp / "vendor"
        _extract(tarballs["mathjax"], "es5", staged / "mathjax")
        _extract(tarballs["mathjax"], "LICENSE", staged / "mathjax" / "LICENSE")
        _extract(tarballs["requirejs"], "require.js", staged / "requirejs" / "require.js")
        _extract(tarballs["@jupyter-widgets/html-manager"], "dist", staged / "html-manager",
                 keep=lambda name: not name.endswith(".map") and name not in ("embed.js", "libembed-amd.js"))
        for name in ORT_FILES:
            _extract(tarballs["onnxruntime-web"], f"dist/{name}", staged / "onnxruntime-web" / name)
        _extract(tarballs["onnxruntime-web"], "LICENSE", staged / "onnxruntime-web" / "LICENSE")
        _extract(tarballs["axe-core"], "axe.min.js", tmp / "axe-core" / "axe.min.js")
        _extract(tarballs["axe-core"], "LICENSE", tmp / "axe-core" / "LICENSE")
        (staged / "npm").mkdir()
        (staged / "npm" / "README.txt").write_text(
            "Widget modules that embed-amd.js does not bundle would be looked up here (never on a CDN).\n"
        )
        (staged / "manifest.json").write_text(json.dumps({"packages": PACKAGES, "source": "npm pack"}, indent=1) + "\n")
        if TARGET.exists():
            shutil.rmtree(TARGET)
        TARGET.parent.mkdir(parents=True, exist_ok=True)
        staged.rename(TARGET)
        if AXE_JS.parent.exists():
            shutil.rmtree(AXE_JS.parent)
        (tmp / "axe-core").rename(AXE_JS.parent)


def ensure(force: bool = False, quiet: bool = False) -> bool:
    """Make sure the assets are in ``_vendor/site``; return False (after saying why) if they cannot be."""
    if assets_present() and not force:
        return True
    try:
        fetch()
    except (RuntimeError, OSError, subprocess.SubprocessError, tarfile.TarError) as error:
        print(FALLBACK_MESSAGE.format(reason=error), file=sys.stderr, flush=True)
        return False
    if not quiet:
        print(f"fetched {', '.join(f'{n}@{v}' for n, v in PACKAGES.items())} into {TARGET.relative_to(ROOT)}", flush=True)
    return assets_present()


def main(argv: list[str]) -> int:
    if ensure(force="--force" in argv):
        print(f"site assets in place: {TARGET.relative_to(ROOT)} ({', '.join(f'{n}@{v}' for n, v in PACKAGES.items())})")
        return 0
    return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
