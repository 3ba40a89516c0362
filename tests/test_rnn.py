"""The GRU encoder-decoder of chapter 01 (no attention, Bahdanau, Luong) and its digit task."""

import pytest
import torch
import torch.nn.functional as F

import attn_course as ac
from attn_course.rnn import DIGIT_BOS, DIGIT_PAD, DIGIT_VOCAB_SIZE, GRUEncoder, AttentionDecoder, Seq2Seq, digit_task, shift_right

KINDS = ["none", "additive", "dot"]


pytestmark = pytest.mark.usefixtures("one_thread")


def _model(kind, bidirectional=False, seed=0, hidden_dim=12):
    torch.manual_seed(seed)
    return Seq2Seq(DIGIT_VOCAB_SIZE, embed_dim=5, hidden_dim=hidden_dim, attention=kind, bidirectional=bidirectional)


def _padded_batch(lengths, seed=0):
    """Right-padded digit strings of the given lengths, with their padding mask (True at padding)."""
    g = torch.Generator().manual_seed(seed)
    S = max(lengths)
    source = torch.randint(0, 10, (len(lengths), S), generator=g)
    mask = torch.arange(S)[None, :] >= torch.tensor(lengths)[:, None]  # (B, S)
    return source.masked_fill(mask, DIGIT_PAD), mask


# --- the digit task ---------------------------------------------------------------------------------

@pytest.mark.parametrize("B, S", [(4, 7), (1, 1), (3, 0), (0, 5)])
def test_digit_task_reverses_and_copies(B, S):
    source, target = digit_task(B, S, task="reverse", generator=torch.Generator().manual_seed(0))
    assert source.shape == target.shape == (B, S) and source.dtype == torch.int64
    assert torch.equal(target, source.flip(1))
    if source.numel():
        assert int(source.min()) >= 0 and int(source.max()) <= 9
    copy_source, copy_target = digit_task(B, S, task="copy", generator=torch.Generator().manual_seed(0))
    assert torch.equal(copy_source, source) and torch.equal(copy_target, copy_source)


def test_digit_task_is_reproducible_with_a_generator_and_goes_to_the_device(device):
    a = digit_task(8, 6, generator=torch.Generator().manual_seed(3), device=device)
    b = digit_task(8, 6, generator=torch.Generator().manual_seed(3), device=device)
    c = digit_task(8, 6, generator=torch.Generator().manual_seed(4), device=device)
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])
    assert a[0].device.type == torch.device(device).type


