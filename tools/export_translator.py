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

The exporter is PyTorch's own: ``torch.onnx.export(..., dynamo=True)`` (torch.export, then ONNX; it
needs the ``onnx`` and ``onnxscript`` packages), with the TorchScript exporter (``dynamo=False``,
deprecated since torch 2.15) only as a fallback where that fails; ``model.json`` says which ran
(``exporter``). Both record the package's own ``encode`` and ``decode``. The website runs the two graphs with onnxruntime-web and decodes greedily,
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
import re
import sys
import time
import traceback
import warnings

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "_build" / "translator"
SITE_DIR_NAME = "site"              # html_extra_path ...
ASSET_DIR = pathlib.Path("_static") / "translator"  # ... which lands at <site>/_static/translator/
FORMAT = "attn_course.translator-onnx/2"  # 2: recorded by torch.export (1: the TorchScript tracer)
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
    """The two modules exported: the encoder, and one decoding step over the whole prefix. Both are
    the package's own ``Transformer.encode`` and ``Transformer.decode``, as ``translate`` runs them
    (the attention's empty-row fix and the embedding's id check take their graph form while an
    exporter records them: ``attn_course.scaled._recording_graph``)."""
    import copy

    import torch
    from torch import nn

    transformer = copy.deepcopy(model.transformer).eval()  # the same weights; the model itself stays untouched

    class EncoderGraph(nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = transformer

        def forward(self, src):  # (1, S) -> (1, S, E)
            memory, _ = self.transformer.encode(src)
            return memory

    class DecoderGraph(nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = transformer

        def forward(self, memory, tgt):  # (1, S, E), (1, T)
            # The page feeds one unpadded sentence: no source padding to mask (translate's mask is all False).
            logits, weights = self.transformer.decode(tgt, memory, None, need_weights=True)  # (1, T, V)
            return logits[:, -1], torch.stack(weights["cross"], dim=1)  # (1, V): the next character; (1, layers, H, T, S)

    return EncoderGraph().eval(), DecoderGraph().eval()


def _export_dynamo(graph, args, target, dynamic, inputs, outputs, max_len) -> None:
    """torch.export, then ONNX (``torch.onnx.export(..., dynamo=True)``; needs onnxscript)."""
    import logging

    import torch

    # "torchvision is not installed. Skipping torchvision::nms": true, and of no concern here.
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    dims = {axis_name: torch.export.Dim(axis_name, min=1, max=max_len) for axis_name in ("S", "T")}
    dynamic_shapes = {name: {axis: dims[axis_name] for axis, axis_name in dynamic[name].items()} for name in inputs}
    torch.onnx.export(graph, args, str(target), dynamo=True, dynamic_shapes=dynamic_shapes, input_names=inputs,
                      output_names=outputs, opset_version=18, external_data=False, verbose=False)
    _strip_metadata(target)


def _strip_metadata(path: pathlib.Path) -> None:
    """Drop what the dynamo exporter notes for debugging (each node's FX node, class path and source
    line, this machine's file paths included): a third of the file, and nothing the runtime reads."""
    import onnx

    model = onnx.load(str(path))

    def strip(graph) -> None:
        for node in graph.node:
            del node.metadata_props[:]
            node.doc_string = ""
            for attribute in node.attribute:
                if attribute.HasField("g"):
                    strip(attribute.g)
                for subgraph in attribute.graphs:
                    strip(subgraph)
        for value in (*graph.value_info, *graph.input, *graph.output, *graph.initializer):
            del value.metadata_props[:]

    strip(model.graph)
    for function in model.functions:
        for node in function.node:
            del node.metadata_props[:]
    del model.metadata_props[:]
    onnx.save(model, str(path))


def _export_torchscript(graph, args, target, dynamic, inputs, outputs, max_len) -> None:
    """The TorchScript tracer (``dynamo=False``), which PyTorch 2.15 says it will remove: the fallback."""
    import torch

    torch.onnx.export(graph, args, str(target), dynamo=False, input_names=inputs, output_names=outputs,
                      dynamic_axes=dynamic, opset_version=17, do_constant_folding=True)


def _export(model, p: dict, log) -> str:
    """Write both graphs; return the exporter used ("dynamo", or "torchscript" when dynamo failed)."""
    import torch

    encoder, decoder = _graphs(model)
    source_vocab, target_vocab = model.source_vocab, model.target_vocab
    src = torch.tensor([source_vocab.encode("the red cat sees a dog")])  # (1, S)
    tgt = torch.tensor([target_vocab.encode("le chat", add_start=True)])  # (1, T)
    with torch.no_grad():
        memory = encoder(src)
    p["assets"].mkdir(parents=True, exist_ok=True)
    graphs = (
        ("encoder", encoder, (src,), {"src": {1: "S"}, "memory": {1: "S"}}, ["src"], ["memory"]),
        ("decoder", decoder, (memory, tgt), {"memory": {1: "S"}, "tgt": {1: "T"}, "cross_attention": {3: "T", 4: "S"}},
         ["memory", "tgt"], ["next_logits", "cross_attention"]),
    )

    def write_all(export_one) -> None:
        for name, graph, args, dynamic, inputs, outputs in graphs:
            start = time.perf_counter()
            target = p[name].with_suffix(".tmp.onnx")
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")  # the exporters' notes on shape checks and deprecated names
                export_one(graph, args, target, dynamic, inputs, outputs, model.config.max_len)
            target.replace(p[name])
            log(f"exported {p[name].name} ({p[name].stat().st_size:,} bytes) in {time.perf_counter() - start:.1f} s")

    try:
        write_all(_export_dynamo)
        log("exporter: torch.onnx.export(dynamo=True)")
        return "dynamo"
    except Exception as error:  # onnxscript missing, or an op that torch.export cannot record
        first_line = (re.sub(r"\x1b\[[0-9;]*m", "", str(error)).strip().splitlines() or [""])[0][:300]
        reason = f"{type(error).__name__}: {first_line}"
        log(f"torch.onnx.export(dynamo=True) failed ({reason}); falling back to the TorchScript exporter")
    write_all(_export_torchscript)
    return f"torchscript (dynamo=True failed: {reason})"


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

        # Two threads train it fastest on an idle machine; a caller that sets OMP_NUM_THREADS (make test runs the
        # build beside a chapter on the other core, where a second thread would wait more than it works) decides.
        if not os.environ.get("OMP_NUM_THREADS"):
            torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
        model = _train_or_load(p["checkpoint"], retrain, log)
        for name in ("encoder", "decoder"):
            p[name].unlink(missing_ok=True)
        exporter = _export(model, p, log)
        config = model.config
        meta = {
            "available": True,
            "format": FORMAT,
            "torch": torch.__version__,
            "exporter": exporter,
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
