"""attn_course: attention mechanisms built from scratch, checked against PyTorch.

One module per mechanism, in the order of the course's chapters. Shapes follow PyTorch's legend:
``B`` batch, ``H`` heads, ``L`` query length, ``S`` key length, ``E`` model width, ``D`` head width.
"""

from .utils import get_device, set_seed
from .alignment import AdditiveAttention, DotProductAttention  # 01
from .simple import simple_self_attention  # 02
from .scaled import SelfAttention, scaled_dot_product_attention  # 03
from .masks import allowed_to_blocked, blocked_to_additive, causal_mask, combine_masks, padding_mask  # 04
from .multihead import MultiHeadAttention  # 05
from .positional import LearnedPositionalEmbedding, PositionalEncoding, TokenEmbedding, sinusoidal_positional_encoding  # 06
from .plotting import plot_attention, plot_attention_grid
from .widgets import explorable

__version__ = "0.1.0"

__all__ = [
    "get_device",
    "set_seed",
    "AdditiveAttention",
    "DotProductAttention",
    "simple_self_attention",
    "SelfAttention",
    "scaled_dot_product_attention",
    "causal_mask",
    "padding_mask",
    "combine_masks",
    "allowed_to_blocked",
    "blocked_to_additive",
    "MultiHeadAttention",
    "sinusoidal_positional_encoding",
    "PositionalEncoding",
    "LearnedPositionalEmbedding",
    "TokenEmbedding",
    "plot_attention",
    "plot_attention_grid",
    "explorable",
]
