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
4. lets ``ATTN_COURSE_EXECUTE=off`` (or ``cache``, ``force``) override ``execute_notebooks``, so that the
   browser test can build the site from the committed, executed notebooks without running them again.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

from sphinx.util import logging
from sphinx.util.console import bold

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import vendor_assets  # noqa: E402  (tools/vendor_assets.py)

logger = logging.getLogger(__name__)
EXECUTION_MODES = ("off", "auto", "cache", "force", "inline")


def _configure(app, config) -> None:
    mode = os.environ.get("ATTN_COURSE_EXECUTE")
    if mode:
        if mode not in EXECUTION_MODES:
            raise ValueError(f"ATTN_COURSE_EXECUTE must be one of {EXECUTION_MODES}, got {mode!r}")
        config.nb_execution_mode = mode
        logger.info(bold(f"[site_assets] notebook execution: {mode} (from ATTN_COURSE_EXECUTE)"))

    app.attn_course_local_assets = vendor_assets.ensure(quiet=True)
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


def setup(app):
    app.connect("config-inited", _configure, priority=100)
    app.connect("html-page-context", _page_scripts, priority=900)  # after myst-nb adds the scripts
    return {"parallel_read_safe": True, "parallel_write_safe": True}
