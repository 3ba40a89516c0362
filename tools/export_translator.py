"""Export chapter 07's translator to ONNX for the website's "try it" panel (run when the book is built).

The model is the one chapter 07 trains: ``train(toy_pairs(20000, seed=1), seed=0, batch_size=32,
learning_rate=4e-3)`` on the CPU (about 30 s on two idle cores; ``TRAINING`` below). A cached checkpoint
trained with another recipe is trained again. It is trained once and cached, with
its ONNX export, in ``_build/translator/`` (``make clean`` removes it); later builds reuse both::

    _build/translator/translator.pt                      the checkpoint (attn_course.translator.save_checkpoint)
    _build/translator/site/_static/translator/encoder.onnx    source ids (1, S) -> memory (1, S, E)
    _build/translator/site/_static/translator/decoder.onnx    memory, target prefix (1, T)
                                                         -> next-character logits (1, V), cross-attention (1, layers, H, T, S)
    _build/translator/site/_static/translator/model.json      vocabularies, sizes, the lexicon, checksums
    _build/translator/export.log                         what happened (and why, when it failed)

The exporter is PyTorch's own (``torch.onnx.export(..., dynamo=True)``, which needs the ``onnx`` and
``onnxscript`` packages); the website runs the two graphs with onnxruntime-web and decodes greedily,
one character at a time, as :func:`attn_course.translator.translate` does. The decoder graph reruns
the whole prefix at each step (no key/value cache): the last step's cross-attention is then exactly
the map that ``translate(..., return_attention=True)`` reports.

Only the public API of :mod:`attn_course.translator` is used.

Usage: python tools/export_translator.py [--out _build/translator] [--retrain]
Exit status: 0 when the export is in place, 3 when it could not be made (model.json then says why).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import sys
import time
import traceback
import warnings

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "_build" / "translator"
SITE_DIR_NAME = "site"              # html_extra_path ...
ASSET_DIR = pathlib.Path("_static") / "translator"  # ... which lands at <site>/_static/translator/
FORMAT = "attn_course.translator-onnx/1"
# What chapter 07 trains (its training cell: 625 steps of 32 sentences; the command line's defaults
# take batches of 16). Keep the two in step: the panel says it runs the chapter's model.
TRAINING = {"num_pairs": 20000, "data_seed": 1, "seed": 0, "device": "cpu", "batch_size": 32, "learning_rate": 4e-3}


def _sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def paths(out: pathlib.Path = OUT) -> dict:
    assets = out / SITE_DIR_NAME / ASSET_DIR
    return {
        "checkpoint": out / "translator.pt",
        "site": out / SITE_DIR_NAME,
        "assets": assets,
        "encoder": assets / "encoder.onnx",
        "decoder": assets / "decoder.onnx",
        "meta": assets / "model.json",
        "log": out / "export.log",
    }


def export_is_current(out: pathlib.Path = OUT) -> bool:
    """True when model.json describes a successful export of the cached checkpoint."""
    p = paths(out)
    try:
        meta = json.loads(p["meta"].read_text())
    except (OSError, ValueError):
        return False
    return (meta.get("available") is True and meta.get("format") == FORMAT and meta.get("training") == TRAINING
            and p["checkpoint"].is_file()
            and meta.get("checkpoint_sha256") == _sha256(p["checkpoint"])
            and all(p[k].is_file() and meta["files"][k]["sha256"] == _sha256(p[k]) for k in ("encoder", "decoder")))


def _train_or_load(checkpoint: pathlib.Path, retrain: bool, log):
    from attn_course.translator import load_checkpoint, save_checkpoint, toy_pairs, train

    recipe = checkpoint.with_suffix(".training.json")
    same_recipe = recipe.is_file() and json.loads(recipe.read_text()) == TRAINING
    if checkpoint.is_file() and not retrain and same_recipe:
        log(f"reusing the trained checkpoint {checkpoint}")
        return load_checkpoint(checkpoint)
    log(f"training the translator as chapter 07 does ({TRAINING}) ...")
    pairs = toy_pairs(TRAINING["num_pairs"], seed=TRAINING["data_seed"])
    model, history = train(pairs, device=TRAINING["device"], seed=TRAINING["seed"], batch_size=TRAINING["batch_size"],
                           learning_rate=TRAINING["learning_rate"], progress=False)
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    temporary = checkpoint.with_suffix(".tmp")
    save_checkpoint(model, temporary)
    temporary.replace(checkpoint)
    recipe.write_text(json.dumps(TRAINING))
    log(f"trained in {history['seconds']:.1f} s (final loss {history['loss'][-1]:.4f}); saved {checkpoint}")
    return load_checkpoint(checkpoint)  # exactly what the tests will load


def _graphs(model):
    """The two modules exported: the encoder, and one decoding step over the whole prefix."""
    import copy
    import math

    import torch
    from torch import nn

    class TokenEmbeddingForExport(nn.Module):
        """The same as the package's TokenEmbedding, without its friendly range check of the ids
        (``int(tokens.max())`` depends on the data, which torch.export cannot trace; the page
        checks every character against the vocabulary before it calls the model)."""

        def __init__(self, token_embedding):
            super().__init__()
            self.embedding = token_embedding.embedding
            self.scale = math.sqrt(token_embedding.embedding.embedding_dim)

        def forward(self, tokens):  # (B, T) -> (B, T, E)
            return self.embedding(tokens) * self.scale

    transformer = copy.deepcopy(model.transformer)  # the same weights; the model itself stays untouched
    transformer.src_embedding = TokenEmbeddingForExport(transformer.src_embedding)
    transformer.tgt_embedding = TokenEmbeddingForExport(transformer.tgt_embedding)

    # The page feeds one sentence, never padded: no padding mask is needed, and without one the
    # attention takes no data-dependent branch (its "rows with nothing to attend to" test), which
    # torch.export cannot trace. The steps below are Transformer.encode and Transformer.decode with
    # the (all-False) padding masks left out; the browser test checks the result against translate().
    class EncoderGraph(nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = transformer

        def forward(self, src):  # (1, S) -> (1, S, E)
            x = self.transformer.embed_source(src)  # (1, S, E)
            for layer in self.transformer.encoder_layers:
                x, _ = layer(x, key_padding_mask=None, need_weights=False)
            return self.transformer.encoder_norm(x)  # (1, S, E)

    class DecoderGraph(nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = transformer

        def forward(self, memory, tgt):  # (1, S, E), (1, T)
            x = self.transformer.embed_target(tgt)  # (1, T, E)
            cross = []
            for layer in self.transformer.decoder_layers:
                x, _, w_cross = layer(x, memory, tgt_key_padding_mask=None, memory_key_padding_mask=None,
                                      is_causal=self.transformer.config.causal_decoder, need_weights=True)
                cross.append(w_cross)  # (1, H, T, S)
            logits = self.transformer.output_projection(self.transformer.decoder_norm(x[:, -1]))  # (1, V)
            return logits, torch.stack(cross, dim=1)  # (1, V): the next character; (1, layers, H, T, S)

    return EncoderGraph().eval(), DecoderGraph().eval()


def _export(model, p: dict, log) -> None:
    import torch

    encoder, decoder = _graphs(model)
    source_vocab, target_vocab = model.source_vocab, model.target_vocab
    src = torch.tensor([source_vocab.encode("the red cat sees a dog")])  # (1, S)
    tgt = torch.tensor([target_vocab.encode("le chat", add_start=True)])  # (1, T)
    with torch.no_grad():
        memory = encoder(src)
    p["assets"].mkdir(parents=True, exist_ok=True)
    for name, graph, args, dynamic, inputs, outputs in (
        ("encoder", encoder, (src,), {"src": {1: "S"}, "memory": {1: "S"}}, ["src"], ["memory"]),
        ("decoder", decoder, (memory, tgt), {"memory": {1: "S"}, "tgt": {1: "T"}, "cross_attention": {3: "T", 4: "S"}},
         ["memory", "tgt"], ["next_logits", "cross_attention"]),
    ):
        start = time.perf_counter()
        target = p[name].with_suffix(".tmp.onnx")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer's notes on the shape checks it turns into constants
            torch.onnx.export(graph, args, str(target), dynamo=False, input_names=inputs, output_names=outputs,
                              dynamic_axes=dynamic, opset_version=17, do_constant_folding=True)
        target.replace(p[name])
        log(f"exported {p[name].name} ({p[name].stat().st_size:,} bytes) in {time.perf_counter() - start:.1f} s")


def _lexicon_words() -> dict:
    from attn_course.translator import DEFAULT_LEXICON

    return {"articles": ["the", "a", "an"], "adjectives": list(DEFAULT_LEXICON.adjectives),
            "nouns": list(DEFAULT_LEXICON.nouns), "verbs": list(DEFAULT_LEXICON.verbs)}


def _write_meta(p: dict, meta: dict) -> None:
    p["assets"].mkdir(parents=True, exist_ok=True)
    temporary = p["meta"].with_suffix(".tmp")
    temporary.write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")
    temporary.replace(p["meta"])


def run(out: pathlib.Path = OUT, retrain: bool = False) -> tuple[bool, str]:
    """Train (or reuse) and export; return ``(available, reason)``. Never raises."""
    p = paths(out)
    out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def log(message: str) -> None:
        lines.append(message)
        print(f"[export_translator] {message}", flush=True)

    if export_is_current(out) and not retrain:
        log(f"the ONNX export of {p['checkpoint']} is up to date")
        return True, ""
    try:
        import torch

        torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
        model = _train_or_load(p["checkpoint"], retrain, log)
        for name in ("encoder", "decoder"):
            p[name].unlink(missing_ok=True)
        _export(model, p, log)
        config = model.config
        meta = {
            "available": True,
            "format": FORMAT,
            "torch": torch.__version__,
            "training": TRAINING,
            "checkpoint_sha256": _sha256(p["checkpoint"]),
            "files": {k: {"name": p[k].name, "bytes": p[k].stat().st_size, "sha256": _sha256(p[k])} for k in ("encoder", "decoder")},
            "source_characters": model.source_vocab.characters,
            "target_characters": model.target_vocab.characters,
            "special": {"pad": 0, "start": 1, "end": 2},
            "max_len": config.max_len,
            "layers": config.num_decoder_layers,
            "heads": config.num_heads,
            "lexicon": _lexicon_words(),
        }
        _write_meta(p, meta)
        log("export done")
        p["log"].write_text("\n".join(lines) + "\n")
        return True, ""
    except Exception as error:  # any failure: the page says the panel is unavailable, the build says why
        reason = f"{type(error).__name__}: {error}".strip()
        if isinstance(error, ImportError):
            reason += " (install the build dependencies: pip install -r requirements.txt)"
        log(f"the translator could not be exported, the panel will say it is unavailable: {reason}")
        p["log"].write_text("\n".join(lines) + "\n" + traceback.format_exc())
        for name in ("encoder", "decoder"):
            p[name].unlink(missing_ok=True)
        _write_meta(p, {"available": False, "format": FORMAT, "reason": reason.splitlines()[0][:500]})
        return False, reason


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=OUT, help="cache folder (default: _build/translator)")
    parser.add_argument("--retrain", action="store_true", help="train again even if a checkpoint is cached")
    args = parser.parse_args(argv)
    available, _ = run(args.out.resolve(), retrain=args.retrain)
    return 0 if available else 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
