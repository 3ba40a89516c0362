"""The benchmark: every implementation computes the same thing; the table and the command line work."""

import csv
import io
import subprocess
import sys

import pytest
import torch
from torch import nn

import attn_course as ac
from attn_course import bench
from attn_course.bench import BASELINE, IMPLEMENTATIONS, PerHeadLoop, benchmark, peak_memory_bytes, to_csv, to_markdown

SMALL = dict(batch_size=2, length=16, embed_dim=16, num_heads=4, warmup=1, repeats=2)


def test_per_head_loop_equals_multihead_attention(device):
    torch.manual_seed(0)
    mha = ac.MultiHeadAttention(12, 3).to(device=device, dtype=torch.float64)
    loop = PerHeadLoop.from_multihead(mha)
    x = torch.randn(2, 5, 12, dtype=torch.float64, device=device)
    for is_causal in (False, True):
        expected, _ = mha(x, x, x, is_causal=is_causal)
        torch.testing.assert_close(loop(x, is_causal=is_causal), expected)


@pytest.mark.parametrize("causal", [True, False])
def test_every_implementation_computes_the_same_output(causal, device):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, batch_first=True).to(device=device, dtype=torch.float64)
    x = torch.randn(2, 7, 16, dtype=torch.float64, device=device)
    expected = IMPLEMENTATIONS[BASELINE](mha)[0](x, causal)
    for name, build in IMPLEMENTATIONS.items():
        step, params = build(mha)
        output = step(x, causal)
        assert output.shape == (2, 7, 16), name
        if "no projections" not in name:
            torch.testing.assert_close(output, expected, msg=name)
        output.sum().backward()  # every implementation can be differentiated


def test_benchmark_rows_and_ratios(device):
    results = benchmark(**SMALL, device=device)
    assert [r.implementation for r in results] == list(IMPLEMENTATIONS)
    baseline = next(r for r in results if r.implementation == BASELINE)
    assert baseline.ratio_to_baseline == 1.0
    for r in results:
        assert r.median_ms > 0 and r.min_ms <= r.median_ms and len(r.times_ms) == 2
        assert r.ratio_to_baseline == pytest.approx(r.median_ms / baseline.median_ms)
        assert (r.length, r.batch_size, r.device) == (16, 2, str(device))


def test_benchmark_subset_always_includes_the_baseline():
    results = benchmark(**SMALL, device="cpu", implementations=["MultiHeadAttention(backend='sdpa')"])
    assert [r.implementation for r in results] == ["MultiHeadAttention(backend='sdpa')", BASELINE]


def test_benchmark_measures_memory_on_cpu():
    results = benchmark(**SMALL, device="cpu", measure_memory=True, implementations=["MultiHeadAttention(backend='reference')"])
    assert all(r.peak_memory_mib is not None and r.peak_memory_mib > 0 for r in results)


@pytest.mark.parametrize(
    "kwargs, error, text",
    [
        (dict(implementations=["flash"]), ValueError, "IMPLEMENTATIONS"),
        (dict(embed_dim=10), ValueError, "num_heads must divide"),
        (dict(length=0), ValueError, "length"),
        (dict(repeats=0), ValueError, "repeats"),
        (dict(dtype=torch.long), TypeError, "dtype"),
        (dict(causal="yes"), TypeError, "causal"),
    ],
)
def test_benchmark_rejects_bad_arguments(kwargs, error, text):
    with pytest.raises(error, match=text):
        benchmark(**{**SMALL, **kwargs})


def test_peak_memory_sees_an_allocation_and_the_quadratic_weights():
    assert peak_memory_bytes(lambda: torch.ones(2**20), "cpu") >= 4 * 2**20
    q = torch.randn(1, 2, 512, 16)
    with torch.no_grad():
        explicit = peak_memory_bytes(lambda: ac.scaled_dot_product_attention(q, q, q), "cpu")
        fused = peak_memory_bytes(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q), "cpu")
    weights_bytes = 2 * 512 * 512 * 4
    assert explicit >= weights_bytes > fused
    assert peak_memory_bytes(lambda: None, "meta") is None


