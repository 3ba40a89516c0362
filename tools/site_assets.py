"""Sphinx extension: serve MathJax and the ipywidgets embedder from the site itself.

Registered in ``_config.yml`` (``sphinx: local_extensions: {site_assets: tools/}``). When the book is
built it:

1. makes sure the pinned npm packages are in ``_vendor/site`` (``tools/vendor_assets.py``, which runs
   ``npm pack`` the first time), publishes that folder with ``html_extra_path`` (so the files land in
   ``<site>/_static/vendor/`` without being injected into every page, as ``_static/*.js`` would be), and
   points ``mathjax_path`` and myst-nb's ``nb_ipywidgets_js`` at them. Sphinx writes those script
   paths relative to each page, so pages in ``chapters/`` load ``../_static/vendor/...``.
   Where npm cannot reach a registry it leaves the CDN defaults in place and says so.
2. tells RequireJS where the embedder's own files are (its fonts would otherwise be looked up
   relative to each page), and sets the ``data-jupyter-widgets-cdn`` attribute of ``embed-amd.js``
   on every page to the site's own ``_static/vendor/npm/`` (relative to that page). ``embed-amd.js`` bundles the
   ``@jupyter-widgets/base`` and ``@jupyter-widgets/controls`` modules, all the course's explorables
   use; only a widget library it does not bundle would be looked up at that address, which by
   default is jsDelivr. Pointing it at the site keeps even that request local (it would 404 and the
   browser test would report it).
3. drops duplicate scripts (sphinx-thebe's inline configuration is added twice under Jupyter Book 1,
   which declares a ``const`` twice: a console error on every page).
4. puts chapter 07's "try it" panel on that page (and only there): the translator the chapter trains,
   exported to ONNX by ``tools/export_translator.py`` (started in the background when the build starts,
   cached in ``_build/translator/``) and run in the reader's browser with onnxruntime-web from npm.
   The model files are copied into ``<site>/_static/translator/`` when the build finishes; the panel's
   script and style come from ``tools/site_extra/`` (``html_extra_path``). Where the export fails the
   build prints why and the panel says it is unavailable. ``ATTN_COURSE_TRANSLATOR=off`` skips it.
5. gives every figure a text alternative: an image output keeps the alt text of its cell's metadata
   (``"mystnb": {"image": {"alt": "..."}}``, which myst-nb applies); one without gets an alt derived
   from the cell's code (the plot's title and axis labels), never its file name. A cell whose
   output is an explorable (widget pictures, which myst-nb does not reach) carries that text in a
   hidden ``<span class="attn-figure-alt" data-alt="...">``, which ``_static/course.js`` puts on its pictures.
6. lets ``ATTN_COURSE_EXECUTE=off`` (or ``cache``, ``force``) override ``execute_notebooks``, so that the
   browser test can build the site from the committed, executed notebooks without running them again.
7. puts the licences and the authorship in every page's footer (``extra_footer``, see ``FOOTER``), with
   links to ``LICENSE``, ``LICENSE-CONTENT`` and ``CITATION.cff`` in the repository of ``_config.yml``.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

from sphinx.util import logging
from sphinx.util.console import bold, red

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import vendor_assets  # noqa: E402  (tools/vendor_assets.py)

logger = logging.getLogger(__name__)
TOOLS = pathlib.Path(__file__).resolve().parent
SITE_EXTRA = TOOLS / "site_extra"  # html_extra_path: the translator panel's script and style
TRANSLATOR_CACHE = TOOLS.parent / "_build" / "translator"
TRANSLATOR_PAGE = re.compile(r"^chapters/07_")
PANEL_ID = "attn-translator-panel"
EXECUTION_MODES = ("off", "auto", "cache", "force", "inline")


# The footer of every page, under the theme's "By <author>" (`author` in _config.yml, the authors of
# CITATION.cff): the licences of LICENSE and LICENSE-CONTENT and how to cite (tests/test_release.py
# checks that they agree). {repo} is repository.url/blob/<branch> of _config.yml.
FOOTER = (
    '<p class="attn-licence">Code under the <a href="{repo}/LICENSE">MIT licence</a>, text and figures under '
    '<a href="{repo}/LICENSE-CONTENT">CC BY 4.0</a>. '
    'Cite with <a href="{repo}/CITATION.cff">CITATION.cff</a>.</p>'
)


def _footer(config) -> None:
    options = config.html_theme_options
    if options.get("extra_footer"):  # set by hand in _config.yml: keep it
        return
    url = str(options.get("repository_url") or "").rstrip("/")
    repo = f"{url}/blob/{options.get('repository_branch') or 'main'}" if url else ""
    options["extra_footer"] = FOOTER.format(repo=html_escape(repo))


def _configure(app, config) -> None:
    _footer(config)
    mode = os.environ.get("ATTN_COURSE_EXECUTE")
    if mode:
        if mode not in EXECUTION_MODES:
            raise ValueError(f"ATTN_COURSE_EXECUTE must be one of {EXECUTION_MODES}, got {mode!r}")
        config.nb_execution_mode = mode
        logger.info(bold(f"[site_assets] notebook execution: {mode} (from ATTN_COURSE_EXECUTE)"))

    app.attn_course_local_assets = vendor_assets.ensure(quiet=True)
    config.html_extra_path = [*config.html_extra_path, str(SITE_EXTRA)]
    _start_translator_export(app)
    if app.attn_course_local_assets:
        config.html_extra_path = [*config.html_extra_path, str(vendor_assets.SITE)]
        config.mathjax_path = vendor_assets.MATHJAX_JS
        config.nb_ipywidgets_js = {
            vendor_assets.REQUIRE_JS: {},
            vendor_assets.EMBED_AMD_JS: {"data-jupyter-widgets-cdn": vendor_assets.WIDGETS_MODULES_DIR},
        }
        logger.info(bold("[site_assets] MathJax and the ipywidgets scripts are served from _static/vendor/"))
    else:  # vendor_assets.ensure printed why
        logger.info(bold("[site_assets] falling back to the CDNs for MathJax and the ipywidgets scripts"))


def _page_scripts(app, pagename, templatename, context, doctree) -> None:
    """Fix up this page's scripts: no duplicates; embed-amd.js finds its files on the site."""
    scripts = context.get("script_files")
    if not scripts:
        return
    # sphinx-thebe's inline configuration comes twice under Jupyter Book 1 (`const THEBE_JS_URL`
    # declared twice: a console error on every page). Keep the first copy of any identical script.
    seen, unique = set(), []
    for script in scripts:
        attributes = getattr(script, "attributes", {})
        key = (os.fspath(getattr(script, "filename", script) or ""), tuple(sorted(attributes.items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    scripts[:] = unique
    if not getattr(app, "attn_course_local_assets", False):
        return
    wanted = f"_static/{vendor_assets.EMBED_AMD_JS}"
    for index, script in enumerate(scripts):
        filename = getattr(script, "filename", script)
        if not filename or os.fspath(filename) != wanted:
            continue
        JavaScript = type(script)
        attributes = dict(getattr(script, "attributes", {}))
        attributes["data-jupyter-widgets-cdn"] = context["pathto"](f"_static/{vendor_assets.WIDGETS_MODULES_DIR}", 1)
        scripts[index] = JavaScript(script.filename, priority=script.priority, **attributes)
        # embed-amd.js finds its fonts (Font Awesome, for the widgets' icons) next to the AMD module
        # "@jupyter-widgets/html-manager/dist/libembed-amd", which RequireJS places relative to the
        # page unless told where that module lives: on the site, in _static/vendor/html-manager/.
        html_manager = context["pathto"](f"_static/{vendor_assets.EMBED_AMD_JS.rsplit('/', 1)[0]}", 1)
        paths = json.dumps({"@jupyter-widgets/html-manager/dist": html_manager})
        scripts.insert(index, JavaScript("", priority=script.priority, body=f"requirejs.config({{paths: {paths}}});"))
        break


def _start_translator_export(app) -> None:
    """Train (once, cached) and export chapter 07's translator in the background while Sphinx works."""
    app.attn_course_export = None
    if os.environ.get("ATTN_COURSE_TRANSLATOR", "on") == "off":
        app.attn_course_export_skipped = "the export was switched off (ATTN_COURSE_TRANSLATOR=off)"
        return
    app.attn_course_export_skipped = ""
    TRANSLATOR_CACHE.mkdir(parents=True, exist_ok=True)
    output = open(TRANSLATOR_CACHE / "export-output.txt", "w")
    app.attn_course_export = subprocess.Popen(
        [sys.executable, str(TOOLS / "export_translator.py"), "--out", str(TRANSLATOR_CACHE)],
        stdout=output, stderr=subprocess.STDOUT, cwd=TOOLS.parent,
    )
    output.close()
    logger.info(bold("[site_assets] exporting chapter 07's translator to ONNX in the background (tools/export_translator.py)"))


def _finish_translator_export(app, exception) -> None:
    """Wait for the export and copy the model into the site, or say loudly why the panel is unavailable."""
    if exception is not None or app.builder.format != "html":
        return
    import export_translator  # tools/export_translator.py (only its paths)

    target = pathlib.Path(app.outdir) / export_translator.ASSET_DIR
    source = export_translator.paths(TRANSLATOR_CACHE)
    reason = getattr(app, "attn_course_export_skipped", "")
    process = getattr(app, "attn_course_export", None)
    if process is not None:
        process.wait()
        if not export_translator.export_is_current(TRANSLATOR_CACHE):
            try:
                reason = json.loads(source["meta"].read_text()).get("reason", "")
            except (OSError, ValueError):
                reason = ""
            tail = (TRANSLATOR_CACHE / "export-output.txt").read_text(errors="replace").strip().splitlines()[-5:]
            reason = reason or f"tools/export_translator.py exited with status {process.returncode}: " + " | ".join(tail)
    if not reason:
        shutil.copytree(source["assets"], target, dirs_exist_ok=True)
        logger.info(bold(f"[site_assets] chapter 07's translator panel: ONNX model copied to {target}"))
        return
    target.mkdir(parents=True, exist_ok=True)
    (target / "model.json").write_text(json.dumps({"available": False, "reason": reason}) + "\n")
    logger.info(red(
        "\n[site_assets] chapter 07's in-browser translator is UNAVAILABLE on this build: " + reason
        + f"\n[site_assets] the page says so; see {TRANSLATOR_CACHE / 'export.log'} and export-output.txt there.\n"))


def _translator_panel(app, pagename, templatename, context, doctree) -> None:
    """On chapter 07's page only: the translator panel, its style and its script."""
    if not TRANSLATOR_PAGE.match(pagename) or "body" not in context:
        return
    pathto = context["pathto"]
    attributes = {
        "data-model-dir": pathto("_static/translator/", 1),
        "data-ort-dir": pathto(f"_static/{vendor_assets.ORT_DIR}", 1),
        "data-ort-src": pathto(f"_static/{vendor_assets.ORT_DIR}ort.wasm.min.js", 1),
    }
    if not getattr(app, "attn_course_local_assets", False):
        attributes["data-unavailable"] = "onnxruntime-web could not be fetched from npm when the site was built"
    data = " ".join(f'{k}="{html_escape(v)}"' for k, v in attributes.items())
    panel = (
        f'<div id="{PANEL_ID}" class="attn-translator-panel" {data}>'
        "<p>The translator loads here (it needs JavaScript).</p></div>"
        f'<link rel="stylesheet" href="{pathto("_static/translator-panel/panel.css", 1)}">'
        f'<script src="{pathto("_static/translator-panel/panel.js", 1)}" defer></script>'
    )
    body = context["body"]
    placeholder = re.search(rf'<div[^>]*id="{PANEL_ID}"[^>]*>\s*</div>', body)
    if placeholder:  # the chapter says where (a raw-HTML cell with an empty <div id="attn-translator-panel">)
        context["body"] = body[: placeholder.start()] + panel + body[placeholder.end():]
        return
    section = (
        '<section id="try-the-translator-in-your-browser">'
        '<h2>Try it: the translator in your browser<a class="headerlink" href="#try-the-translator-in-your-browser" '
        'title="Link to this heading">#</a></h2>' + panel + "</section>"
    )
    exercises = re.search(r'<section id="exercises"', body)
    if exercises:
        context["body"] = body[: exercises.start()] + section + body[exercises.start():]
    else:
        context["body"] = body + section


_QUOTED = r"""\(\s*[rf]?(?:"([^"\n]+)"|'([^'\n]+)')"""


def _first_string(source: str, *calls: str) -> str:
    """The first string literal passed to one of ``calls`` (``set_title(...)`` or ``title=...``)."""
    for call in calls:
        pattern = (rf"\b{call}\s*=\s*[rf]?(?:\"([^\"\n]+)\"|'([^'\n]+)')" if call.endswith("=")
                   else rf"\b{call}" + _QUOTED)
        match = re.search(pattern.replace("=\\s*=", "="), source)
        if match:
            text = match.group(1) or match.group(2)
            text = re.sub(r"\{[^}]*\}", "…", text).replace("$", "").strip()
            if text:
                return text
    return ""


def derived_alt(source: str) -> str:
    """A text alternative for a figure drawn by ``source`` (a cell's code): its title and axes."""
    title = _first_string(source, "set_title", "suptitle", "title", "title=")
    xlabel = _first_string(source, "set_xlabel", "xlabel", "xlabel=")
    ylabel = _first_string(source, "set_ylabel", "ylabel", "ylabel=")
    parts = []
    if "plot_attention" in source:
        parts.append("Attention heatmap (one row per query, one column per key, with a colorbar)")
    if title:
        parts.append(f"Figure: {title}" if not parts else f"titled {title}")
    if xlabel:
        parts.append(f"horizontal axis: {xlabel}")
    if ylabel:
        parts.append(f"vertical axis: {ylabel}")
    if not parts:
        comment = next((line.strip("# ").strip() for line in source.splitlines() if line.strip().startswith("#")
                        and len(line.strip("# ").strip()) > 8 and not line.lstrip().startswith("#@")), "")
        parts.append(f"Figure drawn by the code above: {comment}" if comment else "Figure drawn by the code cell above")
    return "; ".join(parts)


def _figure_alt_texts(app, doctree, docname) -> None:
    """Every picture of a notebook cell gets a real alt text (see 5. above)."""
    from docutils import nodes

    for cell in doctree.findall(nodes.container):
        if cell.get("nb_element") != "cell_code":
            continue
        metadata = cell.get("cell_metadata") or {}
        image_options = (metadata.get("mystnb") or {}).get("image") or {}
        alt = str(image_options.get("alt", "")).strip()
        if not alt:
            source = "\n".join(block.astext() for block in cell.findall(nodes.literal_block)
                               if block.parent is not None and block.parent.get("nb_element") == "cell_code_source")
            alt = derived_alt(source)
        for image in cell.findall(nodes.image):
            if not image.get("alt") or image.get("alt") == image.get("uri"):
                image["alt"] = alt
        widgets = [raw for raw in cell.findall(nodes.raw) if "application/vnd.jupyter.widget-view+json" in raw.astext()]
        if widgets:
            cell.append(nodes.raw("", f'<span class="attn-figure-alt" hidden data-alt="{html_escape(alt)}"></span>', format="html"))


def html_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")


def setup(app):
    app.connect("config-inited", _configure, priority=100)
    app.connect("html-page-context", _page_scripts, priority=900)  # after myst-nb adds the scripts
    app.connect("html-page-context", _translator_panel, priority=950)
    app.connect("build-finished", _finish_translator_export)
    app.connect("doctree-resolved", _figure_alt_texts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
