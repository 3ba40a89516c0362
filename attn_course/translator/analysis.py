"""Chapter 07, sections 6 and 7: reading the translator's attention maps.

The maps come from ``translate(model, sentences, return_attention=True)``: per sentence a dict with
the characters ``"source"``, ``"target"`` (what was generated, end symbol included) and
``"decoder_input"`` (the start symbol, then ``target[:-1]``), and the weights ``"encoder"``
``(layers, H, S, S)``, ``"self"`` ``(layers, H, T, T)`` and ``"cross"`` ``(layers, H, T, S)``.
Query row ``t`` of ``"self"`` and ``"cross"`` is the decoding step that read ``decoder_input[t]``
and wrote ``target[t]``.

- :func:`words_of` splits characters into words; :func:`word_attention` sums a cross-attention map
  into a (French word, English word) table, read at the step that writes each French word's first
  letter (where the decoder chooses the next word);
- :func:`alignment_scores` counts, per layer and head, how often that table points at the English
  word that the French word translates, and what uniform attention would score on the same words
  (the metric's chance level: summing over a word's characters favours long words);
- :func:`reordering_scores` counts, per head, how often it tells a noun from the adjective that
  French puts after it (the noun's step on the noun, the adjective's on the adjective);
- :func:`entropy_share` measures how even a head's rows are (1 = a plain average);
  :func:`word_start_entropy` splits that between the steps that start a word and the others;
- :func:`word_ticks`, :func:`visible_spaces` and :func:`attention_grid` draw the maps legibly;
- :func:`first_wrong_character` finds where a wrong translation first leaves the right one, and what
  kind of place that is (a word's first letter, an article's second letter, a word's end, inside a word).
"""

from __future__ import annotations

from typing import Sequence

import torch

from .._checks import describe
from .language import DEFAULT_LEXICON, Lexicon
from .vocab import CharVocab

__all__ = ["words_of", "word_attention", "word_dictionary", "alignment_scores", "reordering_scores", "entropy_share",
           "word_start_entropy", "word_ticks", "visible_spaces", "attention_grid", "first_wrong_character",
           "MISTAKE_PLACES"]


def _symbols(name: str, symbols) -> list[str]:
    if isinstance(symbols, str) or not isinstance(symbols, (list, tuple)) or not all(isinstance(s, str) for s in symbols):
        raise TypeError(f"{name} must be a list of symbols (str), such as attention['target'], got {describe(symbols)}")
    return list(symbols)


def words_of(symbols: Sequence[str]) -> list[tuple[str, int, int]]:
    """The words of a list of characters, split at spaces, as ``(word, first index, end index)``.

    Special symbols (``<s>``, ``</s>``, ``<pad>``) are not part of any word and are skipped; the
    indices point into ``symbols``. ``["l", "e", " ", "c", "h", "a", "t", "</s>"]`` gives
    ``[("le", 0, 2), ("chat", 3, 7)]``.
    """
    symbols = _symbols("symbols", symbols)
    spans, first = [], None
    for i, symbol in enumerate([*symbols, " "]):
        is_letter = len(symbol) == 1 and symbol != " "
        if is_letter and first is None:
            first = i
        elif not is_letter and first is not None:
            spans.append(("".join(symbols[first:i]), first, i))
            first = None
    return spans


MISTAKE_PLACES = ("a word's first letter", "an article's second letter", "a word's end", "inside a word")
_FRENCH_ARTICLES = ("le", "la", "un", "une")


