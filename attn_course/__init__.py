"""attn_course: attention mechanisms built from scratch, checked against PyTorch.

One module per mechanism, in the order of the course's chapters. Shapes follow PyTorch's legend:
``B`` batch, ``H`` heads, ``L`` query length, ``S`` key length, ``E`` model width, ``D`` head width.
"""

from .utils import get_device, set_seed
from .alignment import AdditiveAttention, DotProductAttention  # 01
from .rnn import DIGIT_BOS, DIGIT_PAD, DIGIT_VOCAB_SIZE, AttentionDecoder, GRUEncoder, Seq2Seq, digit_task, shift_right  # 01
from .training import History, MarkovTask, fit, markov_task, quality_vs_cache  # fit: 01-; the task: 09-11
from .simple import simple_self_attention  # 02
from .scaled import SelfAttention, scaled_dot_product_attention  # 03
from .masks import allowed_to_blocked, blocked_to_additive, causal_mask, combine_masks, padding_mask  # 04
from .masks import sliding_window_mask  # 10
from .multihead import MultiHeadAttention  # 05
from .positional import LearnedPositionalEmbedding, PositionalEncoding, TokenEmbedding, sinusoidal_positional_encoding  # 06
from .transformer import DecoderLayer, EncoderLayer, FeedForward, Transformer, TransformerConfig  # 07
from .efficient import online_softmax, tiled_attention  # 08
from .caches import KVCache, cached_self_attention  # 08
from .rotary import RotaryEmbedding, apply_rotary_embedding  # 09
from .alibi import alibi_bias, alibi_slopes  # 09
from .caches import RollingKVCache  # 10
from .gqa import GroupedQueryAttention  # 10
from .latent import MultiHeadLatentAttention  # 11
from .caches import LatentKVCache, cache_elements_per_token  # 11
from .linear import DeltaNetAttention, LinearAttention, LinearAttentionState, delta_rule, delta_rule_step  # 12
from .linear import associative_recall, linear_attention, linear_attention_step  # 12
from .recall import RecallModel, recall_accuracy, train_recall  # 12
from .decoder import DecoderOnlyLM, generate  # 08-11
from .plotting import plot_attention, plot_attention_grid, plot_mask
from . import diagrams  # the diagram language: ac.diagrams.attention_flow(...), ac.diagrams.PALETTE
from .widgets import explorable

__version__ = "0.2.0"  # the one place the version is set: pyproject.toml reads it, `make sync` writes it into the first cells

__all__ = [
    "get_device",
    "set_seed",
    "AdditiveAttention",
    "DotProductAttention",
    "GRUEncoder",
    "AttentionDecoder",
    "Seq2Seq",
    "digit_task",
    "shift_right",
    "DIGIT_PAD",
    "DIGIT_BOS",
    "DIGIT_VOCAB_SIZE",
    "fit",
    "History",
    "MarkovTask",
    "markov_task",
    "quality_vs_cache",
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
    "FeedForward",
    "EncoderLayer",
    "DecoderLayer",
    "TransformerConfig",
    "Transformer",
    "online_softmax",
    "tiled_attention",
    "KVCache",
    "cached_self_attention",
    "DecoderOnlyLM",
    "generate",
    "apply_rotary_embedding",
    "RotaryEmbedding",
    "alibi_slopes",
    "alibi_bias",
    "sliding_window_mask",
    "GroupedQueryAttention",
    "RollingKVCache",
    "MultiHeadLatentAttention",
    "LatentKVCache",
    "cache_elements_per_token",
    "linear_attention",
    "linear_attention_step",
    "LinearAttentionState",
    "delta_rule",
    "delta_rule_step",
    "LinearAttention",
    "DeltaNetAttention",
    "associative_recall",
    "RecallModel",
    "train_recall",
    "recall_accuracy",
    "plot_attention",
    "plot_attention_grid",
    "plot_mask",
    "diagrams",
    "explorable",
]
