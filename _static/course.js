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

  function onReady() {
    mathjax2Shim();  // deferred scripts (MathJax) have run by now; the widgets render at "load"
    labelSolutions();
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", onReady);
  } else {
    onReady();
  }
})();
