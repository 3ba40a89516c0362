"""Tests of attn_course.transformer: shapes, masks (no future leak, padding invariance), pre/post-norm,
the two attention backends, and agreement with torch.nn's own Transformer layers."""

import dataclasses

import pytest
import torch
from torch import nn

import attn_course as ac
from attn_course.transformer import DecoderLayer, EncoderLayer, FeedForward, Transformer, TransformerConfig

E, H, FF = 16, 4, 32


pytestmark = pytest.mark.usefixtures("one_thread")


def small_config(**overrides) -> TransformerConfig:
    settings = dict(src_vocab_size=11, tgt_vocab_size=13, d_model=E, num_heads=H, num_encoder_layers=2,
                    num_decoder_layers=2, d_ff=FF, max_len=32, pad_id=0)
    return TransformerConfig(**{**settings, **overrides})


def random_ids(B, T, vocab, generator, lengths=None):
    ids = torch.randint(1, vocab, (B, T), generator=generator)
    if lengths is not None:
        for b, n in enumerate(lengths):
            ids[b, n:] = 0
    return ids


@pytest.mark.parametrize("shape", [(1, 5), (3, 7), (2, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_feed_forward_shape_and_positionwise(shape, dtype):
    torch.manual_seed(0)
    ff = FeedForward(E, FF).to(dtype)
    x = torch.randn(*shape, E, dtype=dtype)
    out = ff(x)
    assert out.shape == x.shape and out.dtype == dtype
    # Position-wise: each position is transformed on its own.
    torch.testing.assert_close(ff(x[:, :1]), out[:, :1])


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("backend", ["sdpa", "reference"])
@pytest.mark.parametrize("B,S", [(2, 5), (1, 9)])
def test_encoder_layer_shapes_and_weights(norm_first, backend, B, S):
    torch.manual_seed(0)
    layer = EncoderLayer(E, H, FF, backend=backend, norm_first=norm_first).eval()
    x = torch.randn(B, S, E)
    out, weights = layer(x)
    assert out.shape == (B, S, E) and weights is None
    out2, weights = layer(x, need_weights=True)
    torch.testing.assert_close(out, out2)
    assert weights.shape == (B, H, S, S)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, S))


def test_encoder_layer_submodule_names():
    layer = EncoderLayer(E, H, FF)
    for name in ("self_attn", "feed_forward", "norm1", "norm2"):
        assert isinstance(getattr(layer, name), nn.Module)
    assert isinstance(layer.self_attn, ac.MultiHeadAttention)
    decoder = DecoderLayer(E, H, FF)
    for name in ("self_attn", "cross_attn", "feed_forward", "norm1", "norm2", "norm3"):
        assert isinstance(getattr(decoder, name), nn.Module)


@pytest.mark.parametrize("norm_first", [True, False])
def test_backends_agree(norm_first):
    torch.manual_seed(0)
    sdpa = DecoderLayer(E, H, FF, backend="sdpa", norm_first=norm_first).eval()
    reference = DecoderLayer(E, H, FF, backend="reference", norm_first=norm_first).eval()
    reference.load_state_dict(sdpa.state_dict())
    x, memory = torch.randn(2, 6, E), torch.randn(2, 4, E)
    padding = torch.tensor([[False, False, False, True], [False, False, False, False]])
    a = sdpa(x, memory, memory_key_padding_mask=padding)[0]
    b = reference(x, memory, memory_key_padding_mask=padding)[0]
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("norm_first", [True, False])
def test_encoder_layer_matches_torch(norm_first):
    """Our layer equals nn.TransformerEncoderLayer (ReLU, same norm placement) with the same weights."""
    torch.manual_seed(0)
    theirs = nn.TransformerEncoderLayer(E, H, FF, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    ours = EncoderLayer(E, H, FF, norm_first=norm_first).eval()
    ours.self_attn = ac.MultiHeadAttention.from_torch(theirs.self_attn, backend="sdpa")
    with torch.no_grad():
        ours.feed_forward.expand.load_state_dict(theirs.linear1.state_dict())
        ours.feed_forward.contract.load_state_dict(theirs.linear2.state_dict())
        ours.norm1.load_state_dict(theirs.norm1.state_dict())
        ours.norm2.load_state_dict(theirs.norm2.state_dict())
    x = torch.randn(3, 7, E)
    padding = torch.zeros(3, 7, dtype=torch.bool)
    padding[1, 5:] = True
    expected = theirs(x, src_key_padding_mask=padding)
    got, _ = ours(x, key_padding_mask=padding)
    # nn's fast path may zero the padded rows; compare the real positions.
    keep = ~padding
    torch.testing.assert_close(got[keep], expected[keep], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("norm_first", [True, False])
def test_decoder_layer_matches_torch(norm_first):
    torch.manual_seed(0)
    theirs = nn.TransformerDecoderLayer(E, H, FF, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    ours = DecoderLayer(E, H, FF, norm_first=norm_first).eval()
    ours.self_attn = ac.MultiHeadAttention.from_torch(theirs.self_attn, backend="sdpa")
    ours.cross_attn = ac.MultiHeadAttention.from_torch(theirs.multihead_attn, backend="sdpa")
    with torch.no_grad():
        ours.feed_forward.expand.load_state_dict(theirs.linear1.state_dict())
        ours.feed_forward.contract.load_state_dict(theirs.linear2.state_dict())
        for i in (1, 2, 3):
            getattr(ours, f"norm{i}").load_state_dict(getattr(theirs, f"norm{i}").state_dict())
    x, memory = torch.randn(2, 6, E), torch.randn(2, 5, E)
    causal = nn.Transformer.generate_square_subsequent_mask(6)
    expected = theirs(x, memory, tgt_mask=causal, tgt_is_causal=True)
    got, _, _ = ours(x, memory, is_causal=True)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_decoder_layer_weights_shapes():
    layer = DecoderLayer(E, H, FF).eval()
    x, memory = torch.randn(2, 6, E), torch.randn(2, 4, E)
    out, self_w, cross_w = layer(x, memory, need_weights=True)
    assert out.shape == (2, 6, E) and self_w.shape == (2, H, 6, 6) and cross_w.shape == (2, H, 6, 4)
    # Causal: no weight above the diagonal.
    assert float(self_w.detach().triu(1).abs().max()) == 0.0
    _, none_self, none_cross = layer(x, memory)
    assert none_self is None and none_cross is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("norm_first", [True, False])
def test_transformer_shapes_and_weights(dtype, norm_first):
    torch.manual_seed(0)
    config = small_config(norm_first=norm_first)
    model = Transformer(config).to(dtype).eval()
    g = torch.Generator().manual_seed(1)
    src, tgt = random_ids(3, 7, 11, g, lengths=[7, 4, 2]), random_ids(3, 5, 13, g)
    logits, weights = model(src, tgt)
    assert logits.shape == (3, 5, 13) and logits.dtype == dtype and weights is None
    logits2, weights = model(src, tgt, need_weights=True)
    torch.testing.assert_close(logits, logits2)
    assert len(weights["encoder"]) == len(weights["self"]) == len(weights["cross"]) == 2
    assert weights["encoder"][0].shape == (3, H, 7, 7)
    assert weights["self"][0].shape == (3, H, 5, 5)
    assert weights["cross"][0].shape == (3, H, 5, 7)
    # Padding keys get no weight at all: sentence 1 has 4 real source characters, sentence 2 has 2.
    for w in weights["cross"]:
        w = w.detach()
        assert float(w[1, :, :, 4:].abs().max()) == 0.0 and float(w[2, :, :, 2:].abs().max()) == 0.0


@pytest.mark.parametrize("backend", ["sdpa", "reference"])
def test_no_future_leak_in_decoder(backend):
    """Changing a later target character leaves the logits at every earlier position unchanged."""
    torch.manual_seed(0)
    model = Transformer(small_config(backend=backend)).eval()
    g = torch.Generator().manual_seed(2)
    src, tgt = random_ids(2, 6, 11, g), random_ids(2, 8, 13, g)
    changed = tgt.clone()
    changed[:, 5] = (tgt[:, 5] % 12) + 1  # another real character at position 5
    assert not torch.equal(changed, tgt)
    before, _ = model(src, tgt)
    after, _ = model(src, changed)
    torch.testing.assert_close(before[:, :5], after[:, :5])
    assert not torch.allclose(before[:, 5:], after[:, 5:])  # the change does reach the later positions


def test_source_is_fully_visible():
    """The encoder is not causal: changing the last source character changes the first logits."""
    torch.manual_seed(0)
    model = Transformer(small_config()).eval()
    g = torch.Generator().manual_seed(3)
    src, tgt = random_ids(1, 6, 11, g), random_ids(1, 4, 13, g)
    changed = src.clone()
    changed[0, -1] = (src[0, -1] % 10) + 1
    assert not torch.allclose(model(src, tgt)[0][:, 0], model(changed, tgt)[0][:, 0])


@pytest.mark.parametrize("norm_first", [True, False])
def test_padding_invariance(norm_first):
    """Extra padding on the source or the target changes nothing at the real positions."""
    torch.manual_seed(0)
    model = Transformer(small_config(norm_first=norm_first)).eval()
    g = torch.Generator().manual_seed(4)
    src, tgt = random_ids(2, 6, 11, g, lengths=[6, 3]), random_ids(2, 5, 13, g, lengths=[5, 2])
    logits, _ = model(src, tgt)
    more_src = torch.cat([src, torch.zeros(2, 4, dtype=torch.long)], dim=1)
    more_tgt = torch.cat([tgt, torch.zeros(2, 3, dtype=torch.long)], dim=1)
    padded, _ = model(more_src, more_tgt)
    torch.testing.assert_close(padded[:, :5], logits, atol=1e-5, rtol=1e-4)
    # A sentence alone gives what it gives inside a padded batch.
    alone, _ = model(src[1:, :3], tgt[1:, :2])
    torch.testing.assert_close(alone, logits[1:, :2], atol=1e-5, rtol=1e-4)


def test_decode_matches_forward():
    torch.manual_seed(0)
    model = Transformer(small_config()).eval()
    g = torch.Generator().manual_seed(5)
    src, tgt = random_ids(2, 6, 11, g, lengths=[6, 4]), random_ids(2, 5, 13, g)
    memory, _ = model.encode(src)
    logits, _ = model.decode(tgt, memory, model.padding_of(src))
    torch.testing.assert_close(logits, model(src, tgt)[0])


def test_embeddings_scaled_by_sqrt_d_model():
    model = Transformer(small_config())
    ids = torch.tensor([[3]])
    raw = model.src_embedding.embedding.weight[3]
    torch.testing.assert_close(model.src_embedding(ids)[0, 0], raw * E ** 0.5)


def test_training_step_reduces_loss():
    torch.manual_seed(0)
    model = Transformer(small_config())
    g = torch.Generator().manual_seed(6)
    src, tgt = random_ids(4, 6, 11, g), random_ids(4, 6, 13, g)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(20):
        logits, _ = model(src, tgt[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 13), tgt[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_config_is_frozen_and_round_trips():
    config = small_config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.d_model = 32
    assert TransformerConfig(**config.to_dict()) == config


@pytest.mark.parametrize(
    "overrides,error",
    [
        (dict(d_model=15), ValueError),  # 4 heads do not divide 15
        (dict(d_model=0), ValueError),
        (dict(dropout=1.5), ValueError),
        (dict(backend="flash"), ValueError),
        (dict(pad_id=99), ValueError),
        (dict(num_heads=2.0), TypeError),
        (dict(norm_first="yes"), TypeError),
    ],
)
def test_config_rejects_bad_values(overrides, error):
    with pytest.raises(error, match=next(iter(overrides)).split("_")[0]):
        small_config(**overrides)


def test_bad_inputs_are_named():
    model = Transformer(small_config())
    with pytest.raises(ValueError, match="src"):
        model(torch.randn(2, 3), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="batch size"):
        model(torch.ones(2, 3, dtype=torch.long), torch.ones(3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="max_len"):
        model(torch.ones(1, 40, dtype=torch.long), torch.ones(1, 3, dtype=torch.long))
    with pytest.raises(TypeError, match="config"):
        Transformer({"d_model": 16})
    with pytest.raises(ValueError, match="num_heads"):
        EncoderLayer(16, 3, 32)
    with pytest.raises(ValueError, match="backend"):
        DecoderLayer(16, 4, 32, backend="flash")


def test_fully_masked_rows_give_no_nan():
    """A source made only of padding (nothing to attend to) gives finite outputs and gradients."""
    model = Transformer(small_config())
    src = torch.zeros(1, 4, dtype=torch.long)
    tgt = torch.ones(1, 3, dtype=torch.long)
    logits, _ = model(src, tgt)
    assert torch.isfinite(logits).all()
    logits.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_device_and_dtype_follow_the_model(device, dtype):
    model = Transformer(small_config()).to(device=device, dtype=dtype).eval()
    src = torch.ones(2, 5, dtype=torch.long, device=device)
    tgt = torch.ones(2, 4, dtype=torch.long, device=device)
    logits, weights = model(src, tgt, need_weights=True)
    assert logits.device.type == torch.device(device).type and logits.dtype == dtype
    assert weights["cross"][0].dtype == dtype and torch.isfinite(logits.float()).all()