@pytest.mark.parametrize("call, error, pattern", [
    (lambda: digit_task(4, 5, task="sort"), ValueError, "task.*sort"),
    (lambda: digit_task(-1, 5), ValueError, "batch_size.*-1"),
    (lambda: digit_task(4, 2.5), TypeError, "length.*float"),
    (lambda: digit_task(4, 5, generator=0), TypeError, "generator.*int"),
])
def test_digit_task_bad_arguments(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()


def test_shift_right_feeds_the_previous_token_never_the_current_one():
    target = torch.tensor([[3, 1, 4], [1, 5, 9]])
    assert shift_right(target, DIGIT_BOS).tolist() == [[DIGIT_BOS, 3, 1], [DIGIT_BOS, 1, 5]]
    assert shift_right(target[:, :1], 7).tolist() == [[7], [7]]
    assert shift_right(target[:, :0], 7).shape == (2, 0)
    with pytest.raises(ValueError, match=r"target.*\(3,\)"):
        shift_right(torch.tensor([1, 2, 3]), DIGIT_BOS)
    with pytest.raises(ValueError, match="bos_id.*-1"):
        shift_right(target, -1)


# --- encoder ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("bidirectional", [False, True])
def test_encoder_shapes_and_final_state(bidirectional, device):
    encoder = GRUEncoder(DIGIT_VOCAB_SIZE, 5, 8, bidirectional=bidirectional).to(device)
    source, _ = digit_task(3, 6, generator=torch.Generator().manual_seed(0), device=device)
    states, final = encoder(source)
    assert states.shape == (3, 6, 8) and final.shape == (3, 8)
    # The forward half of the final state is the last state; the backward half is the first state's.
    half = 4 if bidirectional else 8
    torch.testing.assert_close(final[:, :half], states[:, -1, :half])
    if bidirectional:
        torch.testing.assert_close(final[:, half:], states[:, 0, half:])


@pytest.mark.parametrize("bidirectional", [False, True])
def test_encoder_padding_gives_each_row_what_it_gets_alone(bidirectional):
    encoder = GRUEncoder(DIGIT_VOCAB_SIZE, 5, 8, bidirectional=bidirectional)
    lengths = [5, 2, 4]
    source, mask = _padded_batch(lengths)
    states, final = encoder(source, mask)
    assert bool((states[mask] == 0).all()), "padding positions must hold zero states"
    for b, n in enumerate(lengths):
        states_b, final_b = encoder(source[b:b + 1, :n])
        torch.testing.assert_close(states[b:b + 1, :n], states_b)
        torch.testing.assert_close(final[b:b + 1], final_b)


def test_encoder_empty_row_gives_zeros():
    encoder = GRUEncoder(DIGIT_VOCAB_SIZE, 5, 8, bidirectional=True)
    source, mask = _padded_batch([3, 0])
    states, final = encoder(source, mask)
    assert bool((states[1] == 0).all()) and bool((final[1] == 0).all())
    assert not bool(torch.isnan(states).any())


@pytest.mark.parametrize("call, error, pattern", [
    (lambda e: e(torch.rand(2, 3)), TypeError, "source.*float32"),
    (lambda e: e(torch.tensor([[1, 12]])), ValueError, r"source.*\[0, 12\).*12"),
    (lambda e: e(torch.tensor([1, 2])), ValueError, r"source.*\(2,\)"),
    (lambda e: e(torch.zeros(2, 0, dtype=torch.long)), ValueError, r"source.*\(2, 0\)"),
    (lambda e: e(torch.ones(2, 3, dtype=torch.long), torch.zeros(2, 3)), TypeError, "source_padding_mask.*float32"),
    (lambda e: e(torch.ones(2, 3, dtype=torch.long), torch.zeros(2, 4, dtype=torch.bool)), ValueError, r"source_padding_mask.*\(2, 3\).*\(2, 4\)"),
    (lambda e: e(torch.ones(1, 3, dtype=torch.long), torch.tensor([[True, False, False]])), ValueError, "source_padding_mask.*end"),
])
def test_encoder_bad_input(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call(GRUEncoder(DIGIT_VOCAB_SIZE, 5, 8))


def test_constructors_check_their_arguments():
    with pytest.raises(ValueError, match="hidden_dim.*even.*7"):
        GRUEncoder(12, 5, 7, bidirectional=True)
    with pytest.raises(TypeError, match="bidirectional.*'yes'"):
        GRUEncoder(12, 5, 8, bidirectional="yes")
    with pytest.raises(ValueError, match="attention.*'luong'"):
        AttentionDecoder(12, 5, 8, attention="luong")
    with pytest.raises(ValueError, match="attention_dim.*'dot'"):
        AttentionDecoder(12, 5, 8, attention="dot", attention_dim=4)
    with pytest.raises(ValueError, match="embed_dim.*0"):
        Seq2Seq(12, embed_dim=0)


# --- decoder and the whole model ----------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bidirectional", [False, True])
def test_model_shapes_and_weights(kind, bidirectional, device):
    model = _model(kind, bidirectional).to(device)
    source, target = digit_task(4, 6, generator=torch.Generator().manual_seed(1), device=device)
    logits, weights = model(source, shift_right(target[:, :5], DIGIT_BOS))
    assert logits.shape == (4, 5, DIGIT_VOCAB_SIZE) and logits.device == source.device
    if kind == "none":
        assert weights is None
    else:
        assert weights.shape == (4, 5, 6)
        torch.testing.assert_close(weights.sum(-1), torch.ones(4, 5, device=device))


def test_decoder_uses_the_package_attention_modules():
    assert isinstance(_model("additive").decoder.attention, ac.AdditiveAttention)
    assert isinstance(_model("dot").decoder.attention, ac.DotProductAttention)
    assert _model("none").decoder.attention is None


@pytest.mark.parametrize("kind", KINDS)
def test_forward_equals_the_step_by_step_loop(kind):
    model = _model(kind, bidirectional=True)
    source, target = digit_task(3, 5, generator=torch.Generator().manual_seed(2))
    inputs = shift_right(target, DIGIT_BOS)
    logits, weights = model(source, inputs)
    states, final = model.encoder(source)
    state = final
    for i in range(5):
        step_logits, state, step_weights = model.decoder.step(inputs[:, i], state, states, final)
        torch.testing.assert_close(logits[:, i], step_logits)
        if kind != "none":
            torch.testing.assert_close(weights[:, i], step_weights)


@pytest.mark.parametrize("kind", KINDS)
def test_step_i_never_sees_later_decoder_inputs(kind):
    model = _model(kind)
    source, target = digit_task(2, 6, generator=torch.Generator().manual_seed(3))
    inputs = shift_right(target, DIGIT_BOS)
    changed = inputs.clone()
    changed[:, 4] = (changed[:, 4] + 1) % 10
    before, _ = model(source, inputs)
    after, _ = model(source, changed)
    torch.testing.assert_close(before[:, :4], after[:, :4])
    assert not torch.allclose(before[:, 4:], after[:, 4:])


def test_without_attention_only_the_final_encoder_state_reaches_the_decoder():
    model = _model("none")
    source, target = digit_task(2, 6, generator=torch.Generator().manual_seed(4))
    states, final = model.encoder(source)
    inputs = shift_right(target, DIGIT_BOS)
    logits, _ = model.decoder(inputs, states, final)
    other_logits, _ = model.decoder(inputs, torch.randn_like(states), final)  # scramble every h_j
    torch.testing.assert_close(logits, other_logits)
    attending = _model("dot")
    states, final = attending.encoder(source)
    assert not torch.allclose(attending.decoder(inputs, states, final)[0], attending.decoder(inputs, torch.randn_like(states), final)[0])


@pytest.mark.parametrize("kind", ["additive", "dot"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_padded_batch_equals_each_row_alone(kind, bidirectional):
    model = _model(kind, bidirectional)
    lengths = [6, 3, 4]
    source, mask = _padded_batch(lengths, seed=5)
    inputs = shift_right(source, DIGIT_BOS)  # any decoder inputs will do
    logits, weights = model(source, inputs, source_padding_mask=mask)
    assert bool((weights.masked_select(mask[:, None, :].expand_as(weights)) == 0).all())
    for b, n in enumerate(lengths):
        logits_b, weights_b = model(source[b:b + 1, :n], inputs[b:b + 1])
        torch.testing.assert_close(logits[b:b + 1], logits_b, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(weights[b:b + 1, :, :n], weights_b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_decode_feeds_back_its_own_predictions(kind, device):
    model = _model(kind, bidirectional=True).to(device)
    source, _ = digit_task(5, 7, generator=torch.Generator().manual_seed(6), device=device)
    tokens, weights = model.greedy_decode(source, 7, DIGIT_BOS)
    assert tokens.shape == (5, 7) and tokens.dtype == torch.int64 and not tokens.requires_grad
    # Teacher forcing with the model's own outputs reproduces them.
    logits, forced_weights = model(source, shift_right(tokens, DIGIT_BOS))
    assert torch.equal(logits.argmax(-1), tokens)
    if kind == "none":
        assert weights is None
    else:
        torch.testing.assert_close(weights, forced_weights)
    assert model.greedy_decode(source, 0, DIGIT_BOS)[0].shape == (5, 0)
    with pytest.raises(ValueError, match="bos_id.*12"):
        model.greedy_decode(source, 3, 12)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_other_dtypes(kind, dtype):
    model = _model(kind).to(dtype)
    source, target = digit_task(2, 4, generator=torch.Generator().manual_seed(7))
    logits, weights = model(source, shift_right(target, DIGIT_BOS))
    assert logits.dtype == dtype and bool(torch.isfinite(logits).all())
    if weights is not None:
        assert weights.dtype == dtype
    reference, _ = _model(kind).double()(source, shift_right(target, DIGIT_BOS))
    tolerance = dict(atol=1e-12, rtol=1e-10) if dtype == torch.float64 else dict(atol=0.1, rtol=0.1)
    torch.testing.assert_close(logits.double(), reference, **tolerance)


def test_decoder_bad_input():
    model = _model("dot")
    states, final = model.encoder(torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(TypeError, match="decoder_inputs.*float32"):
        model.decoder(torch.rand(2, 3), states, final)
    with pytest.raises(ValueError, match=r"encoder_states.*hidden_dim=12.*\(2, 3, 5\)"):
        model.decoder(torch.ones(2, 3, dtype=torch.long), torch.randn(2, 3, 5), final)
    with pytest.raises(ValueError, match=r"encoder_final.*\(2, 7\)"):
        model.decoder(torch.ones(2, 3, dtype=torch.long), states, torch.randn(2, 7))
    with pytest.raises(ValueError, match=r"batch.*\(4, 3\)"):
        model.decoder(torch.ones(4, 3, dtype=torch.long), states, final)


@pytest.mark.parametrize("kind", ["additive", "dot"])
def test_attention_models_learn_to_reverse_short_strings(kind):
    """A short run must clearly learn: a check that the pieces fit together, not a benchmark."""
    torch.manual_seed(0)
    model = Seq2Seq(DIGIT_VOCAB_SIZE, embed_dim=8, hidden_dim=32, attention=kind, bidirectional=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    g = torch.Generator().manual_seed(0)
    for _ in range(60):
        source, target = digit_task(32, 4, generator=g)
        logits, _ = model(source, shift_right(target, DIGIT_BOS))
        loss = F.cross_entropy(logits.flatten(0, 1), target.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    source, target = digit_task(200, 4, generator=torch.Generator().manual_seed(99))
    tokens, _ = model.greedy_decode(source, 4, DIGIT_BOS)
    accuracy = (tokens == target).float().mean().item()
    assert accuracy > 0.5, f"{kind}: held-out accuracy {accuracy:.2f} after 60 steps"


# --- chapter 01's exercise 4: Bahdanau's query with the previous token ---------------------------------

def test_token_in_query_scores_with_the_previous_state_and_token():
    torch.manual_seed(0)
    model = Seq2Seq(DIGIT_VOCAB_SIZE, embed_dim=5, hidden_dim=12, attention="additive", attention_dim=7,
                    bidirectional=True, token_in_query=True)
    decoder = model.decoder
    assert decoder.attention.query_dim == 12 + 5 and "token_in_query=True" in repr(decoder)
    source, target = digit_task(3, 6, generator=torch.Generator().manual_seed(8))
    states, final = model.encoder(source)
    tokens = torch.tensor([DIGIT_BOS, 3, 7])
    # The step written from the formula: e_ij = v^T tanh(W [s_{i-1}; y_{i-1}] + U h_j).
    y = decoder.embedding(tokens)  # (B, E)
    attention = decoder.attention
    query = torch.cat([final, y], dim=-1)  # (B, D + E)
    hidden = torch.tanh((query @ attention.W.weight.T)[:, None, :] + states @ attention.U.weight.T)  # (B, S, A)
    scores = hidden @ attention.v.weight[0]  # (B, S)
    weights = torch.softmax(scores, dim=-1)
    context = (weights[:, :, None] * states).sum(1)  # (B, D)
    state = decoder.cell(torch.cat([y, context], dim=-1), final)
    logits = decoder.output(torch.cat([state, context], dim=-1))
    got_logits, got_state, got_weights = decoder.step(tokens, final, states, final)
    torch.testing.assert_close(got_weights, weights)
    torch.testing.assert_close(got_state, state)
    torch.testing.assert_close(got_logits, logits)
    # The token matters now: the same state with another previous token gives other weights.
    _, _, other_weights = decoder.step(torch.tensor([1, 2, 9]), final, states, final)
    assert not torch.allclose(other_weights, got_weights)
    # Teacher forcing and greedy decoding run the same step.
    inputs = shift_right(target, DIGIT_BOS)
    logits_all, _ = model(source, inputs)
    torch.testing.assert_close(logits_all[:, 0], decoder.step(inputs[:, 0], final, states, final)[0])
    decoded, decoded_weights = model.greedy_decode(source, 6, DIGIT_BOS)
    assert decoded.shape == (3, 6) and decoded_weights.shape == (3, 6, 6)


def test_token_in_query_is_only_for_additive_attention():
    with pytest.raises(ValueError, match="token_in_query.*'dot'"):
        AttentionDecoder(12, 5, 8, attention="dot", token_in_query=True)
    with pytest.raises(TypeError, match="token_in_query.*'yes'"):
        AttentionDecoder(12, 5, 8, attention="additive", token_in_query="yes")
    assert "token_in_query" not in repr(AttentionDecoder(12, 5, 8, attention="additive"))
