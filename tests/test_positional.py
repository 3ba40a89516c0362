"""Positional encodings and token embeddings (chapter 06): the sinusoidal formula against a direct
computation, its index range and wavelengths, its relative-position structure, the modules' device
and dtype handling, the learned alternative, and the token embedding's scaling."""

import math

import pytest
import torch

import attn_course as ac

SIZES = [(1, 2), (7, 4), (50, 16), (33, 7), (10, 1), (128, 64)]  # (max_len, d_model), odd widths included
FLOAT_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 1e-2, torch.float16: 1e-3}


def _direct(max_len, d_model):
    """Vaswani et al.'s formula, one entry at a time, with Python's math module."""
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    for pos in range(max_len):
        for i in range((d_model + 1) // 2):  # i < d_model / 2: one (sin, cos) pair per i
            angle = pos / 10000 ** (2 * i / d_model)
            pe[pos, 2 * i] = math.sin(angle)
            if 2 * i + 1 < d_model:
                pe[pos, 2 * i + 1] = math.cos(angle)
    return pe


def _frequencies(pe):
    """Recover each (sin, cos) pair's angular frequency from the encoding itself, at position 1."""
    pairs = pe.shape[1] // 2
    return torch.atan2(pe[1, 0 : 2 * pairs : 2], pe[1, 1 : 2 * pairs : 2])  # (d_model // 2,), each in (0, 1]


@pytest.mark.parametrize("max_len, d_model", SIZES)
def test_formula_matches_a_direct_computation(max_len, d_model):
    pe = ac.sinusoidal_positional_encoding(max_len, d_model, dtype=torch.float64)
    assert pe.shape == (max_len, d_model)
    torch.testing.assert_close(pe, _direct(max_len, d_model), atol=1e-12, rtol=0)


@pytest.mark.parametrize("d_model", [2, 8, 64, 512])
def test_index_range_gives_wavelengths_from_2pi_to_below_10000_2pi(d_model):
    pe = ac.sinusoidal_positional_encoding(2, d_model, dtype=torch.float64)
    omega = _frequencies(pe)
    assert omega.shape == (d_model // 2,)
    wavelengths = 2 * math.pi / omega
    i = torch.arange(d_model // 2, dtype=torch.float64)
    torch.testing.assert_close(wavelengths, 2 * math.pi * 10000 ** (2 * i / d_model))
    assert wavelengths[0].item() == pytest.approx(2 * math.pi)
    # The last pair has i = d_model/2 - 1: wavelength 2*pi * 10000^(1 - 2/d_model), below 10000 * 2*pi.
    assert wavelengths[-1].item() == pytest.approx(2 * math.pi * 10000 ** (1 - 2 / d_model))
    assert wavelengths.max().item() < 10000 * 2 * math.pi
    # A geometric progression: a constant ratio between neighbouring pairs.
    if d_model > 2:
        ratios = wavelengths[1:] / wavelengths[:-1]
        torch.testing.assert_close(ratios, torch.full_like(ratios, 10000 ** (2 / d_model)))


@pytest.mark.parametrize("d_model", [1, 3, 7, 9])
def test_odd_width_keeps_the_last_sine_and_drops_its_cosine(d_model):
    pe = ac.sinusoidal_positional_encoding(20, d_model, dtype=torch.float64)
    assert pe.shape == (20, d_model)
    last_i = (d_model - 1) // 2
    position = torch.arange(20, dtype=torch.float64)
    torch.testing.assert_close(pe[:, -1], torch.sin(position / 10000 ** (2 * last_i / d_model)))
    # At position 0 every sine is 0 and every cosine 1: ceil(d/2) sines, floor(d/2) cosines, interleaved.
    expected_first_row = torch.tensor([float(j % 2) for j in range(d_model)], dtype=torch.float64)
    torch.testing.assert_close(pe[0], expected_first_row)
    # The exponent divides by d_model itself, not by the even width d_model - 1.
    if d_model >= 5:
        assert not torch.allclose(pe[:, :-1], ac.sinusoidal_positional_encoding(20, d_model - 1, dtype=torch.float64))


@pytest.mark.parametrize("d_model", [4, 16, 128])
def test_every_pair_lies_on_the_unit_circle_so_the_norm_is_sqrt_half_width(d_model):
    pe = ac.sinusoidal_positional_encoding(300, d_model, dtype=torch.float64)
    pair_norms = pe[:, 0::2] ** 2 + pe[:, 1::2] ** 2
    torch.testing.assert_close(pair_norms, torch.ones_like(pair_norms))
    torch.testing.assert_close(pe.norm(dim=-1), torch.full((300,), math.sqrt(d_model / 2), dtype=torch.float64))


def _rotation(offset, d_model):
    """The block-diagonal map M_k with PE[pos + k] = M_k @ PE[pos] (even d_model)."""
    omega = 10000 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    M = torch.zeros(d_model, d_model, dtype=torch.float64)
    c, s = torch.cos(omega * offset), torch.sin(omega * offset)
    M[0::2, 0::2] = torch.diag(c)
    M[0::2, 1::2] = torch.diag(s)
    M[1::2, 0::2] = torch.diag(-s)
    M[1::2, 1::2] = torch.diag(c)
    return M


@pytest.mark.parametrize("offset", [0, 1, 5, 37])
@pytest.mark.parametrize("d_model", [2, 16, 64])
def test_a_shift_by_k_is_one_linear_map_for_every_position(offset, d_model):
    pe = ac.sinusoidal_positional_encoding(100, d_model, dtype=torch.float64)
    M = _rotation(offset, d_model)
    torch.testing.assert_close(pe[: 100 - offset] @ M.T, pe[offset:])  # (P, E) @ (E, E)
    torch.testing.assert_close(M @ M.T, torch.eye(d_model, dtype=torch.float64))  # a rotation


@pytest.mark.parametrize("d_model", [8, 32, 128])
def test_dot_products_depend_only_on_the_distance(d_model):
    pe = ac.sinusoidal_positional_encoding(60, d_model, dtype=torch.float64)
    gram = pe @ pe.T  # (60, 60)
    omega = 10000 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    distance = torch.arange(60, dtype=torch.float64)
    by_distance = torch.cos(distance[:, None] * omega).sum(-1)  # (60,): sum_i cos(omega_i * k)
    expected = by_distance[(torch.arange(60)[:, None] - torch.arange(60)).abs()]
    torch.testing.assert_close(gram, expected)
    # Largest at distance 0 (a position is most similar to itself).
    assert bool((gram.diagonal()[:, None] >= gram - 1e-9).all())


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_encoding_follows_the_requested_device_and_dtype(dtype, device):
    if device.type == "mps" and dtype == torch.float64:
        pytest.skip("MPS has no float64")
    pe = ac.sinusoidal_positional_encoding(40, 12, device=device, dtype=dtype)
    assert pe.device.type == device.type and pe.dtype == dtype
    torch.testing.assert_close(pe.cpu().double(), _direct(40, 12), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


def test_encoding_defaults_to_torchs_default_dtype():
    assert ac.sinusoidal_positional_encoding(3, 4).dtype == torch.get_default_dtype()
    assert ac.sinusoidal_positional_encoding(0, 4).shape == (0, 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("shape", [(5, 8), (2, 5, 8), (2, 3, 5, 8)])
def test_positional_encoding_adds_on_the_inputs_device_and_dtype(shape, dtype, device):
    if device.type == "mps" and dtype == torch.float64:
        pytest.skip("MPS has no float64")
    module = ac.PositionalEncoding(8, max_len=16)  # left on the CPU in float32 on purpose
    x = torch.randn(shape, dtype=torch.float64).to(device=device, dtype=dtype)
    out = module(x)
    assert out.shape == x.shape and out.dtype == dtype and out.device == x.device
    expected = x.double().cpu() + _direct(16, 8)[:5]
    torch.testing.assert_close(out.double().cpu(), expected, atol=TOLERANCE[dtype] * 10, rtol=TOLERANCE[dtype] * 10)


@pytest.mark.parametrize("start", [0, 1, 7, 11])
def test_start_offset_adds_later_positions(start):
    module = ac.PositionalEncoding(6, max_len=16)
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    out = module(x, start=start)
    torch.testing.assert_close(out, x + _direct(16, 6)[start : start + 5], atol=1e-6, rtol=0)
    # One token at a time (cached decoding) gives the same as the whole sequence.
    whole = module(x)
    stepwise = torch.cat([module(x[:, t : t + 1], start=t) for t in range(5)], dim=1)
    torch.testing.assert_close(stepwise, whole)


def test_positional_encoding_max_len_is_a_hard_limit():
    module = ac.PositionalEncoding(4, max_len=10)
    module(torch.zeros(1, 10, 4))  # exactly max_len works
    module(torch.zeros(1, 3, 4), start=7)
    with pytest.raises(ValueError, match=r"positions 0 to 10 were asked for, but max_len=10 covers positions 0 to 9"):
        module(torch.zeros(1, 11, 4))
    with pytest.raises(ValueError, match=r"positions 8 to 10 .*max_len=10"):
        module(torch.zeros(1, 3, 4), start=8)


def test_positional_encoding_buffer_is_fixed_and_not_saved():
    module = ac.PositionalEncoding(8, max_len=12)
    assert list(module.parameters()) == []
    assert "pe" not in module.state_dict()
    torch.testing.assert_close(module.pe, ac.sinusoidal_positional_encoding(12, 8))


def test_positional_encoding_dropout_only_in_training():
    module = ac.PositionalEncoding(8, max_len=12, dropout=0.5)
    x = torch.randn(4, 12, 8)
    torch.manual_seed(0)
    train_out = module.train()(x)
    assert bool((train_out == 0).any())
    torch.testing.assert_close(module.eval()(x), x + module.pe)


# --- learned positions --------------------------------------------------------------------------

def test_learned_embedding_adds_its_table_rows():
    torch.manual_seed(0)
    module = ac.LearnedPositionalEmbedding(max_len=10, d_model=6)
    x = torch.randn(3, 4, 6)
    torch.testing.assert_close(module(x), x + module.embedding.weight[:4])
    torch.testing.assert_close(module(x, start=6), x + module.embedding.weight[6:10])
    assert module.embedding.weight.std().item() == pytest.approx(0.02, rel=0.5)
    assert sum(p.numel() for p in module.parameters()) == 10 * 6


def test_learned_embedding_trains_only_the_positions_it_sees():
    module = ac.LearnedPositionalEmbedding(max_len=10, d_model=6)
    module(torch.randn(2, 4, 6)).pow(2).sum().backward()
    grad = module.embedding.weight.grad
    assert bool((grad[:4].abs().sum(-1) > 0).all())
    assert bool((grad[4:] == 0).all())  # rows 4..9 learn nothing from length-4 sequences


def test_learned_embedding_cannot_go_beyond_max_len():
    module = ac.LearnedPositionalEmbedding(max_len=8, d_model=4)
    module(torch.zeros(1, 8, 4))
    with pytest.raises(ValueError, match=r"positions 0 to 8 .*max_len=8 covers positions 0 to 7"):
        module(torch.zeros(1, 9, 4))
    with pytest.raises(ValueError, match=r"positions 8 to 9 .*max_len=8"):
        module(torch.zeros(1, 2, 4), start=8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_learned_embedding_follows_the_input_dtype_and_device(dtype, device):
    if device.type == "mps" and dtype == torch.float64:
        pytest.skip("MPS has no float64")
    module = ac.LearnedPositionalEmbedding(max_len=8, d_model=4).to(device)
    x = torch.randn(2, 5, 4).to(device=device, dtype=dtype)
    out = module(x)
    assert out.dtype == dtype and out.device == x.device
    if device.type != "cpu":
        with pytest.raises(ValueError, match="position table is on"):
            module.cpu()(x)


# --- token embeddings ---------------------------------------------------------------------------

@pytest.mark.parametrize("d_model", [1, 16, 512])
def test_token_embedding_scales_by_sqrt_d_model(d_model):
    module = ac.TokenEmbedding(50, d_model)
    tokens = torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])
    out = module(tokens)
    assert out.shape == (2, 5, d_model)
    torch.testing.assert_close(out, module.embedding.weight[tokens] * math.sqrt(d_model))


def test_token_embedding_size_is_comparable_to_the_positional_encoding():
    torch.manual_seed(0)
    d_model = 512
    module = ac.TokenEmbedding(1000, d_model)
    raw = module.embedding.weight
    assert raw.std().item() == pytest.approx(d_model**-0.5, rel=0.05)  # like a width-512 linear layer
    scaled_norm = module(torch.arange(1000)).norm(dim=-1).mean().item()
    pe_norm = ac.sinusoidal_positional_encoding(1, d_model).norm().item()  # sqrt(d_model / 2) = 16
    assert raw.norm(dim=-1).mean().item() == pytest.approx(1.0, rel=0.1)
    assert scaled_norm == pytest.approx(math.sqrt(d_model), rel=0.1)
    assert 1.0 < scaled_norm / pe_norm < 2.0


def test_token_embedding_padding_idx_is_zero_and_gets_no_gradient():
    module = ac.TokenEmbedding(10, 8, padding_idx=0)
    tokens = torch.tensor([[0, 3, 0, 7]])
    out = module(tokens)
    assert bool((out[0, 0] == 0).all()) and bool((out[0, 2] == 0).all())
    assert bool((out[0, 1] != 0).any())
    out.sum().backward()
    assert bool((module.embedding.weight.grad[0] == 0).all())
    assert bool((module.embedding.weight.grad[3] != 0).all())


def test_token_embedding_on_a_device(device):
    module = ac.TokenEmbedding(10, 8).to(device)
    out = module(torch.tensor([[1, 2]], device=device))
    assert out.device.type == device.type


@pytest.mark.parametrize(
    "make, error, pattern",
    [
        (lambda: ac.TokenEmbedding(10, 8)(torch.tensor([[1.0, 2.0]])), TypeError, "integer ids.*float32"),
        (lambda: ac.TokenEmbedding(10, 8)(torch.tensor([[True]])), TypeError, "integer ids.*bool"),
        (lambda: ac.TokenEmbedding(10, 8)(torch.tensor([[1, 10]])), ValueError, r"\[0, 10\).*1 to 10"),
        (lambda: ac.TokenEmbedding(10, 8)(torch.tensor([[-1, 2]])), ValueError, r"\[0, 10\).*-1 to 2"),
        (lambda: ac.TokenEmbedding(10, 8)([1, 2]), TypeError, "tokens must be a torch.Tensor.*list"),
        (lambda: ac.TokenEmbedding(10, 8, padding_idx=10), ValueError, "padding_idx.*vocab_size=10.*10"),
        (lambda: ac.TokenEmbedding(0, 8), ValueError, "vocab_size.*0"),
        (lambda: ac.TokenEmbedding(10, 8.0), TypeError, "d_model.*float"),
        (lambda: ac.PositionalEncoding(8, max_len=0), ValueError, "max_len.*0"),
        (lambda: ac.PositionalEncoding(8, dropout=1.5), ValueError, "dropout.*1.5"),
        (lambda: ac.PositionalEncoding(8)(torch.zeros(1, 2, 8), start=-1), ValueError, "start.*-1"),
        (lambda: ac.PositionalEncoding(8)(torch.zeros(1, 2, 8, dtype=torch.long)), TypeError, "x must be a floating-point.*int64"),
        (lambda: ac.PositionalEncoding(8)(torch.zeros(8)), ValueError, r"x must have at least 2 dimensions.*\(8,\)"),
        (lambda: ac.LearnedPositionalEmbedding(8, 4)(torch.zeros(1, 2, 5)), ValueError, r"d_model=4.*\(1, 2, 5\)"),
        (lambda: ac.LearnedPositionalEmbedding(8, 4, init_std=0.0), ValueError, "init_std.*0"),
        (lambda: ac.LearnedPositionalEmbedding(8, 4, init_std="small"), TypeError, "init_std.*str"),
        (lambda: ac.LearnedPositionalEmbedding(8.5, 4), TypeError, "max_len.*float"),
        (lambda: ac.LearnedPositionalEmbedding(8, 4)(torch.zeros(1, 2, 4), start=1.0), TypeError, "start.*float"),
        (lambda: ac.sinusoidal_positional_encoding(4, 8, dtype=torch.int32), TypeError, "floating-point.*int32"),
    ],
)
def test_bad_input_names_the_argument(make, error, pattern):
    with pytest.raises(error, match=pattern):
        make()
