"""Saving and loading a trained translator (weights, configuration and both vocabularies)."""

from __future__ import annotations

import torch

from .._checks import describe
from ..transformer import TransformerConfig
from .model import Translator
from .vocab import CharVocab

__all__ = ["save_checkpoint", "load_checkpoint"]


def save_checkpoint(model: Translator, path) -> None:
    """Save the weights, the configuration and both vocabularies to ``path`` (a ``.pt`` file)."""
    if not isinstance(model, Translator):
        raise TypeError(f"model must be a Translator, got {describe(model)}")
    torch.save({
        "format": "attn_course.translator/1",
        "config": model.config.to_dict(),
        "source_characters": model.source_vocab.characters,
        "target_characters": model.target_vocab.characters,
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
    }, path)


def load_checkpoint(path, device=None) -> Translator:
    """Load a :class:`Translator` saved by :func:`save_checkpoint`, safely (``weights_only=True``)."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != "attn_course.translator/1":
        raise ValueError(f"{path} is not a checkpoint written by attn_course.translator.save_checkpoint")
    model = Translator(TransformerConfig(**checkpoint["config"]), CharVocab(checkpoint["source_characters"]),
                       CharVocab(checkpoint["target_characters"]))
    model.load_state_dict(checkpoint["state_dict"])
    return model.to(device if device is not None else "cpu").eval()