def first_wrong_character(expected: str, got: str) -> tuple[int, str]:
    """Where a translation first differs from the right one, and what kind of place that is.

    The index is that of the first character where ``got`` leaves ``expected`` (the length of the
    shorter string if one is a prefix of the other: there one stopped and the other went on). The
    place is one of :data:`MISTAKE_PLACES`, read in ``expected``:

    - ``"a word's first letter"``: where the decoder chooses the next word;
    - ``"an article's second letter"``: where *le*, *la* and the elided *l'* part (or *un*/*une*'s *n*);
    - ``"a word's end"``: ``expected`` has a space or its end there (a word was cut short or ran on);
    - ``"inside a word"``: anywhere else.

    ``first_wrong_character("le chien bleu", "le chien")`` is ``(8, "a word's end")``;
    ``first_wrong_character("la bonne orange", "l'orange")`` is ``(1, "an article's second letter")``.
    """
    for name, text in (("expected", expected), ("got", got)):
        if not isinstance(text, str):
            raise TypeError(f"{name} must be a string (a French sentence), got {describe(text)}")
    if expected == got:
        raise ValueError(f"expected and got are the same sentence ({expected!r}): there is no wrong character")
    i = next((k for k, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
    if i == len(expected) or expected[i] == " ":
        return i, MISTAKE_PLACES[2]
    start = expected.rfind(" ", 0, i) + 1  # the first letter of the word of ``expected`` that holds index i
    end = expected.find(" ", i)
    word = expected[start: len(expected) if end < 0 else end]
    if i == start:
        return i, MISTAKE_PLACES[0]
    if i == start + 1 and (word in _FRENCH_ARTICLES or word.startswith("l'")):
        return i, MISTAKE_PLACES[1]
    return i, MISTAKE_PLACES[3]


def word_attention(weights: torch.Tensor, target: Sequence[str], source: Sequence[str]):
    """A cross-attention map read word by word, at the step that writes each target word's first letter.

    Args:
        weights: ``(T, S)`` weights of one head (or a mean of heads); row ``t`` wrote ``target[t]``.
        target: the generated characters (``attention["target"]``).
        source: the source characters (``attention["source"]``).

    Returns:
        ``(table, target_words, source_words)``: ``table[i, j]`` is the weight that the step writing
        the first letter of target word ``i`` gave to the characters of source word ``j``, summed.

    Shape:
        weights ``(T, S)`` -> table ``(target words, source words)``
    """
    target, source = _symbols("target", target), _symbols("source", source)
    w = torch.as_tensor(weights).detach().float().cpu()
    if w.dim() != 2 or w.shape != (len(target), len(source)):
        raise ValueError(f"weights must be (T, S) = ({len(target)}, {len(source)}) for these symbols, "
                         f"got shape {tuple(w.shape)}")
    target_words, source_words = words_of(target), words_of(source)
    table = torch.stack([torch.stack([w[t0, s0:s1].sum() for _, s0, s1 in source_words])
                         for _, t0, _ in target_words]) if target_words and source_words else torch.zeros(
        len(target_words), len(source_words))
    return table, [word for word, _, _ in target_words], [word for word, _, _ in source_words]


def word_dictionary(lexicon: Lexicon = DEFAULT_LEXICON) -> dict[str, str]:
    """French word -> the English word it translates, for the nouns, verbs and both forms of each adjective."""
    if not isinstance(lexicon, Lexicon):
        raise TypeError(f"lexicon must be a Lexicon, got {describe(lexicon)}")
    table = {french: english for english, (french, _) in lexicon.nouns.items()}
    table.update({french: english for english, french in lexicon.verbs.items()})
    for english, (masculine, feminine, _) in lexicon.adjectives.items():
        table.update({masculine: english, feminine: english})
    return table


def alignment_scores(maps: Sequence[dict], *, lexicon: Lexicon = DEFAULT_LEXICON) -> dict:
    """How often each cross-attention head points at the right English word, and what chance gives.

    For every French noun, verb and adjective of every sentence, the step that writes the word's first
    letter is read with :func:`word_attention`, and the English word with the most attention counts as
    the head's choice. Give only maps of correct translations: the grammar then says which word is
    right. Articles are left out: their form depends on the noun too, *l'* is written fused with the
    noun as one word, and *the* often occurs twice in a sentence, so which English word is right for
    them is not clear-cut.

    Args:
        maps: attention dicts of ``translate(..., return_attention=True)``.
        lexicon: the words (which French word translates which English one).

    Returns:
        A dict with ``"heads"``, a ``(layers, H + 1)`` tensor of shares right (the last column is
        the mean of the layer's heads); ``"total"``, the number of French words scored;
        ``"repeated"``, how many of those have an English word that occurs twice in the sentence (*orange*
        in *the green orange finds the blue orange*), where the word at either place counts as right; and
        ``"uniform"``, the share that uniform attention over the source characters gets with the
        same metric. Summing over a word's characters makes uniform attention choose the longest
        English word, which is right more often than one word in six: that, not 1/6, is the chance
        level of this metric.
    """
    if isinstance(maps, dict) or not isinstance(maps, (list, tuple)) or not maps:
        raise ValueError(f"maps must be a non-empty list of attention dicts, got {describe(maps)}")
    dictionary = word_dictionary(lexicon)
    layers, heads = maps[0]["cross"].shape[:2]
    hits = torch.zeros(layers, heads + 1)
    uniform_hits, total, repeated = 0, 0, 0
    for attention in maps:
        cross = attention["cross"]  # (layers, H, T, S)
        target, source = attention["target"], attention["source"]
        wanted = []  # (index among the target's words, the right English word)
        for i, (word, _, _) in enumerate(words_of(target)):
            word = word.split("'")[-1]  # l'arbre -> arbre
            if word in dictionary:
                wanted.append((i, dictionary[word]))
        if not wanted:
            continue
        total += len(wanted)
        english = [word for word, _, _ in words_of(source)]
        repeated += sum(english.count(right) > 1 for _, right in wanted)
        uniform = torch.full((len(target), len(source)), 1.0 / len(source))
        table, _, english_words = word_attention(uniform, target, source)
        uniform_hits += sum(english_words[int(table[i].argmax())] == right for i, right in wanted)
        for layer in range(layers):
            for head in range(heads + 1):
                weights = cross[layer].mean(dim=0) if head == heads else cross[layer, head]  # (T, S)
                table, _, english_words = word_attention(weights, target, source)
                hits[layer, head] += sum(english_words[int(table[i].argmax())] == right for i, right in wanted)
    if total == 0:
        raise ValueError("maps hold no French noun, verb or adjective of the lexicon to score")
    return {"heads": hits / total, "total": total, "repeated": repeated, "uniform": uniform_hits / total}


def reordering_scores(maps: Sequence[dict], *, lexicon: Lexicon = DEFAULT_LEXICON) -> dict:
    """Per head: how often it tells a noun from the adjective that French puts after it.

    For every French noun followed by its post-nominal adjective (*chien noir*, where English has *black
    dog*), the head's choice is read as in :func:`alignment_scores` at the step that writes the noun's
    first letter and at the step that writes the adjective's. The head *separates* the two when the
    first points at the English noun and the second at the English adjective. Uniform attention never
    does: both of its rows choose the same English word (the longest).

    Args:
        maps: attention dicts of correct translations (``translate(..., return_attention=True)``).
        lexicon: the words.

    Returns:
        A dict with ``"both"``, ``"noun"``, ``"adjective"`` and ``"same"``, ``(layers, H + 1)`` tensors
        of shares (the last column is the mean of the layer's heads): both steps right, the noun's step
        right, the adjective's step right, and both steps on the same English word (the phrase read as
        one unit); ``"total"``, the number of such phrases; and ``"uniform"``, the share that uniform
        attention separates (0).
    """
    if isinstance(maps, dict) or not isinstance(maps, (list, tuple)) or not maps:
        raise ValueError(f"maps must be a non-empty list of attention dicts, got {describe(maps)}")
    dictionary = word_dictionary(lexicon)
    after = {form for masculine, feminine, position in lexicon.adjectives.values() if position == "after"
             for form in (masculine, feminine)}
    layers, heads = maps[0]["cross"].shape[:2]
    counts = {key: torch.zeros(layers, heads + 1) for key in ("both", "noun", "adjective", "same")}
    uniform_both, total = 0, 0
    for attention in maps:
        target, source = attention["target"], attention["source"]
        words = [word.split("'")[-1] for word, _, _ in words_of(target)]  # l'orange -> orange
        phrases = [(i, i + 1) for i in range(len(words) - 1)
                   if dictionary.get(words[i]) in lexicon.nouns and words[i + 1] in after]
        if not phrases:
            continue
        total += len(phrases)

        def right(table, english_words, i):
            return english_words[int(table[i].argmax())] == dictionary[words[i]]
        uniform = torch.full((len(target), len(source)), 1.0 / len(source))
        table, _, english_words = word_attention(uniform, target, source)
        uniform_both += sum(right(table, english_words, i) and right(table, english_words, j) for i, j in phrases)
        for layer in range(layers):
            for head in range(heads + 1):
                weights = attention["cross"][layer].mean(dim=0) if head == heads else attention["cross"][layer, head]
                table, _, english_words = word_attention(weights, target, source)
                for i, j in phrases:
                    noun, adjective = right(table, english_words, i), right(table, english_words, j)
                    counts["noun"][layer, head] += noun
                    counts["adjective"][layer, head] += adjective
                    counts["both"][layer, head] += noun and adjective
                    counts["same"][layer, head] += int(table[i].argmax()) == int(table[j].argmax())
    if total == 0:
        raise ValueError("maps hold no French noun followed by a post-nominal adjective")
    return {**{key: value / total for key, value in counts.items()}, "total": total, "uniform": uniform_both / total}


def word_start_entropy(maps: Sequence[dict]) -> dict:
    """The cross-attention's :func:`entropy_share` at the steps that write a word's first letter, and at
    the other steps (the rest of each word, the spaces and the end symbol), averaged over the maps.

    Returns:
        A dict with ``"first"`` and ``"other"``, ``(layers, H)`` tensors.

    Shape:
        each map's ``"cross"`` ``(layers, H, T, S)`` -> ``(layers, H)`` twice
    """
    if isinstance(maps, dict) or not isinstance(maps, (list, tuple)) or not maps:
        raise ValueError(f"maps must be a non-empty list of attention dicts, got {describe(maps)}")
    first, other = [], []
    for attention in maps:
        cross = attention["cross"]  # (layers, H, T, S)
        starts = torch.zeros(cross.size(2), dtype=torch.bool)
        starts[[t0 for _, t0, _ in words_of(attention["target"])]] = True
        if cross.size(-1) < 2 or not bool(starts.any()) or bool(starts.all()):
            continue
        first.append(entropy_share(cross[:, :, starts]))  # (layers, H)
        other.append(entropy_share(cross[:, :, ~starts]))
    if not first:
        raise ValueError("maps hold no translation with both first-letter steps and other steps")
    return {"first": torch.stack(first).mean(0), "other": torch.stack(other).mean(0)}


def entropy_share(weights: torch.Tensor, *, causal: bool = False) -> torch.Tensor:
    """Each head's row entropy as a share of an even row's, averaged over the rows that have a choice.

    The entropy ``-sum_j a_j ln a_j`` of a row is 0 when all its weight is on one key and ``ln n``
    when it is spread evenly over the ``n`` keys the row may see (``n = t + 1`` for row ``t`` of a
    causal map); rows that see a single key are left out.

    Shape:
        weights ``(..., L, S)`` -> ``(...)``
    """
    if not isinstance(weights, torch.Tensor) or weights.dim() < 2:
        raise ValueError(f"weights must be a tensor (..., L, S), got {describe(weights)}")
    L, S = weights.shape[-2:]
    visible = torch.arange(1, L + 1).clamp(max=S) if causal else torch.full((L,), S)  # keys each row may see
    rows = visible > 1
    if not bool(rows.any()):
        raise ValueError(f"no row of these (L, S) = ({L}, {S}) weights sees more than one key")
    entropy = -(weights * weights.clamp_min(1e-12).log()).sum(-1)  # (..., L)
    return (entropy[..., rows] / visible[rows].log().to(entropy.dtype)).mean(-1)


def visible_spaces(symbols: Sequence[str]) -> list[str]:
    """The symbols with each space shown as ``␣``, for axis labels."""
    return ["␣" if s == " " else s for s in _symbols("symbols", symbols)]


def word_ticks(symbols: Sequence[str]) -> tuple[list[float], list[str]]:
    """Tick positions and labels for a long axis of characters: one tick in the middle of each word.

    A special symbol (``<s>``, ``</s>``) gets a tick of its own when there is room for its label;
    otherwise its label joins the neighbouring word's (``"<s> le"``, ``"oiseau </s>"``), so that no
    label is dropped.
    """
    symbols = _symbols("symbols", symbols)
    ticks: list[list] = []  # [position, label, is_special]
    first = None
    for i, symbol in enumerate([*symbols, " "]):
        if len(symbol) == 1 and symbol != " ":
            first = i if first is None else first
            continue
        if first is not None:
            ticks.append([(first + i - 1) / 2, "".join(symbols[first:i]), False])
            first = None
        if len(symbol) > 1 and i < len(symbols):
            ticks.append([float(i), symbol, True])
    merged: list[list] = []
    for k, tick in enumerate(ticks):
        if tick[2]:  # a special symbol: does it have room?
            neighbours = [t for t in (ticks[k - 1] if k else None, ticks[k + 1] if k + 1 < len(ticks) else None) if t]
            close = [t for t in neighbours if abs(t[0] - tick[0]) < 2.5 and not t[2]]
            if close:
                word = close[0]
                word[1] = f"{tick[1]} {word[1]}" if word[0] > tick[0] else f"{word[1]} {tick[1]}"
                continue
        merged.append(tick)
    return [t[0] for t in merged], [t[1] for t in merged]


def attention_grid(maps: torch.Tensor, query_symbols: Sequence[str], key_symbols: Sequence[str], title: str, *,
                   causal: bool = False, quantile: float = 0.99, query_label: str = "query, labelled by word",
                   key_label: str = "key, labelled by word"):
    """One heatmap per layer (row) and head (column), all on one colour scale, labelled by word.

    The colours go from 0 to the ``quantile`` of the weights shown (the colour bar says so): a few
    very large weights would otherwise squeeze every other weight into the darkest colours. With
    ``causal=True`` the first row (which sees only the start symbol, so its weight is 1 by
    construction) is left out of that scale.

    Args:
        maps: ``(layers, H, L, S)`` weights.
        query_symbols, key_symbols: the ``L`` and ``S`` symbols of the two axes.
        title: the figure's title.
        causal: the maps are causal self-attention (see above).
        quantile: where the colour scale ends (1.0: the largest weight).
        query_label, key_label: the axes' titles.

    Returns:
        The matplotlib ``Figure``.
    """
    import matplotlib.pyplot as plt

    maps = torch.as_tensor(maps).detach().float().cpu()
    if maps.dim() != 4:
        raise ValueError(f"maps must be (layers, H, L, S), got shape {tuple(maps.shape)}")
    layers, heads, L, S = maps.shape
    query_symbols, key_symbols = _symbols("query_symbols", query_symbols), _symbols("key_symbols", key_symbols)
    if (len(query_symbols), len(key_symbols)) != (L, S):
        raise ValueError(f"expected {L} query symbols and {S} key symbols for maps of shape {tuple(maps.shape)}, "
                         f"got {len(query_symbols)} and {len(key_symbols)}")
    if isinstance(quantile, bool) or not isinstance(quantile, (int, float)) or not 0 < quantile <= 1:
        raise ValueError(f"quantile must be in (0, 1], got {quantile!r}")
    scaled = maps[:, :, 1:] if causal and L > 1 else maps
    top = float(torch.quantile(scaled.flatten(), quantile)) if quantile < 1 else float(scaled.max())
    top = max(top, 1e-6)
    x_ticks, x_labels = word_ticks(key_symbols)
    y_ticks, y_labels = word_ticks(query_symbols)
    with plt.rc_context({"font.size": 9}):
        fig, axes = plt.subplots(layers, heads, figsize=(7.2, 2.3 * layers + 1.2), sharex=True, sharey=True,
                                 squeeze=False, layout="constrained")
        for layer in range(layers):
            for head in range(heads):
                ax = axes[layer, head]
                image = ax.imshow(maps[layer, head].numpy(), cmap="viridis", vmin=0, vmax=top, aspect="auto",
                                  interpolation="nearest")
                ax.set_title(f"layer {layer + 1}, head {head}")
                ax.set_xticks(x_ticks, labels=x_labels, rotation=90)
                ax.set_yticks(y_ticks, labels=y_labels)
        fig.suptitle(title)
        fig.supxlabel(key_label)
        fig.supylabel(query_label)
        what = "the largest weight" if quantile == 1 else f"{quantile:.0%} of the weights below"
        first = ", row 1 left out" if causal else ""
        fig.colorbar(image, ax=axes, shrink=0.8,
                     label=f"attention weight, colours 0 to {top:.2f}\n({what}{first})")
    return fig
