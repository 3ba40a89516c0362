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
      var summary = details.querySelector("summary");
      if (summary) { summary.setAttribute("aria-label", "Show or hide the solution"); }
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
    watchWidgets();
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", onReady);
  } else {
    onReady();
  }
})();
