// attn-course: small touches on every page (Jupyter Book injects every .js file in _static/).
// Solutions: cells tagged `solution` are collapsed (they also carry `hide-input`); label their
// toggle "Show solution" instead of myst-nb's generic "Show code cell source".
(function () {
  "use strict";
  function labelSolutions() {
    document.querySelectorAll(".cell.tag_solution details.above-input").forEach(function (details) {
      details.classList.add("attn-solution");
      var shown = details.querySelector("summary .collapsed");
      var hidden = details.querySelector("summary .expanded");
      if (shown) { shown.textContent = "Show solution"; }
      if (hidden) { hidden.textContent = "Hide solution"; }
    });
    // A solution's output that gives the answer away (tag hide-output) gets its own toggle.
    document.querySelectorAll(".cell.tag_solution details.below-input").forEach(function (details) {
      var shown = details.querySelector("summary .collapsed");
      var hidden = details.querySelector("summary .expanded");
      if (shown) { shown.textContent = "Show the solution's output"; }
      if (hidden) { hidden.textContent = "Hide the solution's output"; }
    });
  }

  // The ipywidgets embedder typesets widget labels with the MathJax 2 API (MathJax.Hub.Queue);
  // the site loads MathJax 3, which has no Hub: every label would raise an error. Translate.
  function mathjax2Shim() {
    var mathjax = window.MathJax;
    if (!mathjax || mathjax.Hub || typeof mathjax.typesetPromise !== "function") { return; }
    mathjax.Hub = {
      Queue: function () {
        Array.prototype.forEach.call(arguments, function (job) {
          if (Array.isArray(job) && job[0] === "Typeset" && job[2]) {
            var ready = mathjax.startup && mathjax.startup.promise ? mathjax.startup.promise : Promise.resolve();
            ready.then(function () { return mathjax.typesetPromise([job[2]]); }).catch(function (error) {
              console.warn("MathJax could not typeset a widget label:", error);
            });
          }
        });
      },
    };
  }

  // Accessibility of the explorables, which the ipywidgets embedder renders after "load":
  // - pictures get the text alternative of their cell (tools/site_assets.py writes it into a hidden
  //   span.attn-figure-alt), plus which setting of the controls they show;
  // - slider handles (role="slider") get the name of their slider's label;
  // - boxes that scroll can be reached with the keyboard (tabindex="0").
  function widgetAccessibility() {
    document.querySelectorAll(".cell").forEach(function (cell) {
      var holder = cell.querySelector(".attn-figure-alt");
      var alt = holder ? holder.getAttribute("data-alt") : "";
      cell.querySelectorAll("img.widget-image, .jupyter-widgets img").forEach(function (img, i, all) {
        if (img.getAttribute("alt")) { return; }
        var text = alt || "Picture of the explorable above";
        img.setAttribute("alt", all.length > 1 ? text + " (view " + (i + 1) + " of " + all.length + ", chosen with the controls)" : text);
      });
    });
    document.querySelectorAll(".noUi-handle").forEach(function (handle) {
      if (handle.getAttribute("aria-label") || handle.getAttribute("aria-labelledby")) { return; }
      var slider = handle.closest(".widget-slider, .widget-hslider, .jupyter-widgets");
      var label = slider && slider.querySelector(".widget-label");
      var name = label && label.textContent.trim();
      handle.setAttribute("aria-label", name || "slider");
    });
    var boxes = ".widget-box, .widget-container, .cell_output .output pre, .cell_output .output_html, " +
      "main pre, main .pst-scrollable-table-container, main .table-wrapper, main .math-wrapper, main mjx-container[display]";
    document.querySelectorAll(boxes).forEach(function (box) {
      if (box.hasAttribute("tabindex")) { return; }
      var style = window.getComputedStyle(box);
      var scrolls = /(auto|scroll)/.test(style.overflowX + style.overflowY) &&
        (box.scrollWidth > box.clientWidth + 1 || box.scrollHeight > box.clientHeight + 1);
      if (scrolls && !box.querySelector("a, button, input, select, textarea, [tabindex]")) {
        box.setAttribute("tabindex", "0");
      }
    });
  }

  // Label in name (WCAG 2.5.3): a control's accessible name must contain the text it shows, so that a
  // reader who says what they see ("click Show solution") reaches it. The theme's controls name
  // themselves otherwise:
  // - the search buttons show "Search Ctrl+K" (⌘K on a Mac) but were named "Search": their name now
  //   comes from what they show, and the shortcut is announced as such (aria-keyshortcuts);
  // - the colour-mode switch shows one icon titled "Light", "Dark" or "System Settings" but was
  //   named "Color mode": it is now "Color mode: Light" (and so on), kept up to date when it cycles;
  // - collapsed cells (solutions, hidden outputs) show "Show solution" or "Show the solution's
  //   output" but were named "Toggle hidden content": their name now comes from what they show
  //   (<summary> reports open or closed on its own).
  var MODE_NAMES = { light: "Light", dark: "Dark", auto: "System Settings" };

  function setAttribute(element, name, value) {
    if (element.getAttribute(name) !== value) { element.setAttribute(name, value); }
  }

  function visibleText(element) {
    return (element.innerText || "").replace(/\s+/g, " ").trim();
  }

  function labelInName() {
    document.querySelectorAll(".search-button-field").forEach(function (button) {
      if (!button.querySelector(".search-button__default-text")) { return; }  // an icon only: its aria-label stays
      button.removeAttribute("aria-label");
      var modifier = button.querySelector(".kbd-shortcut__modifier");
      setAttribute(button, "aria-keyshortcuts", modifier && modifier.textContent.trim() === "⌘" ? "Meta+K" : "Control+K");
    });
    document.querySelectorAll(".theme-switch-button").forEach(function (button) {
      var shown = Array.prototype.find.call(button.querySelectorAll(".theme-switch"), function (icon) {
        return window.getComputedStyle(icon).display !== "none";
      });
      var title = shown && (shown.getAttribute("title") || (shown.querySelector("title") || {}).textContent);
      var mode = title || MODE_NAMES[document.documentElement.dataset.mode] || "";
      setAttribute(button, "aria-label", mode ? "Color mode: " + mode.trim() : "Color mode");
    });
    document.querySelectorAll("main details > summary[aria-label]").forEach(function (summary) {
      var label = summary.getAttribute("aria-label").toLowerCase();
      var text = visibleText(summary).toLowerCase();
      if (text && label.indexOf(text) === -1) { summary.removeAttribute("aria-label"); }
    });
  }

  function watchHeader() {
    labelInName();
    // The switch cycles the mode (data-mode on <html>); Font Awesome swaps the icons for SVGs.
    if ("MutationObserver" in window) {
      new MutationObserver(labelInName).observe(document.documentElement, { attributes: true, attributeFilter: ["data-mode", "data-theme"] });
    }
    window.addEventListener("load", labelInName);
  }

  function watchWidgets() {
    widgetAccessibility();
    var pending = false;
    function schedule() {
      if (pending) { return; }
      pending = true;
      window.requestAnimationFrame(function () { pending = false; widgetAccessibility(); });
    }
    // A box starts to scroll when what it holds changes, and also when a picture in it finishes
    // loading or the window narrows, which change no element: look again then too.
    document.addEventListener("load", schedule, true);  // pictures' load events, caught on the way down
    window.addEventListener("resize", schedule);
    if ("MutationObserver" in window) {
      new MutationObserver(schedule).observe(document.body, { childList: true, subtree: true, attributes: true, attributeFilter: ["style", "class"] });
    }
  }

  function onReady() {
    mathjax2Shim();  // deferred scripts (MathJax) have run by now; the widgets render at "load"
    labelSolutions();
    watchHeader();
    watchWidgets();
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", onReady);
  } else {
    onReady();
  }
})();