MIB8 = 8 * 2**20


def _freed_inside_an_operator():
    # An enclosing event (as an autograd Function or a fused kernel is) that allocates 8 MiB and frees it
    # before it ends: the release belongs to the outer event, the allocation to aten::empty inside it.
    with torch.autograd.profiler.record_function("outer"):
        scratch = torch.empty(MIB8, dtype=torch.uint8)
        scratch.fill_(1)
        del scratch


def _held_while_more_is_allocated():
    kept = torch.empty(MIB8, dtype=torch.uint8)  # 8 MiB alive ...
    with torch.autograd.profiler.record_function("outer"):
        more = torch.empty(MIB8 // 2, dtype=torch.uint8)  # ... while 4 MiB more come and go
        del more
    del kept


def test_peak_memory_counts_known_allocations_in_the_order_they_happen():
    # The review's case: a parent event's releases booked at its start hid the 8 MiB entirely.
    assert peak_memory_bytes(_freed_inside_an_operator, "cpu") == MIB8
    assert peak_memory_bytes(_held_while_more_is_allocated, "cpu") == MIB8 + MIB8 // 2
    assert peak_memory_bytes(lambda: torch.empty(MIB8, dtype=torch.uint8), "cpu") == MIB8  # returned, then freed
    assert peak_memory_bytes(lambda: None, "cpu") == 0


def test_peak_memory_sees_the_tiles_and_the_fused_kernels_buffers():
    torch.manual_seed(0)
    L, D = 1024, 16
    q, k, v = (torch.randn(1, 2, L, D, requires_grad=True) for _ in range(3))

    def tiled(block):
        return lambda: ac.tiled_attention(q, k, v, is_causal=True, query_block_size=block, key_block_size=block).sum().backward()

    small, large = peak_memory_bytes(tiled(64), "cpu"), peak_memory_bytes(tiled(512), "cpu")
    tile_bytes = 2 * 512 * 512 * 4  # one (B, H, 512, 512) float32 tile of scores
    assert large >= 3 * tile_bytes > small, (small, large)  # a larger tile, a larger working set
    gradients_and_output = 4 * 2 * L * D * 4  # q.grad, k.grad, v.grad and the output, (1, 2, L, D) float32 each
    fused = peak_memory_bytes(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                              .sum().backward(), "cpu")
    assert fused > gradients_and_output  # the old reconstruction returned exactly the gradients' 3 * 2 * L * D * 4


def test_peak_memory_reads_the_chrome_trace_where_the_event_tree_is_missing():
    class WithoutEventTree:  # a profiler result as a torch build without experimental_event_tree gives it
        def __init__(self, prof):
            self._prof = prof

        @property
        def profiler(self):
            raise AttributeError("no event tree")

        def export_chrome_trace(self, path):
            self._prof.export_chrome_trace(path)

    prof = bench._profiled(_held_while_more_is_allocated)
    from_tree = [size for _, size in bench._allocation_records(prof)]
    from_trace = [size for _, size in bench._allocation_records(WithoutEventTree(prof))]
    assert from_tree == from_trace == [MIB8, MIB8 // 2, -(MIB8 // 2), -MIB8]


def test_operator_counts_name_the_kernel_and_count_the_products():
    q = torch.randn(1, 2, 100, 16)
    with torch.no_grad():
        counts = bench.operator_counts(lambda: ac.tiled_attention(q, q, q, is_causal=True, query_block_size=32,
                                                                  key_block_size=32))
        fused = bench.operator_counts(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True))
    assert counts["aten::matmul"] == 2 * 10  # 10 of the 16 tiles of 32 (the causal skip), two products each
    assert "aten::scaled_dot_product_attention" in fused and "aten::matmul" not in fused


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_peak_memory_on_cuda():
    assert peak_memory_bytes(lambda: torch.ones(2**20, device="cuda"), "cuda") >= 4 * 2**20


def _rows():
    results = benchmark(**SMALL, device="cpu", implementations=["per-head loop (H x SelfAttention)"])
    results[0].peak_memory_mib = 1.5
    return results


def test_markdown_table():
    text = to_markdown(_rows())
    lines = text.strip().splitlines()
    assert lines[0].startswith("| implementation |") and f"ratio to {BASELINE}" in lines[0] and "peak memory (MiB)" in lines[0]
    assert len(lines) == 4 and all(line.count("|") == lines[0].count("|") for line in lines)
    assert "| 1.00 |" in lines[-1] and lines[-1].endswith("| n/a |")


def test_csv_table():
    rows = list(csv.DictReader(io.StringIO(to_csv(_rows()))))
    assert [r["implementation"] for r in rows] == ["per-head loop (H x SelfAttention)", BASELINE]
    assert float(rows[1]["ratio_to_baseline"]) == 1.0
    assert rows[0]["peak_memory_mib"] == "1.5" and rows[1]["peak_memory_mib"] == ""
    assert float(rows[0]["median_ms"]) > 0 and rows[0]["length"] == "16"


def test_main_writes_csv_and_markdown(tmp_path, capsys):
    csv_path, md_path = tmp_path / "t.csv", tmp_path / "t.md"
    code = bench.main(["--device", "cpu", "--batch", "1", "--length", "8", "16", "--embed-dim", "8", "--heads", "2",
                       "--repeats", "2", "--warmup", "0", "--csv", str(csv_path), "--markdown", str(md_path)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "causal self-attention, forward+backward" in printed and "load average" in printed
    rows = list(csv.DictReader(csv_path.open()))
    assert len(rows) == 2 * len(IMPLEMENTATIONS) and {r["length"] for r in rows} == {"8", "16"}
    assert md_path.read_text().startswith("| implementation |")


def test_module_runs_from_the_command_line():
    result = subprocess.run(
        [sys.executable, "-m", "attn_course.bench", "--device", "cpu", "--batch", "1", "--length", "8", "--embed-dim", "8",
         "--heads", "2", "--repeats", "1", "--warmup", "0", "--no-causal", "--csv", "-"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "unmasked self-attention" in result.stdout and "implementation,batch_size" in result.stdout


def test_main_rejects_unknown_implementations(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--only", "flash"])
    assert exit_info.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_gqa_decoding_reports_ratios_to_multihead_attention():
    from attn_course.bench import gqa_decoding, gqa_to_markdown

    results = gqa_decoding(batch_size=2, context=16, embed_dim=32, num_heads=8, kv_heads=(4, 1), device="cpu",
                           warmup=0, repeats=2)
    assert [r.num_kv_heads for r in results] == [8, 4, 1]  # multi-head attention first, the baseline
    assert results[0].time_ratio == 1.0 and results[0].cache_ratio == 1.0
    assert [r.cache_ratio for r in results] == [1.0, 0.5, 0.125]
    assert all(r.seconds_per_token > 0 for r in results)
    windowed = gqa_decoding(batch_size=1, context=16, embed_dim=32, num_heads=4, kv_heads=(2,), window=4, device="cpu",
                            warmup=0, repeats=1)
    assert windowed[1].cache_bytes_per_token == 2 * 2 * 8 * 4  # keys and values, 2 heads of width 8, float32
    assert "cache vs MHA" in gqa_to_markdown(results)


def test_linear_decoding_state_stays_constant_while_the_cache_grows(capsys):
    from attn_course.bench import LINEAR_DECODERS, linear_decoding, linear_to_markdown

    results = linear_decoding(batch_size=2, contexts=(32, 8), embed_dim=16, num_heads=2, device="cpu", warmup=0, repeats=2)
    assert [(r.implementation, r.context) for r in results] == [(name, c) for name in LINEAR_DECODERS for c in (8, 32)]
    rows = {(r.implementation, r.context): r for r in results}
    softmax, linear, delta = LINEAR_DECODERS
    # the KV cache holds context + 1 keys and values of 2 heads of width 8, float32; the states hold (D_k, D) per head
    assert [rows[softmax, c].memory_bytes_per_sequence for c in (8, 32)] == [2 * 2 * 8 * 9 * 4, 2 * 2 * 8 * 33 * 4]
    assert rows[linear, 8].memory_bytes_per_sequence == rows[linear, 32].memory_bytes_per_sequence == (2 * 8 * 8 + 2 * 8) * 4
    assert rows[delta, 8].memory_bytes_per_sequence == rows[delta, 32].memory_bytes_per_sequence == 2 * 8 * 8 * 4
    for r in results:
        assert r.seconds_per_token > 0
        assert r.time_vs_softmax == pytest.approx(r.seconds_per_token / rows[softmax, r.context].seconds_per_token)
        assert r.time_vs_shortest_context == pytest.approx(r.seconds_per_token / rows[r.implementation, 8].seconds_per_token)
    assert rows[softmax, 32].time_vs_softmax == 1.0 and rows[linear, 8].time_vs_shortest_context == 1.0
    assert "time vs softmax" in linear_to_markdown(results)
    assert bench.main(["--linear", "--device", "cpu", "--batch", "1", "--length", "4", "--embed-dim", "8", "--heads", "2",
                       "--repeats", "1", "--warmup", "0"]) == 0
    printed = capsys.readouterr().out
    assert "one decoding step after `context` tokens" in printed and "DeltaNetAttention, gated (state) | 4 |" in printed
    with pytest.raises(ValueError, match="contexts"):
        linear_decoding(contexts=())


def test_mla_decoding_reports_naive_absorbed_and_the_cache_ratios(capsys):
    from attn_course.bench import mla_decoding, mla_to_markdown

    results = mla_decoding(batch_size=2, context=12, embed_dim=32, num_heads=4, device="cpu", warmup=0, repeats=2)
    rows = {r.attention.split(" (")[0]: r for r in results}
    assert list(rows) == ["MHA", "GQA", "MLA naive", "MLA absorbed"]
    D = 32 // 4  # head width; DeepSeek-V2's proportions: d_c = 4 D, d_h^R = D / 2
    assert rows["MHA"].cache_bytes_per_token == 2 * 4 * D * 4 and rows["MHA"].time_ratio == 1.0
    assert rows["GQA"].cache_bytes_per_token == 2 * 1 * D * 4  # H / 4 = 1 key/value head
    for name in ("MLA naive", "MLA absorbed"):
        assert rows[name].cache_bytes_per_token == (4 * D + D // 2) * 4  # the latent and the rotary key, float32
        assert rows[name].cache_ratio == pytest.approx((4 * D + D // 2) / (2 * 4 * D))
    for r in results:
        assert r.seconds_per_token > 0 and r.context == 12
        assert r.time_ratio == pytest.approx(r.seconds_per_token / rows["MHA"].seconds_per_token)
    assert "MLA absorbed | 12 |" in mla_to_markdown(results)
    assert bench.main(["--mla", "--device", "cpu", "--batch", "1", "--length", "6", "9", "--embed-dim", "16", "--heads",
                       "2", "--repeats", "1", "--warmup", "0"]) == 0
    printed = capsys.readouterr().out
    assert "one cached decoding step" in printed and "| MLA naive (d_c = 32, d_h^R = 4) | 6 |" in printed
    assert "| MLA absorbed | 9 |" in printed and "| MHA (G = 2) | 9 | " in printed  # every --length, not the first only
    with pytest.raises(ValueError, match="num_heads must divide"):
        mla_decoding(embed_dim=30, num_heads=4)
