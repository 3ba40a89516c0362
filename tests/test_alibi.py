"""ALiBi slopes and biases against the values of Press, Smith and Lewis (2022)."""

import math

import pytest
import torch
import torch.nn.functional as F

import attn_course as ac


def test_eight_heads_are_one_half_to_one_256th():
    expected = torch.tensor([1 / 2 ** k for k in range(1, 9)], dtype=torch.float64)
    torch.testing.assert_close(ac.alibi_slopes(8, dtype=torch.float64), expected, rtol=0, atol=0)


def test_sixteen_heads_start_at_one_over_sqrt_two():
    slopes = ac.alibi_slopes(16, dtype=torch.float64)
    torch.testing.assert_close(slopes, torch.tensor([2 ** (-0.5 * (h + 1)) for h in range(16)], dtype=torch.float64))


def _authors_get_slopes(n):
    """The function of the authors' released code (ofirpress/attention_with_linear_biases), transcribed: the paper
    itself defines the slopes for powers of two only; the code's "workaround" covers other head counts."""
    def power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        return [start * start ** i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + _authors_get_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("num_heads", [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20, 24, 32])
def test_slopes_follow_the_authors_code(num_heads):
    slopes = ac.alibi_slopes(num_heads, dtype=torch.float64)
    torch.testing.assert_close(slopes, torch.tensor(_authors_get_slopes(num_heads), dtype=torch.float64))
    assert slopes.shape == (num_heads,) and len(set(slopes.tolist())) == num_heads


def test_twelve_heads_explicitly():
    # 8 slopes of 8 heads, then every other slope of 16 heads: 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5
    expected = [2.0 ** -k for k in range(1, 9)] + [2.0 ** -(k + 0.5) for k in range(0, 4)]
    torch.testing.assert_close(ac.alibi_slopes(12, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64))


def test_bias_values_and_alignment():
    bias = ac.alibi_bias(4, 3, dtype=torch.float64)
    slopes = ac.alibi_slopes(4, dtype=torch.float64)
    assert bias.shape == (4, 3, 3)
    for h in range(4):
        for i in range(3):
            for j in range(3):
                assert float(bias[h, i, j]) == pytest.approx(-float(slopes[h]) * (i - j))
    # S > L: the queries are the last L positions (a cache), so the last query's row is -m * (S-1-j).
    cached = ac.alibi_bias(4, 2, 5, dtype=torch.float64)
    assert cached.shape == (4, 2, 5)
    torch.testing.assert_close(cached, ac.alibi_bias(4, 5, dtype=torch.float64)[:, -2:])
    torch.testing.assert_close(cached[:, -1, -1], torch.zeros(4, dtype=torch.float64))


def test_bias_is_a_working_attn_mask(device):
    H, L, D = 4, 6, 8
    q, k, v = (torch.randn(2, H, L, D, device=device) for _ in range(3))
    bias = ac.alibi_bias(H, L, device=device)
    causal = ac.causal_mask(L, device=device)  # True = may attend
    mask = bias.masked_fill(~causal, float("-inf"))
    ours, _ = ac.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(ours, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert bias.device.type == device.type


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_dtype(dtype):
    assert ac.alibi_bias(2, 3, dtype=dtype).dtype == dtype
    assert ac.alibi_slopes(2, dtype=dtype).dtype == dtype


BAD_CALLS = [
    (lambda: ac.alibi_slopes(0), ValueError, "num_heads"),
    (lambda: ac.alibi_slopes(2.0), TypeError, "num_heads"),
    (lambda: ac.alibi_bias(2, -1), ValueError, "query_len"),
    (lambda: ac.alibi_bias(2, 3, 2.5), TypeError, "key_len"),
    (lambda: ac.alibi_bias(2, 3, dtype=torch.long), TypeError, "dtype"),
]


@pytest.mark.parametrize("make_call, error, words", BAD_CALLS)
def test_bad_calls_raise_clear_errors(make_call, error, words):
    with pytest.raises(error, match=words):
        make_call()
