"""The attention and the embedding can be recorded by torch.export (which the translator's ONNX export,
tools/export_translator.py, runs), and the recorded graph computes what eager mode computes: the
empty-row fix of the masks and the ids' range check take their branch-free form only there."""

import pytest
import torch

import attn_course as ac
from attn_course.positional import TokenEmbedding

pytestmark = pytest.mark.usefixtures("one_thread")
export = pytest.importorskip("torch.export")


def test_multihead_attention_with_an_empty_row_exports_and_agrees():
    torch.manual_seed(0)
    attention = ac.MultiHeadAttention(8, 2).eval()
    x = torch.randn(2, 5, 8)
    padding = torch.zeros(2, 5, dtype=torch.bool)
    padding[1, 3:] = True
    blocked_row = torch.zeros(5, 5, dtype=torch.bool)
    blocked_row[2] = True  # query 2 may attend to nothing: zeros, not NaN

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = attention

        def forward(self, x, padding):
            return self.attention(x, x, x, key_padding_mask=padding, attn_mask=blocked_row, need_weights=True)

    program = export.export(Layer(), (x, padding))
    out, weights = program.module()(x, padding)
    expected_out, expected_weights = Layer()(x, padding)
    torch.testing.assert_close(out, expected_out)
    torch.testing.assert_close(weights, expected_weights)
    assert torch.equal(weights[:, :, 2], torch.zeros_like(weights[:, :, 2])) and not out.isnan().any()
    # Without an empty row the recorded graph changes nothing either.
    no_row = torch.zeros(2, 5, dtype=torch.bool)
    torch.testing.assert_close(program.module()(x, no_row)[1], Layer()(x, no_row)[1])


def test_token_embedding_exports_and_still_checks_ids_eagerly():
    embedding = TokenEmbedding(10, 4)
    ids = torch.tensor([[1, 2, 9]])
    program = export.export(embedding, (ids,))
    torch.testing.assert_close(program.module()(ids), embedding(ids))
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 10\), got ids from 1 to 10"):
        embedding(torch.tensor([[1, 10]]))
