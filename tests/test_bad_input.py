"""A table of wrong calls: each must raise ValueError/TypeError whose message names what it got."""

import pytest
import torch

import attn_course as ac

q = torch.randn(2, 3, 8)
k = torch.randn(2, 5, 8)
v = torch.randn(2, 5, 4)
mha = ac.MultiHeadAttention(8, 2)
x8 = torch.randn(2, 3, 8)

CASES = [
    # (id, call, exception, pattern the message must contain)
    ("sdpa: widths differ", lambda: ac.scaled_dot_product_attention(q, torch.randn(2, 5, 6), v), ValueError, r"\(2, 3, 8\).*\(2, 5, 6\)"),
    ("sdpa: lengths differ", lambda: ac.scaled_dot_product_attention(q, k, torch.randn(2, 4, 4)), ValueError, r"\(2, 5, 8\).*\(2, 4, 4\)"),
    ("sdpa: batch mismatch", lambda: ac.scaled_dot_product_attention(q, torch.randn(3, 5, 8), torch.randn(3, 5, 4)), ValueError, r"\(2,\).*\(3,\)"),
    ("sdpa: mask wrong shape", lambda: ac.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(3, 4, dtype=torch.bool)), ValueError, r"\(3, 4\)"),
    ("sdpa: int mask", lambda: ac.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(3, 5, dtype=torch.int64)), TypeError, "int64"),
    ("sdpa: mask and causal", lambda: ac.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(3, 5, dtype=torch.bool), is_causal=True), ValueError, "is_causal"),
    ("sdpa: 1-D query", lambda: ac.scaled_dot_product_attention(torch.randn(8), k, v), ValueError, r"query.*\(8,\)"),
    ("sdpa: not a tensor", lambda: ac.scaled_dot_product_attention([[1.0]], k, v), TypeError, "query.*list"),
    ("sdpa: integer tensor", lambda: ac.scaled_dot_product_attention(q.long(), k.long(), v.long()), TypeError, "int64"),
    ("sdpa: mixed dtypes", lambda: ac.scaled_dot_product_attention(q, k.double(), v), TypeError, "float64"),
    ("sdpa: dropout 1.5", lambda: ac.scaled_dot_product_attention(q, k, v, dropout_p=1.5), ValueError, "1.5"),
    ("sdpa: dropout negative", lambda: ac.scaled_dot_product_attention(q, k, v, dropout_p=-0.1), ValueError, "-0.1"),
    ("sdpa: is_causal not bool", lambda: ac.scaled_dot_product_attention(q, k, v, is_causal="yes"), TypeError, "yes"),
    ("sdpa: scale string", lambda: ac.scaled_dot_product_attention(q, k, v, scale="0.1"), TypeError, "0.1"),
    ("sdpa: scale nan", lambda: ac.scaled_dot_product_attention(q, k, v, scale=float("nan")), ValueError, "nan"),
    ("simple: 1-D input", lambda: ac.simple_self_attention(torch.randn(4)), ValueError, r"\(4,\)"),
    ("simple: ints", lambda: ac.simple_self_attention(torch.ones(3, 4, dtype=torch.long)), TypeError, "int64"),
    ("mha: heads do not divide", lambda: ac.MultiHeadAttention(10, 3), ValueError, r"embed_dim=10.*num_heads=3"),
    ("mha: unknown backend", lambda: ac.MultiHeadAttention(8, 2, backend="flash"), ValueError, "flash"),
    ("mha: zero heads", lambda: ac.MultiHeadAttention(8, 0), ValueError, "num_heads.*0"),
    ("mha: negative width", lambda: ac.MultiHeadAttention(-8, 2), ValueError, "embed_dim.*-8"),
    ("mha: float heads", lambda: ac.MultiHeadAttention(8, 2.0), TypeError, "num_heads.*float"),
    ("mha: dropout 1", lambda: ac.MultiHeadAttention(8, 2, dropout=1.0), ValueError, "dropout"),
    ("mha: wrong width", lambda: mha(torch.randn(2, 3, 6), x8, x8), ValueError, r"embed_dim=8.*\(2, 3, 6\)"),
    ("mha: not batch first 2-D", lambda: mha(torch.randn(3, 8), torch.randn(3, 8), torch.randn(3, 8)), ValueError, r"\(3, 8\)"),
    ("mha: batch mismatch", lambda: mha(x8, torch.randn(4, 3, 8), torch.randn(4, 3, 8)), ValueError, r"\(4, 3, 8\)"),
    ("mha: key/value lengths", lambda: mha(x8, torch.randn(2, 5, 8), torch.randn(2, 4, 8)), ValueError, r"\(2, 5, 8\).*\(2, 4, 8\)"),
    ("mha: padding mask shape", lambda: mha(x8, x8, x8, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool)), ValueError, r"\(2, 3\).*\(2, 4\)"),
    ("mha: attn mask shape", lambda: mha(x8, x8, x8, attn_mask=torch.zeros(3, 4, dtype=torch.bool)), ValueError, r"\(3, 4\)"),
    ("mha: int mask", lambda: mha(x8, x8, x8, attn_mask=torch.zeros(3, 3, dtype=torch.int32)), TypeError, "int32"),
    ("mha: dtype of input", lambda: mha(x8.double(), x8.double(), x8.double()), TypeError, "float64"),
    ("self-attention: width", lambda: ac.SelfAttention(4, 2)(torch.randn(3, 5)), ValueError, r"d_in=4.*\(3, 5\)"),
    ("self-attention: zero width", lambda: ac.SelfAttention(0, 2), ValueError, "d_in.*0"),
    ("pe: negative length", lambda: ac.sinusoidal_positional_encoding(-1, 8), ValueError, "max_len.*-1"),
    ("pe: zero width", lambda: ac.sinusoidal_positional_encoding(4, 0), ValueError, "d_model.*0"),
    ("pe: int dtype", lambda: ac.sinusoidal_positional_encoding(4, 8, dtype=torch.int64), TypeError, "int64"),
    ("pe module: too long", lambda: ac.PositionalEncoding(8, max_len=4)(torch.randn(1, 5, 8)), ValueError, "max_len=4"),
    ("pe module: width", lambda: ac.PositionalEncoding(8)(torch.randn(1, 5, 6)), ValueError, r"d_model=8.*\(1, 5, 6\)"),
    ("padding_mask: negative length", lambda: ac.padding_mask([3, -1]), ValueError, r"-1"),
    ("padding_mask: too short max_len", lambda: ac.padding_mask([3, 5], max_len=4), ValueError, "max_len=4.*5"),
    ("causal_mask: negative", lambda: ac.causal_mask(-2), ValueError, "-2"),
    ("additive: query width", lambda: ac.AdditiveAttention(4, 6, 8)(torch.randn(2, 5), torch.randn(2, 3, 6)), ValueError, r"query_dim=4.*\(2, 5\)"),
    ("dot: widths differ", lambda: ac.DotProductAttention()(torch.randn(2, 4), torch.randn(2, 3, 6)), ValueError, r"\(2, 4\).*\(2, 3, 6\)"),
    ("alignment: padding shape", lambda: ac.DotProductAttention()(torch.randn(2, 4), torch.randn(2, 3, 4), key_padding_mask=torch.zeros(2, 4, dtype=torch.bool)), ValueError, r"\(2, 3\).*\(2, 4\)"),
    ("set_seed: negative", lambda: ac.set_seed(-1), ValueError, "-1"),
    ("set_seed: float", lambda: ac.set_seed(1.5), TypeError, "1.5"),
    ("explorable: empty values", lambda: ac.explorable(lambda t: b"", {"t": []}), ValueError, "t"),
    ("explorable: not callable", lambda: ac.explorable(3, {"t": [1]}), TypeError, "int"),
]


@pytest.mark.parametrize("call, exception, pattern", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_raises_a_clear_error(call, exception, pattern):
    with pytest.raises(exception, match=pattern):
        call()
