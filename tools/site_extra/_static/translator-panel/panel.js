// attn-course, chapter 07: the character-level translator, running in the reader's browser.
//
// The Sphinx extension (tools/site_assets.py) puts <div id="attn-translator-panel" data-...> on
// chapter 07's page only, with this script. The model is the one the chapter trains, exported to
// ONNX when the book is built (tools/export_translator.py): encoder.onnx (source ids -> memory) and
// decoder.onnx (memory, target prefix -> next-character logits, cross-attention of every layer and
// head). onnxruntime-web (WebAssembly, one thread) runs them; this script encodes the sentence,
// decodes greedily one character at a time (the most probable next character, as
// attn_course.translator.translate does) and draws the last step's cross-attention, which is the
// map translate(..., return_attention=True) returns.
//
// Everything is served by the site itself; the runtime (about 12 MB) is fetched only when the reader
// comes near the panel. window.attnTranslator exposes translate() for the browser test.
(function () {
  "use strict";

  var SPACE = "\u2423"; // ␣, how a space is shown on the heatmap's axes

  // ------------------------------------------------------------------ Python-compatible messages
  // The page shows the same message as attn_course.translator's ValueError, so it uses Python's repr.
  function pyRepr(text) {
    var quote = text.indexOf("'") >= 0 && text.indexOf('"') < 0 ? '"' : "'";
    var out = "";
    for (var i = 0; i < text.length; i++) {
      var c = text[i], code = text.charCodeAt(i);
      if (c === "\\") out += "\\\\";
      else if (c === quote) out += "\\" + c;
      else if (c === "\n") out += "\\n";
      else if (c === "\r") out += "\\r";
      else if (c === "\t") out += "\\t";
      else if (code < 0x20 || code === 0x7f) out += "\\x" + ("0" + code.toString(16)).slice(-2);
      else out += c;
    }
    return quote + out + quote;
  }

  function unknownMessage(sentence, missing, known) {
    return "sentences[0] = " + pyRepr(sentence) + " contains character(s) [" + missing.map(pyRepr).join(", ") +
      "] that the model never saw; it knows only " + pyRepr(known);
  }

  // ------------------------------------------------------------------ the model
  var state = { meta: null, encoder: null, decoder: null, loading: null, base: "", ortDir: "", ortSrc: "" };

  function loadScript(src) {
    return new Promise(function (resolve, reject) {
      var script = document.createElement("script");
      script.src = src;
      script.onload = resolve;
      script.onerror = function () { reject(new Error("could not load " + src)); };
      document.head.appendChild(script);
    });
  }

  function absolute(url) { return new URL(url, document.baseURI).href; }

  function load() {
    if (state.loading) return state.loading;
    state.loading = fetch(state.base + "model.json")
      .then(function (response) {
        if (!response.ok) throw new Error("the model's description (model.json) is missing: HTTP " + response.status);
        return response.json();
      })
      .then(function (meta) {
        state.meta = meta;
        if (!meta.available) {
          var error = new Error(meta.reason || "the model was not exported when the site was built");
          error.unavailable = true;
          throw error;
        }
        return window.ort ? null : loadScript(state.ortSrc);
      })
      .then(function () {
        var ort = window.ort;
        ort.env.logLevel = "error";       // its warnings would land in the console as errors
        ort.env.wasm.numThreads = 1;      // no SharedArrayBuffer needed; the model is small
        ort.env.wasm.proxy = false;
        ort.env.wasm.wasmPaths = absolute(state.ortDir);
        var options = { executionProviders: ["wasm"], graphOptimizationLevel: "all" };
        return Promise.all([
          ort.InferenceSession.create(state.base + state.meta.files.encoder.name, options),
          ort.InferenceSession.create(state.base + state.meta.files.decoder.name, options),
        ]);
      })
      .then(function (sessions) {
        state.encoder = sessions[0];
        state.decoder = sessions[1];
        var meta = state.meta;
        meta.sourceIds = {};
        meta.source_characters.forEach(function (c, i) { meta.sourceIds[c] = i + 3; });
        meta.targetSymbols = ["<pad>", "<s>", "</s>"].concat(meta.target_characters);
        return meta;
      });
    state.loading.catch(function () {}); // reported by whoever awaits it
    return state.loading;
  }

  // The checks of Translator.encode_sources, with its messages; null when the sentence is fine.
  function checkSentence(sentence, meta) {
    var missing = [];
    Array.from(sentence).forEach(function (c) {
      if (!(c in meta.sourceIds) && missing.indexOf(c) < 0) missing.push(c);
    });
    if (missing.length) return unknownMessage(sentence, missing, meta.source_characters.join(""));
    var length = Array.from(sentence).length;
    if (length + 2 > meta.max_len) {
      return "sentences[0] has " + length + " characters, but this model reads at most max_len - 2 = " + (meta.max_len - 2);
    }
    return null;
  }

  function int64(ids) {
    return new window.ort.Tensor("int64", BigInt64Array.from(ids.map(function (i) { return BigInt(i); })), [1, ids.length]);
  }

  function argmax(values) { // the first maximum, as torch.argmax
    var best = 0;
    for (var i = 1; i < values.length; i++) if (values[i] > values[best]) best = i;
    return best;
  }

  // Greedy decoding, one character at a time. Returns {translation, source, target, cross, ...}
  // or throws an Error whose .userMessage is the Python ValueError's text.
  async function translate(sentence) {
    var meta = await load();
    var problem = checkSentence(sentence, meta);
    if (problem) {
      var error = new Error(problem);
      error.userMessage = problem;
      throw error;
    }
    var start = performance.now();
    var source = Array.from(sentence);
    var sourceIds = source.map(function (c) { return meta.sourceIds[c]; });
    var memory = (await state.encoder.run({ src: int64(sourceIds) })).memory; // (1, S, E)
    var prefix = [meta.special.start], cross = null;
    for (var step = 0; step < meta.max_len - 1; step++) {
      var out = await state.decoder.run({ memory: memory, tgt: int64(prefix) });
      var next = argmax(out.next_logits.data); // (1, V)
      cross = out.cross_attention;             // (1, layers, H, T, S)
      prefix.push(next);
      if (next === meta.special.end) break;
    }
    var generated = prefix.slice(1);
    var text = "";
    for (var i = 0; i < generated.length; i++) { // as CharVocab.decode: skip pad/start, stop at end
      if (generated[i] === meta.special.end) break;
      if (generated[i] === meta.special.pad || generated[i] === meta.special.start) continue;
      text += meta.targetSymbols[generated[i]];
    }
    var dims = cross.dims;
    return {
      sentence: sentence,
      translation: text,
      source: source,
      target: generated.map(function (id) { return meta.targetSymbols[id]; }),
      layers: dims[1], heads: dims[2], T: dims[3], S: dims[4],
      cross: cross.data, // Float32Array, (layers, H, T, S) row-major
      ms: performance.now() - start,
    };
  }

  // ------------------------------------------------------------------ the heatmap
  var BLUES = [[255, 255, 255], [198, 219, 239], [107, 174, 214], [33, 113, 181], [8, 48, 107]];

  function colour(t) { // 0 -> white, 1 -> dark blue
    t = Math.max(0, Math.min(1, t)) * (BLUES.length - 1);
    var i = Math.min(BLUES.length - 2, Math.floor(t)), f = t - i, a = BLUES[i], b = BLUES[i + 1];
    return "rgb(" + [0, 1, 2].map(function (k) { return Math.round(a[k] + f * (b[k] - a[k])); }).join(",") + ")";
  }

  function label(c) { return c === " " ? SPACE : c; }

  function mapOf(result, layer, head) {
    var size = result.T * result.S, offset = (layer * result.heads + head) * size;
    return result.cross.subarray(offset, offset + size);
  }

  function draw(canvas, result, layer, head, available) {
    var weights = mapOf(result, layer, head), T = result.T, S = result.S;
    var maximum = 0;
    for (var i = 0; i < weights.length; i++) maximum = Math.max(maximum, weights[i]);
    var left = 34, top = 8, barGap = 14, barWidth = 10, barLabels = 34, bottom = 40;
    var cell = Math.floor((available - left - barGap - barWidth - barLabels) / S);
    cell = Math.max(10, Math.min(16, cell)); // legible labels; narrow screens scroll the map sideways
    var width = left + S * cell + barGap + barWidth + barLabels, height = top + T * cell + bottom;
    var ratio = window.devicePixelRatio || 1;
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    canvas.style.width = width + "px";
    canvas.style.height = height + "px";
    var ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.fillStyle = "#ffffff";
    ctx.fillRect(0, 0, width, height);
    for (var t = 0; t < T; t++) {
      for (var s = 0; s < S; s++) {
        ctx.fillStyle = colour(maximum > 0 ? weights[t * S + s] / maximum : 0);
        ctx.fillRect(left + s * cell, top + t * cell, cell, cell);
      }
    }
    ctx.fillStyle = "#1a1a1a";
    ctx.font = Math.max(8, Math.min(12, cell - 2)) + "px monospace";
    ctx.textAlign = "center";
    ctx.textBaseline = "middle";
    result.source.forEach(function (c, s) { ctx.fillText(label(c), left + s * cell + cell / 2, top + T * cell + 8); });
    ctx.textAlign = "right";
    result.target.forEach(function (c, t) { ctx.fillText(c === "</s>" ? "end" : label(c), left - 4, top + t * cell + cell / 2); });
    ctx.font = "11px sans-serif";
    ctx.textAlign = "left";
    ctx.fillText("English characters (keys) \u2192", left, top + T * cell + 26);
    // Colorbar: 0 to the largest weight of this map.
    var barLeft = left + S * cell + barGap, barHeight = T * cell;
    for (var y = 0; y < barHeight; y++) {
      ctx.fillStyle = colour(1 - y / Math.max(1, barHeight - 1));
      ctx.fillRect(barLeft, top + y, barWidth, 1);
    }
    ctx.strokeStyle = "#1a1a1a";
    ctx.strokeRect(barLeft, top, barWidth, barHeight);
    ctx.fillStyle = "#1a1a1a";
    ctx.textBaseline = "top";
    ctx.fillText(maximum.toFixed(2), barLeft + barWidth + 3, top);
    ctx.textBaseline = "bottom";
    ctx.fillText("0", barLeft + barWidth + 3, top + barHeight);
    return maximum;
  }

  function describe(result, layer, head, maximum) {
    var weights = mapOf(result, layer, head), parts = [];
    for (var t = 0; t < result.T; t++) {
      var row = weights.subarray(t * result.S, (t + 1) * result.S), best = argmax(row);
      var out = result.target[t] === "</s>" ? "end" : label(result.target[t]);
      parts.push(out + " \u2190 " + label(result.source[best]) + " (position " + (best + 1) + ")");
    }
    return "Heatmap of the cross-attention of decoder layer " + (layer + 1) + ", head " + (head + 1) +
      ": one row per French character produced (" + result.T + " rows), one column per English character (" +
      result.S + " columns); darker means more weight, colours scaled from 0 to this map's largest weight, " +
      maximum.toFixed(2) + ". The English character each French character attends to most: " + parts.join("; ") + ".";
  }

  // ------------------------------------------------------------------ suggestions from the lexicon
  function nextWords(text, lexicon) {
    var words = text.split(" ");
    var partial = words.pop();
    var done = words.filter(function (w) { return w.length; });
    var articles = lexicon.articles, adjectives = lexicon.adjectives, nouns = lexicon.nouns, verbs = lexicon.verbs;
    var expected = articles, lastArticle = null, phase = 0; // 0 article, 1 adj/noun, 2 noun, 3 verb, 4 end
    var nounPhrases = 0;
    for (var i = 0; i < done.length; i++) {
      var w = done[i];
      if (phase === 0 && articles.indexOf(w) >= 0) { phase = 1; lastArticle = w; }
      else if (phase === 1 && adjectives.indexOf(w) >= 0) { phase = 2; lastArticle = null; }
      else if ((phase === 1 || phase === 2) && nouns.indexOf(w) >= 0) { nounPhrases += 1; phase = nounPhrases === 1 ? 3 : 4; }
      else if (phase === 3 && verbs.indexOf(w) >= 0) { phase = 0; }
      else return { words: [], partial: partial };
    }
    if (phase === 1) expected = adjectives.concat(nouns);
    else if (phase === 2) expected = nouns;
    else if (phase === 3) expected = verbs;
    else if (phase === 4) expected = [];
    if (phase === 1 && lastArticle === "a") expected = expected.filter(function (w) { return "aeiou".indexOf(w[0]) < 0; });
    if (phase === 1 && lastArticle === "an") expected = expected.filter(function (w) { return "aeiou".indexOf(w[0]) >= 0; });
    return {
      words: expected.filter(function (w) { return w.indexOf(partial) === 0 && w !== partial; }).concat(
        expected.indexOf(partial) >= 0 ? [partial] : []).filter(function (w, i, all) { return all.indexOf(w) === i; }),
      partial: partial,
      complete: phase === 4 && partial === "",
    };
  }

  // ------------------------------------------------------------------ the panel
  var EXAMPLES = ["the red cat sees a small dog", "a happy girl draws the big tree", "the young woman follows an elephant",
                  "an elephant likes the green apple", "the small boy eats a white orange"];

  function element(tag, attributes, text) {
    var node = document.createElement(tag);
    Object.keys(attributes || {}).forEach(function (k) { node.setAttribute(k, attributes[k]); });
    if (text) node.textContent = text;
    return node;
  }

  function unavailableIn(root, reason) {
    root.setAttribute("data-state", "unavailable");
    root.innerHTML = "";
    root.append(element("p", { class: "attn-tr-error", role: "status" },
      "The in-browser translator is unavailable on this copy of the site: " + reason +
      ". Run the chapter's notebook to try the model (Colab or Binder, from the rocket button at the top)."));
  }

  function build(root) {
    state.base = root.getAttribute("data-model-dir");
    state.ortDir = root.getAttribute("data-ort-dir");
    state.ortSrc = root.getAttribute("data-ort-src");
    root.innerHTML = "";
    if (root.hasAttribute("data-unavailable")) { unavailableIn(root, root.getAttribute("data-unavailable")); return; }
    var intro = element("p", {}, "Type an English sentence of the chapter's toy language (lowercase; suggestions " +
      "below follow its grammar). The model this chapter trains translates it here, in your browser, one character at a time " +
      "(greedy decoding), with no server: the runtime and the model, about 13 MB, come from this site the first time.");
    var form = element("form", { class: "attn-tr-form", novalidate: "" });
    var inputLabel = element("label", { for: "attn-tr-input" }, "English sentence");
    var row = element("div", { class: "attn-tr-row" });
    var input = element("input", { id: "attn-tr-input", type: "text", autocomplete: "off", autocapitalize: "none",
      spellcheck: "false", inputmode: "text", "aria-describedby": "attn-tr-hint", value: EXAMPLES[0] });
    var button = element("button", { type: "submit", class: "attn-tr-button" }, "Translate");
    row.append(input, button);
    var hint = element("p", { id: "attn-tr-hint", class: "attn-tr-hint" },
      "Press Enter or the Translate button. The suggested next words are buttons; Tab reaches them.");
    var suggestions = element("div", { class: "attn-tr-suggestions", role: "group", "aria-label": "Suggested next words" });
    var example = element("button", { type: "button", class: "attn-tr-example" }, "Another example");
    form.append(inputLabel, row, hint, suggestions);

    var status = element("p", { class: "attn-tr-status", role: "status", "aria-live": "polite" });
    var error = element("p", { class: "attn-tr-error", role: "alert", hidden: "" });
    var result = element("div", { class: "attn-tr-result", hidden: "" });
    var outLabel = element("p", { class: "attn-tr-out-label", id: "attn-tr-out-label" }, "French translation:");
    var output = element("output", { class: "attn-tr-output", lang: "fr", for: "attn-tr-input", "aria-labelledby": "attn-tr-out-label" });
    var controls = element("div", { class: "attn-tr-controls" });
    var layerLabel = element("label", { for: "attn-tr-layer" }, "Decoder layer");
    var layerSelect = element("select", { id: "attn-tr-layer" });
    var headLabel = element("label", { for: "attn-tr-head" }, "Head");
    var headSelect = element("select", { id: "attn-tr-head" });
    controls.append(layerLabel, layerSelect, headLabel, headSelect);
    var figure = element("figure", { class: "attn-tr-figure" });
    var scroller = element("div", { class: "attn-tr-scroll", tabindex: "0", role: "region", "aria-label": "Cross-attention heatmap (scrolls sideways on narrow screens)" });
    var canvas = element("canvas", { role: "img", class: "attn-tr-canvas" });
    var caption = element("figcaption", {}, "Cross-attention: each row is one decoding step (the French character it produced, " +
      "\u201cend\u201d for the end symbol), each column an English character (" + SPACE + " is a space). " +
      "Colours are scaled to this map: from 0 (white) to its largest weight (dark blue), as the colorbar says.");
    scroller.append(canvas);
    figure.append(scroller, caption);
    result.append(outLabel, output, controls, figure);
    root.append(intro, form, example, status, error, result);

    var last = null;

    function redraw() {
      if (!last) return;
      var layer = Number(layerSelect.value), head = Number(headSelect.value);
      var available = Math.max(280, scroller.clientWidth || root.clientWidth || 600);
      var maximum = draw(canvas, last, layer, head, available);
      canvas.setAttribute("aria-label", describe(last, layer, head, maximum));
    }

    function fillSelect(select, count, current) {
      if (select.options.length === count) return;
      select.innerHTML = "";
      for (var i = 0; i < count; i++) select.append(element("option", { value: String(i) }, String(i + 1)));
      select.value = String(Math.min(current, count - 1));
    }

    function renderSuggestions() {
      suggestions.innerHTML = "";
      if (!state.meta || !state.meta.lexicon) return;
      var next = nextWords(input.value.toLowerCase(), state.meta.lexicon);
      if (next.complete || nextWords(input.value.toLowerCase() + " ", state.meta.lexicon).complete) {
        suggestions.append(element("span", { class: "attn-tr-note" }, "A complete sentence: translate it."));
        return;
      }
      next.words.slice(0, 30).forEach(function (word) {
        var chip = element("button", { type: "button", class: "attn-tr-chip" }, word);
        chip.addEventListener("click", function () {
          var text = input.value;
          var cut = text.length - next.partial.length;
          var chosen = text.slice(0, cut) + word;
          input.value = nextWords(chosen + " ", state.meta.lexicon).complete ? chosen : chosen + " ";
          input.focus();
          renderSuggestions();
        });
        suggestions.append(chip);
      });
    }

    function setBusy(busy) {
      button.disabled = busy;
      root.setAttribute("data-state", busy ? "busy" : root.getAttribute("data-state") === "busy" ? "done" : root.getAttribute("data-state") || "idle");
    }

    function showError(message) {
      error.hidden = false;
      error.textContent = "ValueError: " + message;
      result.hidden = true;
      status.textContent = "";
    }

    async function run() {
      var sentence = input.value;
      error.hidden = true;
      if (!sentence.trim()) {
        showError("type an English sentence first");
        root.setAttribute("data-state", "error");
        return;
      }
      setBusy(true);
      status.textContent = state.encoder ? "Translating\u2026" : "Loading the model (first time only)\u2026";
      try {
        last = await translate(sentence);
        window.attnTranslator.last = last;
        output.textContent = last.translation;
        fillSelect(layerSelect, last.layers, 0);
        fillSelect(headSelect, last.heads, 0);
        result.hidden = false;
        redraw();
        status.textContent = "Translated in " + Math.round(last.ms) + " ms: " + last.translation;
        root.setAttribute("data-state", "done");
      } catch (problem) {
        if (problem.unavailable) {
          unavailable(problem.message);
        } else {
          showError(problem.userMessage || String(problem.message || problem));
          root.setAttribute("data-state", problem.userMessage ? "error" : "failed");
          if (!problem.userMessage) console.warn("translator panel:", problem);
        }
      } finally {
        button.disabled = false;
      }
    }

    function unavailable(reason) { unavailableIn(root, reason); }

    form.addEventListener("submit", function (event) { event.preventDefault(); run(); });
    input.addEventListener("input", renderSuggestions);
    layerSelect.addEventListener("change", redraw);
    headSelect.addEventListener("change", redraw);
    example.addEventListener("click", function () {
      var i = (EXAMPLES.indexOf(input.value) + 1) % EXAMPLES.length;
      input.value = EXAMPLES[i];
      renderSuggestions();
      run();
    });
    window.addEventListener("resize", function () { window.requestAnimationFrame(redraw); });

    function warmUp() {
      load().then(renderSuggestions, function (problem) { if (problem.unavailable) unavailable(problem.message); });
    }
    input.addEventListener("focus", warmUp, { once: true });
    if ("IntersectionObserver" in window) {
      var observer = new IntersectionObserver(function (entries) {
        if (entries.some(function (e) { return e.isIntersecting; })) { observer.disconnect(); warmUp(); }
      }, { rootMargin: "300px" });
      observer.observe(root);
    } else {
      warmUp();
    }
    root.setAttribute("data-state", "idle");
  }

  window.attnTranslator = {
    translate: translate,
    load: load,
    pyRepr: pyRepr,
    last: null,
  };

  function start() {
    var root = document.getElementById("attn-translator-panel");
    if (root) build(root);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
