"""The command line: ``python -m attn_course.translator train|translate|evaluate`` (see ``--help``)."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

import torch

from ..utils import get_device
from .checkpoints import load_checkpoint, save_checkpoint
from .decoding import evaluate, translate
from .language import held_out_pairs, toy_pairs
from .training import train

__all__ = ["main"]


def _parse_overrides(items: Sequence[str]) -> dict:
    overrides = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set expects name=value, got {item!r}")
        for convert in (int, float):
            try:
                overrides[name] = convert(value)
                break
            except ValueError:
                continue
        else:
            overrides[name] = {"true": True, "false": False}.get(value.lower(), value)
    return overrides


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: ``train``, ``translate`` and ``evaluate`` subcommands (see ``--help``)."""
    parser = argparse.ArgumentParser(
        prog="python -m attn_course.translator",
        description="Train, use and evaluate the toy English -> French character-level translator of chapter 07.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    train_parser = commands.add_parser("train", help="train a model on toy_pairs and save a checkpoint")
    train_parser.add_argument("--out", default="translator.pt", help="checkpoint to write (default: translator.pt)")
    train_parser.add_argument("--num-pairs", type=int, default=20000, help="training pairs (default: 20000)")
    train_parser.add_argument("--data-seed", type=int, default=1, help="seed of toy_pairs (default: 1)")
    train_parser.add_argument("--seed", type=int, default=0, help="seed of the weights and batch order (default: 0)")
    train_parser.add_argument("--device", default=None, help="torch device, for example cpu (default: CUDA, then MPS, then the CPU)")
    train_parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    train_parser.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE",
                              help="override a training or model setting, for example epochs=8 d_model=96")
    train_parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    translate_parser = commands.add_parser("translate", help="translate sentences given as arguments (or one per line on stdin)")
    translate_parser.add_argument("--checkpoint", default="translator.pt", help="checkpoint to load (default: translator.pt)")
    translate_parser.add_argument("--device", default=None, help="torch device (default: CUDA, then MPS, then the CPU)")
    translate_parser.add_argument("sentences", nargs="*", help="English sentences; read from stdin when none are given")

    evaluate_parser = commands.add_parser("evaluate", help="exact match and character accuracy on unseen toy sentences")
    evaluate_parser.add_argument("--checkpoint", default="translator.pt", help="checkpoint to load (default: translator.pt)")
    evaluate_parser.add_argument("--device", default=None, help="torch device (default: CUDA, then MPS, then the CPU)")
    evaluate_parser.add_argument("--num-sentences", type=int, default=1000, help="held-out sentences (default: 1000)")
    evaluate_parser.add_argument("--num-pairs", type=int, default=20000, help="training pairs to exclude (default: 20000)")
    evaluate_parser.add_argument("--data-seed", type=int, default=1, help="seed of the training pairs to exclude (default: 1)")
    evaluate_parser.add_argument("--seed", type=int, default=12345, help="seed of the held-out sentences (default: 12345)")
    evaluate_parser.add_argument("--show-mistakes", type=int, default=5, help="how many mistakes to print (default: 5)")

    args = parser.parse_args(argv)
    if args.command == "train":
        if args.threads:
            torch.set_num_threads(args.threads)
        pairs = toy_pairs(args.num_pairs, seed=args.data_seed)
        model, history = train(pairs, device=args.device, seed=args.seed, progress=not args.no_progress,
                               **_parse_overrides(args.set))
        save_checkpoint(model, args.out)
        print(f"trained on {len(pairs)} pairs in {history['seconds']:.1f} s "
              f"(final loss {history['loss'][-1]:.4f}); saved {args.out}")
    elif args.command == "translate":
        model = load_checkpoint(args.checkpoint, device=args.device or get_device())
        sentences = args.sentences or [line.strip() for line in sys.stdin if line.strip()]
        try:
            for english, french in zip(sentences, translate(model, sentences)):
                print(f"{english}\t{french}")
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    else:
        model = load_checkpoint(args.checkpoint, device=args.device or get_device())
        unseen = held_out_pairs(args.num_sentences, toy_pairs(args.num_pairs, seed=args.data_seed), seed=args.seed)
        result = evaluate(model, unseen)
        print(f"{result['num_sentences']} unseen sentences: exact match {result['exact_match']:.2%}, "
              f"character accuracy {result['char_accuracy']:.2%}")
        for english, expected, got in result["mistakes"][: args.show_mistakes]:
            print(f"  {english!r}\n    expected {expected!r}\n    got      {got!r}")
    return 0
