"""Chapter 08's module, kept so that old imports keep working.

The cache classes and :func:`cached_self_attention` now live in :mod:`attn_course.caches`, the
decoder-only model and :func:`generate` in :mod:`attn_course.decoder`; import them from there or,
better, from ``attn_course`` itself. Nothing in the package imports this module.
"""

from .caches import KVCache, cached_self_attention
from .decoder import POSITIONS, DecoderOnlyLM, generate

__all__ = ["KVCache", "cached_self_attention", "DecoderOnlyLM", "generate", "POSITIONS"]
