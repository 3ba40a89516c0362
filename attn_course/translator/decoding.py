"""Chapter 07, sections 5 and 6: greedy (or sampled) decoding, one character at a time, and evaluation."""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from .._checks import check_bool, check_positive_int, describe
from ..caches import KVCache, cached_self_attention
from ..transformer import Transformer
from .model import Translator
from .training import _check_pairs
from .vocab import CharVocab, pad_sequences

__all__ = ["translate", "evaluate", "next_char_log_probs", "beam_search", "beam_translate", "sequence_log_probs"]


def _decode_step_cached(transformer: Transformer, new_tokens: torch.Tensor, memory: torch.Tensor,
                        memory_padding: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """The decoder on the newest target tokens only, reusing the cached keys and values of the earlier ones.

    The same as ``transformer.decode(all_tokens, memory, memory_padding)[0][:, -T_new:]``, but the
    earlier tokens are not run through the decoder again (chapter 08's key/value cache for the
    causal self-attention; the cross-attention reads the encoder's memory as usual).

    Shape:
        new_tokens ``(B, T_new)``, memory ``(B, S, E)``, memory_padding ``(B, S)`` -> logits ``(B, T_new, V_tgt)``
    """
    x = transformer.embed_target(new_tokens, start=cache.length)  # (B, T_new, E), at positions start, start + 1, ...
    for i, layer in enumerate(transformer.decoder_layers):  # each layer's own wiring, with a cached self-attention
        x, _, _ = layer.apply_sublayers(
            x,
            lambda h: (cached_self_attention(layer.self_attn, h, cache, i), None),
            lambda h: layer.cross_attn(h, memory, memory, key_padding_mask=memory_padding, need_weights=False),
        )
    return transformer.output_projection(transformer.decoder_norm(x))  # (B, T_new, V_tgt)


@torch.no_grad()
def _greedy_decode(model: Translator, src: torch.Tensor, max_new_tokens: int, temperature: float, generator,
                   use_cache: bool = True) -> torch.Tensor:
    """Batched decoding: ``(B, S)`` source ids -> ``(B, 1 + generated)`` target ids, start symbol first.

    With ``use_cache`` each step feeds only the newest character to the decoder and keeps the keys
    and values of the earlier ones in a :class:`~attn_course.KVCache` (chapter 08);
    without it, each step runs the decoder over the whole prefix again and keeps the last
    position's prediction. Both give the same characters. (A decoder built without the causal mask,
    ``causal_decoder=False``, is always run without the cache: its earlier positions change as the
    prefix grows, so their keys and values cannot be kept.)
    """
    transformer = model.transformer
    use_cache = use_cache and transformer.config.causal_decoder
    memory, _ = transformer.encode(src)  # (B, S, E), computed once
    memory_padding = transformer.padding_of(src)  # (B, S)
    B = src.size(0)
    tgt = torch.full((B, 1), CharVocab.start_id, dtype=torch.long, device=src.device)  # (B, 1)
    finished = torch.zeros(B, dtype=torch.bool, device=src.device)
    cache = None
    if use_cache:
        attn = transformer.decoder_layers[0].self_attn
        cache = KVCache(len(transformer.decoder_layers), B, attn.num_heads, attn.head_dim, max_new_tokens + 1,
                        device=memory.device, dtype=memory.dtype)
    for _ in range(max_new_tokens):
        if use_cache:
            next_logits = _decode_step_cached(transformer, tgt[:, -1:], memory, memory_padding, cache)[:, -1]  # (B, V)
        else:
            logits, _ = transformer.decode(tgt, memory, memory_padding)  # (B, t, V)
            next_logits = logits[:, -1]  # (B, V): the prediction after the last character so far
        if temperature == 0.0:
            next_id = next_logits.argmax(dim=-1)  # (B,)
        else:
            probabilities = torch.softmax(next_logits.float() / temperature, dim=-1)  # (B, V)
            next_id = torch.multinomial(probabilities, 1, generator=generator).squeeze(1)  # (B,)
        next_id = next_id.masked_fill(finished, CharVocab.pad_id)  # finished sentences only get padding
        tgt = torch.cat([tgt, next_id[:, None]], dim=1)  # (B, t + 1)
        finished |= next_id.eq(CharVocab.end_id)
        if bool(finished.all()):
            break
    return tgt


def translate(
    model: Translator,
    sentences: str | Sequence[str],
    *,
    return_attention: bool = False,
    batch_size: int = 256,
    max_new_tokens: int | None = None,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
):
    """Translate English sentences, a batch at a time, character by character.

    Decoding is greedy (the most probable next character) unless ``temperature > 0``, which samples
    from ``softmax(logits / temperature)``; it stops at the end symbol.

    Args:
        model: a trained :class:`Translator` (its device is used).
        sentences: one sentence or a list of them.
        return_attention: also return each sentence's attention weights.
        batch_size: sentences decoded together.
        max_new_tokens: the longest translation, in characters plus the end symbol
            (default: the model's ``max_len - 1``).
        temperature: 0 for greedy decoding, > 0 for sampling.
        generator: an optional ``torch.Generator`` for reproducible sampling (on the model's device).
        use_cache: keep the decoder's keys and values between steps (chapter 08); the translations
            are the same either way, only faster.

    Returns:
        The translation (a str for one sentence, a list for a list). With ``return_attention=True``,
        a pair ``(translations, attention)`` where each sentence's attention is a dict with
        ``"source"`` (its characters), ``"target"`` (the generated characters, end symbol
        included), ``"decoder_input"`` (what the decoder read at each step: the start symbol, then
        ``target[:-1]``), and the weights ``"encoder"`` ``(layers, H, S, S)``, ``"self"``
        ``(layers, H, T, T)`` and ``"cross"`` ``(layers, H, T, S)`` on the CPU. Query row ``t`` is
        the step that read ``decoder_input[t]`` and produced ``target[t]``; the keys of ``"self"``
        are ``decoder_input``, those of ``"encoder"`` and ``"cross"`` are ``source``.

    Raises:
        ValueError: a sentence contains a character the model does not know.
    """
    if not isinstance(model, Translator):
        raise TypeError(f"model must be a Translator (as train() returns), got {describe(model)}")
    single = isinstance(sentences, str)
    batch = [sentences] if single else list(sentences) if isinstance(sentences, (list, tuple)) else None
    if batch is None:
        raise TypeError(f"sentences must be a str or a list of str, got {describe(sentences)}")
    check_bool("return_attention", return_attention)
    check_bool("use_cache", use_cache)
    check_positive_int("batch_size", batch_size)
    max_new_tokens = model.config.max_len - 1 if max_new_tokens is None else max_new_tokens
    check_positive_int("max_new_tokens", max_new_tokens)
    if max_new_tokens > model.config.max_len - 1:
        raise ValueError(f"max_new_tokens must be at most max_len - 1 = {model.config.max_len - 1}, got {max_new_tokens}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0:
        raise ValueError(f"temperature must be a float >= 0 (0 for greedy decoding), got {temperature!r}")
    device = next(model.parameters()).device
    all_src = model.encode_sources(batch)  # raises on unknown characters before any work
    was_training = model.training
    model.eval()
    translations, attention = [], []
    try:
        for first in range(0, len(batch), batch_size):
            src = all_src[first : first + batch_size]
            src = src[:, : int(src.ne(CharVocab.pad_id).sum(1).max())].to(device)  # drop padding no one needs
            tgt = _greedy_decode(model, src, max_new_tokens, float(temperature), generator, use_cache)  # (b, 1 + generated)
            translations += [model.target_vocab.decode(row) for row in tgt.tolist()]
            if return_attention:
                attention += _attention_maps(model, src, tgt)
    finally:
        model.train(was_training)
    if return_attention:
        return (translations[0], attention[0]) if single else (translations, attention)
    return translations[0] if single else translations


@torch.no_grad()
def _attention_maps(model: Translator, src: torch.Tensor, tgt: torch.Tensor) -> list[dict]:
    """The weights of the decoding that produced ``tgt``, per sentence, without padding.

    Thanks to the causal mask, one teacher-forced pass over the decoded prefix computes exactly the
    weights that each decoding step used.
    """
    generated = tgt[:, 1:]  # (B, T): the characters produced (end symbol, then padding)
    decoder_input = tgt[:, :-1]  # (B, T): what the decoder saw at each step
    _, weights = model.transformer(src, decoder_input, need_weights=True)
    maps = []
    for b in range(src.size(0)):
        S = int(src[b].ne(CharVocab.pad_id).sum())
        ends = (generated[b] == CharVocab.end_id).nonzero()
        T = int(ends[0]) + 1 if len(ends) else generated.size(1)
        maps.append({
            "source": list(model.source_vocab.decode(src[b, :S])),
            "target": model.target_vocab.symbols_of(generated[b, :T]),
            "decoder_input": model.target_vocab.symbols_of(decoder_input[b, :T]),
            "encoder": torch.stack([w[b, :, :S, :S] for w in weights["encoder"]]).cpu(),  # (layers, H, S, S)
            "self": torch.stack([w[b, :, :T, :T] for w in weights["self"]]).cpu(),  # (layers, H, T, T)
            "cross": torch.stack([w[b, :, :T, :S] for w in weights["cross"]]).cpu(),  # (layers, H, T, S)
        })
    return maps


def evaluate(model: Translator, pairs: Sequence[tuple[str, str]], *, batch_size: int = 256,
             max_new_tokens: int | None = None) -> dict:
    """Translate the English side of ``pairs`` greedily and compare with the French side.

    ``batch_size`` and ``max_new_tokens`` are passed to :func:`translate`.

    Returns:
        A dict with ``"exact_match"`` (share of sentences translated exactly right),
        ``"char_accuracy"`` (share of reference characters reproduced at the same position, with
        each sentence counted over the longer of prediction and reference), ``"num_sentences"`` and
        ``"mistakes"`` (a list of ``(english, expected, got)`` for the wrong ones).
    """
    _check_pairs(pairs)
    predictions = translate(model, [e for e, _ in pairs], batch_size=batch_size, max_new_tokens=max_new_tokens)
    exact, matched, compared, mistakes = 0, 0, 0, []
    for (english, expected), got in zip(pairs, predictions):
        exact += got == expected
        matched += sum(a == b for a, b in zip(got, expected))
        compared += max(len(got), len(expected))
        if got != expected:
            mistakes.append((english, expected, got))
    return {
        "exact_match": exact / len(pairs),
        "char_accuracy": matched / max(compared, 1),
        "num_sentences": len(pairs),
        "mistakes": mistakes,
    }


def next_char_log_probs(model: Translator, english: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The translator as a next-character distribution for one English sentence.

    The sentence is encoded once; the returned function runs the decoder over whole prefixes (no
    cache: the prefixes of a beam change from step to step) and gives the log-probabilities of the
    character after each.

    Args:
        model: a trained :class:`Translator`.
        english: one English sentence.

    Returns:
        ``next_log_probs(prefixes)``: target ids ``(N, t)``, each starting with the start symbol ->
        log-probabilities ``(N, V)`` of the next character (rows of equal length ``t``).
    """
    if not isinstance(model, Translator):
        raise TypeError(f"model must be a Translator (as train() returns), got {describe(model)}")
    if not isinstance(english, str):
        raise TypeError(f"english must be one sentence (a str), got {describe(english)}")
    device = next(model.parameters()).device
    src = model.encode_sources([english]).to(device)  # (1, S)
    transformer = model.transformer
    model.eval()
    with torch.no_grad():
        memory, _ = transformer.encode(src)  # (1, S, E)
    padding = transformer.padding_of(src)  # (1, S)

    @torch.no_grad()
    def next_log_probs(prefixes: torch.Tensor) -> torch.Tensor:
        prefixes = torch.as_tensor(prefixes, device=device)
        if prefixes.dim() != 2 or prefixes.is_floating_point() or prefixes.size(1) < 1:
            raise ValueError(f"prefixes must be (N, t) target ids starting with the start symbol, got {describe(prefixes)}")
        N = prefixes.size(0)
        logits, _ = transformer.decode(prefixes, memory.expand(N, -1, -1), padding.expand(N, -1))  # (N, t, V)
        return torch.log_softmax(logits[:, -1].float(), dim=-1)  # (N, V)

    return next_log_probs


def beam_search(next_log_probs: Callable[[torch.Tensor], torch.Tensor], beam_width: int, max_len: int, *,
                start_id: int = CharVocab.start_id, end_id: int = CharVocab.end_id) -> list[int]:
    """Beam search: the best sequence found by keeping the ``beam_width`` best prefixes at every step.

    A prefix's score is the sum of the log-probabilities of its tokens. At each step every unfinished
    prefix is extended by every token; finished prefixes (ending with ``end_id``) stay as they are; of
    all of these, the ``beam_width`` with the highest scores survive. The search stops when every
    survivor is finished or after ``max_len`` tokens, and returns the best survivor. A score can
    only fall as a prefix grows, so once the best survivor is finished nothing can overtake it.
    ``beam_width=1`` is greedy decoding.

    Args:
        next_log_probs: prefixes ``(N, t)`` (start symbol first) -> next-token log-probabilities ``(N, V)``.
        beam_width: how many prefixes survive each step.
        max_len: the longest sequence, in tokens after the start symbol.
        start_id, end_id: the start and end symbols.

    Returns:
        The token ids after the start symbol, the end symbol included when the sequence finished.
    """
    check_positive_int("beam_width", beam_width)
    check_positive_int("max_len", max_len)
    beams = [([start_id], 0.0)]  # (ids, score), best first
    for _ in range(max_len):
        alive = [(ids, score) for ids, score in beams if ids[-1] != end_id]
        if not alive:
            break
        log_probs = next_log_probs(torch.tensor([ids for ids, _ in alive]))  # (N, V)
        candidates = [(ids, score) for ids, score in beams if ids[-1] == end_id]  # finished: kept as they are
        for (ids, score), row in zip(alive, log_probs.double().cpu()):
            best = torch.topk(row, min(beam_width, row.numel()))  # only a prefix's top tokens can survive
            candidates += [(ids + [int(token)], score + float(value)) for value, token in zip(best.values, best.indices)]
        beams = sorted(candidates, key=lambda candidate: -candidate[1])[:beam_width]
    return beams[0][0][1:]


def beam_translate(model: Translator, english: str, beam_width: int = 2, max_new_tokens: int | None = None) -> str:
    """Translate one sentence with :func:`beam_search` (``beam_width=1`` gives what :func:`translate` gives)."""
    max_new_tokens = model.config.max_len - 1 if max_new_tokens is None else max_new_tokens
    check_positive_int("max_new_tokens", max_new_tokens)
    ids = beam_search(next_char_log_probs(model, english), beam_width, max_new_tokens)
    return model.target_vocab.decode(ids)


@torch.no_grad()
def sequence_log_probs(model: Translator, pairs: Sequence[tuple[str, str]]) -> torch.Tensor:
    """The model's log-probability of each French sentence given its English one, end symbol included.

    One teacher-forced pass per batch: ``log p(french | english) = sum_t log p(y_(t+1) | y_(<=t), english)``
    over the French characters and the end symbol, the score that :func:`beam_search` ranks by. Comparing
    the reference with what decoding wrote tells a search error (the model prefers the reference, the
    search missed it) from a model error (the model prefers the wrong sentence; no search can help).

    Args:
        model: a trained :class:`Translator`.
        pairs: ``(english, french)`` pairs; the French may be any string of known characters.

    Returns:
        A float64 tensor ``(len(pairs),)`` on the CPU.
    """
    if not isinstance(model, Translator):
        raise TypeError(f"model must be a Translator (as train() returns), got {describe(model)}")
    _check_pairs(pairs)
    device = next(model.parameters()).device
    src = model.encode_sources([english for english, _ in pairs]).to(device)  # (N, S)
    targets = [model.target_vocab.encode(french, add_start=True, add_end=True) for _, french in pairs]
    tgt = pad_sequences(targets, device=device)  # (N, T + 1): <s> ... </s>, padded
    was_training = model.training
    model.eval()
    try:
        logits, _ = model.transformer(src, tgt[:, :-1])  # (N, T, V)
    finally:
        model.train(was_training)
    labels = tgt[:, 1:]  # (N, T)
    log_p = torch.log_softmax(logits.double(), dim=-1).gather(-1, labels[..., None])[..., 0]  # (N, T)
    return log_p.masked_fill(labels.eq(CharVocab.pad_id), 0.0).sum(-1).cpu()  # (N,)
