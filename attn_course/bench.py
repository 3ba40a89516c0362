"""Chapter 08: a benchmark of multi-head attention implementations, forward and backward.

Run it from a shell::

    python -m attn_course.bench                          # batch 8, length 512, width 512, 8 heads, causal
    python -m attn_course.bench --length 256 512 1024 --csv times.csv --markdown times.md
    python -m attn_course.bench --device cpu --dtype bfloat16 --repeats 10
    python -m attn_course.bench --linear --length 256 1024 4096 16384   # chapter 12: one decoding step
    python -m attn_course.bench --mla --length 256 1024 4096            # chapter 11: latent attention, one decoding step

or from Python with :func:`benchmark`. Every implementation computes the same function (the same
weights, copied from one ``nn.MultiheadAttention``; :func:`benchmark` checks that their outputs
agree before timing), except ``F.scaled_dot_product_attention``, which is the attention step alone,
without the four projections, to show how much of the time the projections take.

The implementations are timed in turns (one step of each, then the next round), so that a change
in the machine's load affects all of them alike; the table reports the median over the rounds and
the ratio to ``nn.MultiheadAttention`` measured in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import check_bool, check_positive_int, describe
from .gqa import GroupedQueryAttention
from .latent import MultiHeadLatentAttention
from .linear import DeltaNetAttention, LinearAttention
from .multihead import MultiHeadAttention
from .scaled import SelfAttention
from .utils import get_device

__all__ = [
    "IMPLEMENTATIONS",
    "BASELINE",
    "BenchResult",
    "PerHeadLoop",
    "benchmark",
    "time_forward_backward",
    "peak_memory_bytes",
    "operator_counts",
    "synchronize",
    "to_markdown",
    "to_csv",
    "main",
    "GQADecodingResult",
    "gqa_decoding",
    "gqa_to_markdown",
    "LinearDecodingResult",
    "MLADecodingResult",
    "mla_decoding",
    "mla_to_markdown",
    "linear_decoding",
    "linear_to_markdown",
]

BASELINE = "nn.MultiheadAttention"


class PerHeadLoop(nn.Module):
    """Multi-head attention the slow way: ``H`` separate :class:`SelfAttention` heads in a Python loop.

    Args:
        embed_dim: model width ``E``.
        num_heads: number of heads ``H``; each has width ``D = E / H``.

    Shape:
        - x: ``(B, T, E)`` -> output: ``(B, T, E)``
    """

    def __init__(self, embed_dim: int, num_heads: int) -> None:
        super().__init__()
        check_positive_int("embed_dim", embed_dim)
        check_positive_int("num_heads", num_heads)
        if embed_dim % num_heads:
            raise ValueError(f"num_heads must divide embed_dim, got embed_dim={embed_dim} and num_heads={num_heads}")
        head_dim = embed_dim // num_heads
        self.heads = nn.ModuleList(SelfAttention(embed_dim, head_dim, qkv_bias=True) for _ in range(num_heads))
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    @classmethod
    def from_multihead(cls, module: MultiHeadAttention) -> "PerHeadLoop":
        """Copy the weights of an :class:`attn_course.MultiHeadAttention` (with biases), head by head."""
        E, H, D = module.embed_dim, module.num_heads, module.head_dim
        loop = cls(E, H).to(device=module.q_proj.weight.device, dtype=module.q_proj.weight.dtype)
        with torch.no_grad():
            for h, head in enumerate(loop.heads):
                rows = slice(h * D, (h + 1) * D)  # head h owns rows h*D .. (h+1)*D of each projection
                for ours, theirs in ((head.W_query, module.q_proj), (head.W_key, module.k_proj), (head.W_value, module.v_proj)):
                    ours.weight.copy_(theirs.weight[rows])  # (D, E)
                    ours.bias.copy_(theirs.bias[rows])  # (D,)
            loop.out_proj.load_state_dict(module.out_proj.state_dict())
        return loop

    def forward(self, x: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
        contexts = [head(x, is_causal=is_causal)[0] for head in self.heads]  # H tensors (B, T, D)
        return self.out_proj(torch.cat(contexts, dim=-1))  # (B, T, H * D) -> (B, T, E)


# Each entry builds a step function ``step(x, is_causal) -> output`` from a reference
# nn.MultiheadAttention (whose weights it copies). The order is the order of the table.
def _build_per_head_loop(mha: nn.MultiheadAttention):
    loop = PerHeadLoop.from_multihead(MultiHeadAttention.from_torch(mha))
    return lambda x, is_causal: loop(x, is_causal=is_causal), list(loop.parameters())


def _build_ours(backend: str):
    def build(mha: nn.MultiheadAttention):
        ours = MultiHeadAttention.from_torch(mha, backend=backend)
        return lambda x, is_causal: ours(x, x, x, is_causal=is_causal, need_weights=False)[0], list(ours.parameters())

    return build


def _build_torch(mha: nn.MultiheadAttention):
    causal_blocked = {}  # length -> (L, L) bool mask, True = blocked (nn.MultiheadAttention's convention)

    def step(x, is_causal):
        if not is_causal:
            return mha(x, x, x, need_weights=False)[0]
        L = x.size(1)
        if L not in causal_blocked:
            causal_blocked[L] = torch.ones(L, L, dtype=torch.bool, device=x.device).triu(1)  # (L, L)
        # As a user would call it for causal self-attention: the mask, plus is_causal=True as a hint.
        return mha(x, x, x, attn_mask=causal_blocked[L], is_causal=True, need_weights=False)[0]

    return step, list(mha.parameters())


def _build_sdpa_only(mha: nn.MultiheadAttention):
    H = mha.num_heads
    cache = {}

    def step(x, is_causal):
        B, L, E = x.shape
        if x.shape not in cache:  # three (B, H, L, D) leaf tensors, made once per shape
            g = torch.Generator(device=x.device).manual_seed(0)
            cache[x.shape] = [
                torch.randn(B, H, L, E // H, generator=g, device=x.device, dtype=x.dtype).requires_grad_() for _ in range(3)
            ]
        q, k, v = cache[x.shape]
        out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)  # (B, H, L, D)
        return out.transpose(1, 2).reshape(B, L, E)  # (B, H, L, D) -> (B, L, E)

    return step, []


IMPLEMENTATIONS: dict[str, Callable] = {
    "per-head loop (H x SelfAttention)": _build_per_head_loop,
    "MultiHeadAttention(backend='reference')": _build_ours("reference"),
    "MultiHeadAttention(backend='sdpa')": _build_ours("sdpa"),
    BASELINE: _build_torch,
    "F.scaled_dot_product_attention (no projections)": _build_sdpa_only,
}


@dataclass
class BenchResult:
    """One row of the benchmark table. Times are in milliseconds, memory in MiB."""

    implementation: str
    batch_size: int
    length: int
    embed_dim: int
    num_heads: int
    causal: bool
    device: str
    dtype: str
    median_ms: float
    min_ms: float
    repeats: int
    ratio_to_baseline: float = math.nan
    peak_memory_mib: float | None = None
    times_ms: list = field(default_factory=list, repr=False)


def synchronize(device: torch.device) -> None:
    """Wait for the device to finish its queued work (a no-op on the CPU), so that timings are real."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def _one_step(step: Callable, x: torch.Tensor, is_causal: bool, grad_output: torch.Tensor | None) -> torch.Tensor:
    output = step(x, is_causal)  # (B, L, E)
    output.backward(torch.ones_like(output) if grad_output is None else grad_output)
    return output


def _clear_grads(x: torch.Tensor, params) -> None:
    x.grad = None
    for p in params:
        p.grad = None


def time_forward_backward(
    step: Callable, x: torch.Tensor, *, is_causal: bool = True, warmup: int = 2, repeats: int = 5, params=()
) -> list[float]:
    """Time ``repeats`` forward+backward passes of ``step(x, is_causal)``, after ``warmup`` untimed ones.

    Args:
        step: a function of ``(x, is_causal)`` that returns a tensor depending on ``x`` (or on parameters).
        x: the input, with ``requires_grad=True``.
        is_causal: passed on to ``step``.
        warmup: untimed passes first (memory allocation, kernel selection).
        repeats: timed passes.
        params: parameters whose ``.grad`` is cleared (untimed) before every pass.

    Returns:
        The wall-clock time of each timed pass, in seconds (the device is synchronised around each).
    """
    check_positive_int("warmup", warmup, allow_zero=True)
    check_positive_int("repeats", repeats)
    grad_output = None
    times = []
    for i in range(warmup + repeats):
        _clear_grads(x, params)
        synchronize(x.device)
        start = time.perf_counter()
        output = _one_step(step, x, is_causal, grad_output)
        synchronize(x.device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
        del output
    return times


@contextlib.contextmanager
def _native_stderr_silenced():
    """Some torch builds print a line to the C-level stderr whenever the profiler starts; hide it."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, io.UnsupportedOperation):  # no real file descriptor (some notebook frontends)
        yield
        return
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _profiled(fn: Callable[[], object]):
    """Run ``fn()`` under ``torch.profiler`` with memory records, its start-up line on stderr hidden."""
    from torch.profiler import ProfilerActivity, profile

    with _native_stderr_silenced(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return prof


def _allocation_records(prof) -> list[tuple[float, int]]:
    """Every CPU allocation (+ bytes) and release (- bytes) that ``prof`` recorded, in the order they happened.

    Each record carries its own time stamp, whichever operator (or none) it happened in; the records
    are read from the profiler's event tree (what ``torch.profiler``'s own memory timeline reads), or,
    where a torch build lacks it, from the Chrome trace that :meth:`export_chrome_trace` writes.
    """
    records = []
    try:
        roots = prof.profiler.kineto_results.experimental_event_tree()
        from torch._C._profiler import _EventType

        allocation = _EventType.Allocation
    except (AttributeError, ImportError):
        roots = None
    if roots is not None:
        stack = list(reversed(roots))  # depth first, children in order
        while stack:
            node = stack.pop()
            if node.tag == allocation and str(node.extra_fields.device).startswith("cpu"):
                records.append((node.start_time_ns, len(records), int(node.extra_fields.alloc_size)))
            stack.extend(reversed(node.children))
    else:
        import json
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "trace.json")
            prof.export_chrome_trace(path)
            with open(path, encoding="utf-8") as f:
                trace = json.load(f)
        events = trace["traceEvents"] if isinstance(trace, dict) else trace
        for event in events:
            args = event.get("args", {})
            if event.get("name") == "[memory]" and args.get("Device Type", 0) == 0:  # 0: the CPU
                records.append((float(event["ts"]), len(records), int(args["Bytes"])))
    records.sort()  # by time; records of the same time stay in the order they were recorded
    return [(time_stamp, size) for time_stamp, _, size in records]


def peak_memory_bytes(fn: Callable[[], object], device: torch.device) -> int | None:
    """Peak memory that ``fn()`` allocates on ``device`` beyond what was allocated before it ran.

    On CUDA this is exact (``torch.cuda.max_memory_allocated``). On the CPU it replays, in the
    order they happened, every allocation and release through PyTorch's allocator that
    ``torch.profiler`` records (with ``profile_memory=True``), inside operators or between them, and
    returns the highest running total. It therefore sees a kernel's scratch buffers, temporaries
    freed inside one operator, and tensors kept for the backward pass. It does not see memory that
    a library allocates by itself, outside PyTorch's allocator (a BLAS's packing buffers, say).
    Elsewhere (MPS) it returns None.

    Args:
        fn: the work to measure, for example a forward and backward pass.
        device: where ``fn`` allocates its tensors.

    Returns:
        Bytes, or None when the device offers no way to measure.
    """
    device = torch.device(device)
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    if device.type != "cpu":
        return None
    current = peak = 0
    for _, size in _allocation_records(_profiled(fn)):
        current += size
        peak = max(peak, current)
    return peak


def operator_counts(fn: Callable[[], object]) -> dict[str, int]:
    """How many times ``fn()`` called each PyTorch operator, as ``torch.profiler`` records them.

    For example ``operator_counts(lambda: F.scaled_dot_product_attention(q, k, v))`` names the kernel
    that PyTorch dispatched to on this machine, and counting ``"aten::matmul"`` counts the matrix
    products of a Python loop.

    Args:
        fn: the work to inspect.

    Returns:
        ``{operator name: number of calls}``, in the order the operators were first called.
    """
    from torch.profiler import ProfilerActivity, profile

    with _native_stderr_silenced(), profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    counts: dict[str, int] = {}
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        counts[event.name] = counts.get(event.name, 0) + 1
    return counts


def _check_agreement(outputs: dict[str, torch.Tensor]) -> None:
    names = [n for n in outputs if n in IMPLEMENTATIONS and IMPLEMENTATIONS[n] is not _build_sdpa_only]
    if BASELINE not in outputs:
        return
    reference = outputs[BASELINE].detach().double()
    tolerance = 1e-3 if outputs[BASELINE].dtype == torch.float32 else 5e-2
    for name in names:
        difference = (outputs[name].detach().double() - reference).abs().max().item()
        if not difference <= tolerance * max(1.0, reference.abs().max().item()):
            raise RuntimeError(f"{name} disagrees with {BASELINE}: largest difference {difference:.3g}")


def benchmark(
    batch_size: int = 8,
    length: int = 512,
    embed_dim: int = 512,
    num_heads: int = 8,
    *,
    causal: bool = True,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    warmup: int = 2,
    repeats: int = 5,
    implementations: list[str] | None = None,
    measure_memory: bool = False,
    seed: int = 0,
) -> list[BenchResult]:
    """Time forward+backward of each implementation of multi-head self-attention on one input.

    Args:
        batch_size: ``B``.
        length: sequence length ``L`` (queries and keys: self-attention).
        embed_dim: model width ``E``.
        num_heads: heads ``H``.
        causal: causal self-attention (as in a decoder) or unmasked.
        device: where to run (default :func:`attn_course.get_device`).
        dtype: floating-point dtype of weights and input.
        warmup: untimed rounds first.
        repeats: timed rounds; the median is reported.
        implementations: names from :data:`IMPLEMENTATIONS` (default: all; the baseline
            ``nn.MultiheadAttention`` is always included, for the ratios).
        measure_memory: also measure the peak memory of one pass (see :func:`peak_memory_bytes`).
        seed: seed for the weights and the input.

    Returns:
        One :class:`BenchResult` per implementation, in the order of :data:`IMPLEMENTATIONS`.
    """
    for name, value in (("batch_size", batch_size), ("length", length), ("embed_dim", embed_dim), ("num_heads", num_heads)):
        check_positive_int(name, value)
    check_bool("causal", causal)
    check_bool("measure_memory", measure_memory)
    check_positive_int("warmup", warmup, allow_zero=True)
    check_positive_int("repeats", repeats)
    if embed_dim % num_heads:
        raise ValueError(f"num_heads must divide embed_dim, got embed_dim={embed_dim} and num_heads={num_heads}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {describe(dtype)}")
    names = list(IMPLEMENTATIONS) if implementations is None else list(implementations)
    unknown = [n for n in names if n not in IMPLEMENTATIONS]
    if unknown:
        raise ValueError(f"implementations must be names from IMPLEMENTATIONS {list(IMPLEMENTATIONS)}, got {unknown}")
    if BASELINE not in names:
        names.append(BASELINE)
    names = [n for n in IMPLEMENTATIONS if n in names]
    device = get_device() if device is None else torch.device(device)

    torch.manual_seed(seed)
    mha = nn.MultiheadAttention(embed_dim, num_heads, batch_first=True).to(device=device, dtype=dtype)
    steps = {name: IMPLEMENTATIONS[name](mha) for name in names}
    x = torch.randn(batch_size, length, embed_dim, device=device, dtype=dtype, requires_grad=True)

    with torch.no_grad():
        _check_agreement({name: step(x, causal) for name, (step, _) in steps.items()})

    for _ in range(warmup):
        for name, (step, params) in steps.items():
            time_forward_backward(step, x, is_causal=causal, warmup=0, repeats=1, params=params)
    times = {name: [] for name in names}
    for _ in range(repeats):  # round-robin, so that load changes hit every implementation alike
        for name, (step, params) in steps.items():
            times[name] += time_forward_backward(step, x, is_causal=causal, warmup=0, repeats=1, params=params)

    results = []
    for name in names:
        ms = [1000.0 * t for t in times[name]]
        memory = None
        if measure_memory:
            step, params = steps[name]
            _clear_grads(x, params)
            peak = peak_memory_bytes(lambda: _one_step(step, x, causal, None), device)
            memory = None if peak is None else peak / 2**20
        results.append(BenchResult(
            implementation=name, batch_size=batch_size, length=length, embed_dim=embed_dim, num_heads=num_heads,
            causal=causal, device=str(device), dtype=str(dtype).replace("torch.", ""),
            median_ms=statistics.median(ms), min_ms=min(ms), repeats=repeats, peak_memory_mib=memory, times_ms=ms,
        ))
    baseline = next(r.median_ms for r in results if r.implementation == BASELINE)
    for r in results:
        r.ratio_to_baseline = r.median_ms / baseline
    return results


_COLUMNS = ["implementation", "batch_size", "length", "embed_dim", "num_heads", "causal", "device", "dtype",
            "median_ms", "min_ms", "repeats", "ratio_to_baseline", "peak_memory_mib"]


def to_markdown(results: list[BenchResult]) -> str:
    """The results as a markdown table: one row per implementation and length."""
    with_memory = any(r.peak_memory_mib is not None for r in results)
    header = ["implementation", "B", "L", "E", "H", "median fwd+bwd (ms)", f"ratio to {BASELINE}"]
    if with_memory:
        header.append("peak memory (MiB)")
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["--:"] * (len(header) - 1)) + "|"]
    for r in results:
        cells = [f"`{r.implementation}`", str(r.batch_size), str(r.length), str(r.embed_dim), str(r.num_heads),
                 f"{r.median_ms:.1f}", f"{r.ratio_to_baseline:.2f}"]
        if with_memory:
            cells.append("n/a" if r.peak_memory_mib is None else f"{r.peak_memory_mib:.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def to_csv(results: list[BenchResult]) -> str:
    """The results as CSV text with a header row (times in ms, memory in MiB)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for r in results:
        row = {k: v for k, v in asdict(r).items() if k in _COLUMNS}
        row["median_ms"], row["min_ms"] = f"{r.median_ms:.3f}", f"{r.min_ms:.3f}"
        row["ratio_to_baseline"] = f"{r.ratio_to_baseline:.4f}"
        row["peak_memory_mib"] = "" if r.peak_memory_mib is None else f"{r.peak_memory_mib:.1f}"
        writer.writerow(row)
    return buffer.getvalue()


def _environment(device: torch.device) -> str:
    parts = [f"torch {torch.__version__}", f"device {device}"]
    if device.type == "cuda":
        parts.append(torch.cuda.get_device_name(device))
    else:
        parts.append(f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads")
    if hasattr(os, "getloadavg"):
        parts.append("load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    return ", ".join(parts)


_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m attn_course.bench",
        description="Time forward+backward of multi-head self-attention implementations; ratios are to "
        "nn.MultiheadAttention measured in the same run.",
    )
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1, mps (default: CUDA, then MPS, then CPU)")
    parser.add_argument("--dtype", default="float32", choices=list(_DTYPES))
    parser.add_argument("--batch", type=int, default=8, help="batch size B (default 8)")
    parser.add_argument("--length", type=int, nargs="+", default=None,
                        help="sequence length(s) L (default 512); with --linear the contexts (default 256 1024 4096)")
    parser.add_argument("--embed-dim", type=int, default=512, help="model width E (default 512)")
    parser.add_argument("--heads", type=int, default=8, help="number of heads H (default 8)")
    parser.add_argument("--no-causal", dest="causal", action="store_false", help="unmasked instead of causal self-attention")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first (default 2)")
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds; the median is reported (default 7)")
    parser.add_argument("--memory", action="store_true", help="also measure peak memory of one pass")
    parser.add_argument("--only", nargs="+", metavar="NAME", choices=list(IMPLEMENTATIONS),
                        help="run only these implementations (nn.MultiheadAttention is always run)")
    parser.add_argument("--csv", metavar="FILE", help="also write the table as CSV to FILE ('-' for stdout)")
    parser.add_argument("--markdown", metavar="FILE", help="also write the markdown table to FILE ('-' for stdout)")
    parser.add_argument("--gqa", action="store_true", help="time one cached decoding step of grouped-query attention "
                        "for 8, 4, 2 and 1 key/value heads instead (context = the first --length)")
    parser.add_argument("--window", type=int, default=None, help="with --gqa: a sliding window")
    parser.add_argument("--mla", action="store_true", help="time one cached decoding step of multi-head latent attention, "
                        "naive and absorbed, against MHA and GQA of the same width, for each context in --length "
                        "(default 256 1024 4096)")
    parser.add_argument("--linear", action="store_true", help="time one decoding step of softmax attention with a KV "
                        "cache against the recurrent steps of linear attention and the gated delta rule, for each "
                        "context in --length")
    return parser


def _median_step_times(steps: dict, device: torch.device, warmup: int, repeats: int) -> dict:
    """Run every step in turns, round after round (``warmup`` untimed rounds, then ``repeats`` timed
    ones), so that a change in the machine's load affects all of them alike; the median seconds of each."""
    times = {key: [] for key in steps}
    with torch.no_grad():
        for round_index in range(warmup + repeats):
            for key, step in steps.items():
                start = time.perf_counter()
                step()
                synchronize(device)
                if round_index >= warmup:
                    times[key].append(time.perf_counter() - start)
    return {key: statistics.median(values) for key, values in times.items()}


@dataclass
class GQADecodingResult:
    """One decoding step with a cache of ``context`` tokens: time and cache bytes per token, and their
    ratios to multi-head attention (``num_kv_heads == num_heads``) measured in the same run."""

    num_kv_heads: int
    window: int | None
    context: int
    seconds_per_token: float
    cache_bytes_per_token: float
    time_ratio: float
    cache_ratio: float


def gqa_decoding(
    batch_size: int = 8,
    context: int = 1024,
    embed_dim: int = 512,
    num_heads: int = 8,
    kv_heads: tuple[int, ...] = (8, 4, 2, 1),
    window: int | None = None,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    warmup: int = 2,
    repeats: int = 7,
    seed: int = 0,
    backend: str = "sdpa",
) -> list[GQADecodingResult]:
    """Time one cached decoding step of :class:`~attn_course.GroupedQueryAttention` (one new token
    per sequence, ``context`` tokens already cached) for each number of key/value heads.

    Every variant has the same width and query heads; the first row, with ``num_kv_heads ==
    num_heads`` (always included), is multi-head attention, the baseline of the ratios. The variants
    are timed in turns (one step of each per round) and the median over the rounds is reported.
    ``cache_bytes_per_token`` is the cache's memory divided by the tokens it holds (all of
    ``context + 1``, or the ``window`` kept when a window is given). ``backend`` is the module's:
    ``"sdpa"`` (PyTorch's fused kernel with ``enable_gqa=True``) or ``"reference"`` (the package's
    explicit softmax, the query heads of each group folded into one axis).
    """
    for name, value in (("batch_size", batch_size), ("context", context), ("embed_dim", embed_dim),
                        ("num_heads", num_heads), ("repeats", repeats)):
        check_positive_int(name, value)
    check_positive_int("warmup", warmup, allow_zero=True)
    device = get_device() if device is None else torch.device(device)
    heads = [num_heads] + [g for g in kv_heads if g != num_heads]
    torch.manual_seed(seed)
    modules = {g: GroupedQueryAttention(embed_dim, num_heads, g, window=window, backend=backend).to(device=device, dtype=dtype).eval()
               for g in heads}
    prompt = torch.randn(batch_size, context, embed_dim, device=device, dtype=dtype)  # (B, context, E)
    new_token = torch.randn(batch_size, 1, embed_dim, device=device, dtype=dtype)  # (B, 1, E)
    caches, filled = {}, {}
    with torch.no_grad():
        for g, module in modules.items():
            caches[g] = module.new_cache(batch_size, max_len=context + 1)
            module.forward_cached(prompt, caches[g])  # the prefill, untimed
            filled[g] = caches[g].length

    def step(g):
        cache = caches[g]
        cache._lengths = [filled[g]] * len(cache._lengths)  # forget the previous timed token: the same step each time
        modules[g].forward_cached(new_token, cache)

    median = _median_step_times({g: (lambda g=g: step(g)) for g in heads}, device, warmup, repeats)
    kept = context + 1 if window is None else min(window, context + 1)
    base_time = median[num_heads]
    base_bytes = caches[num_heads].nbytes / (batch_size * kept)
    results = []
    for g in heads:
        seconds = median[g]
        per_token = caches[g].nbytes / (batch_size * kept)
        results.append(GQADecodingResult(g, window, context, seconds, per_token, seconds / base_time, per_token / base_bytes))
    return results


def gqa_to_markdown(results: list[GQADecodingResult]) -> str:
    """The decoding results as a markdown table, ratios to multi-head attention of the same run."""
    lines = ["| key/value heads | window | context | ms per step (B new tokens) | time vs MHA | cache bytes per token | cache vs MHA |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r.num_kv_heads} | {r.window or '-'} | {r.context} | {1e3 * r.seconds_per_token:.3f} | "
                     f"{r.time_ratio:.2f} | {r.cache_bytes_per_token:,.0f} | {r.cache_ratio:.3f} |")
    return "\n".join(lines) + "\n"


@dataclass
class LinearDecodingResult:
    """One decoding step after ``context`` tokens: its time, the memory kept per sequence, and
    ratios measured in the same run (to softmax attention at the same context, and to the same
    implementation at the shortest context)."""

    implementation: str
    context: int
    seconds_per_token: float
    memory_bytes_per_sequence: int
    time_vs_softmax: float
    time_vs_shortest_context: float


LINEAR_DECODERS = ("softmax attention + KV cache", "LinearAttention (state)", "DeltaNetAttention, gated (state)")


def linear_decoding(
    batch_size: int = 8,
    contexts: tuple[int, ...] = (256, 1024, 4096),
    embed_dim: int = 512,
    num_heads: int = 8,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    warmup: int = 2,
    repeats: int = 7,
    seed: int = 0,
) -> list[LinearDecodingResult]:
    """Time one decoding step (one new token per sequence) after ``context`` earlier tokens, for
    softmax attention with a KV cache and for the recurrent step of linear attention and of the
    gated delta rule (chapter 12).

    Softmax attention (:class:`~attn_course.GroupedQueryAttention` with one key/value head per
    query head, ``backend="sdpa"``) reads a cache of ``context + 1`` keys and values: its step
    grows with the context. :class:`~attn_course.LinearAttention` and
    :class:`~attn_course.DeltaNetAttention` read and update a state of ``(B, H, D_k, D)`` numbers,
    the same after 10 tokens as after 10,000. The cache is filled with random keys and values
    and the states with random numbers (the cost of a step does not depend on what they hold).
    Every step of every implementation and context is timed in turns, round after round; the
    median over the rounds is reported. ``memory_bytes_per_sequence`` is the cache's or the
    state's memory divided by the batch size.
    """
    for name, value in (("batch_size", batch_size), ("embed_dim", embed_dim), ("num_heads", num_heads),
                        ("repeats", repeats)):
        check_positive_int(name, value)
    check_positive_int("warmup", warmup, allow_zero=True)
    if isinstance(contexts, int) or not contexts:
        raise ValueError(f"contexts must be a non-empty sequence of positive ints, got {describe(contexts)}")
    for context in contexts:
        check_positive_int("contexts[i]", context)
    if embed_dim % num_heads:
        raise ValueError(f"num_heads must divide embed_dim, got embed_dim={embed_dim} and num_heads={num_heads}")
    device = get_device() if device is None else torch.device(device)
    contexts = sorted(set(contexts))
    torch.manual_seed(seed)
    softmax, linear, delta = LINEAR_DECODERS
    modules = {
        softmax: GroupedQueryAttention(embed_dim, num_heads, num_heads, backend="sdpa"),
        linear: LinearAttention(embed_dim, num_heads),
        delta: DeltaNetAttention(embed_dim, num_heads, use_gate=True),
    }
    modules = {name: m.to(device=device, dtype=dtype).eval() for name, m in modules.items()}
    new_token = torch.randn(batch_size, 1, embed_dim, device=device, dtype=dtype)  # (B, 1, E)
    D = embed_dim // num_heads
    steps, memory = {}, {}
    with torch.no_grad():
        for context in contexts:
            cache = modules[softmax].new_cache(batch_size, max_len=context + 1)
            kv = torch.randn(2, batch_size, num_heads, context, D, device=device, dtype=dtype)  # (2, B, H, context, D)
            cache.update(0, kv[0], kv[1])  # as if `context` tokens had been decoded

            def softmax_step(cache=cache, context=context):
                cache._lengths = [context] * len(cache._lengths)  # forget the previous timed token: the same step each time
                modules[softmax].forward_cached(new_token, cache)

            steps[softmax, context] = softmax_step
            memory[softmax, context] = cache.nbytes // batch_size
            state = modules[linear].new_state(batch_size)
            state = type(state)(*(torch.rand_like(part) for part in state))
            steps[linear, context] = lambda state=state: modules[linear].forward_cached(new_token, state)
            memory[linear, context] = sum(part.numel() * part.element_size() for part in state) // batch_size
            delta_state = torch.randn_like(modules[delta].new_state(batch_size))
            steps[delta, context] = lambda state=delta_state: modules[delta].forward_cached(new_token, state)
            memory[delta, context] = delta_state.numel() * delta_state.element_size() // batch_size

    median = _median_step_times(steps, device, warmup, repeats)
    return [
        LinearDecodingResult(name, context, median[name, context], memory[name, context],
                             median[name, context] / median[softmax, context], median[name, context] / median[name, contexts[0]])
        for name in LINEAR_DECODERS for context in contexts
    ]


def linear_to_markdown(results: list[LinearDecodingResult]) -> str:
    """The linear decoding results as a markdown table."""
    lines = ["| implementation | context | ms per step (B new tokens) | time vs softmax | time vs shortest context | "
             "memory per sequence (KiB) |", "|---|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r.implementation} | {r.context} | {1e3 * r.seconds_per_token:.3f} | {r.time_vs_softmax:.2f} | "
                     f"{r.time_vs_shortest_context:.2f} | {r.memory_bytes_per_sequence / 1024:,.0f} |")
    return "\n".join(lines) + "\n"


@dataclass
class MLADecodingResult:
    """One cached decoding step of one attention after ``context`` tokens: time and cache bytes per
    token, and their ratios to multi-head attention measured in the same run."""

    attention: str
    context: int
    seconds_per_token: float
    cache_bytes_per_token: float
    time_ratio: float
    cache_ratio: float


def mla_decoding(
    batch_size: int = 8,
    context: int = 1024,
    embed_dim: int = 512,
    num_heads: int = 8,
    kv_latent_dim: int | None = None,
    rope_head_dim: int | None = None,
    num_kv_heads: int | None = None,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    warmup: int = 2,
    repeats: int = 7,
    seed: int = 0,
) -> list[MLADecodingResult]:
    """Time one cached decoding step (one new token per sequence, ``context`` tokens cached) of
    multi-head latent attention, naive and absorbed (chapter 11), against multi-head and
    grouped-query attention of the same width and heads.

    Every attention has ``H`` heads of width ``D = E / H`` and a rotary part, and uses
    ``backend="sdpa"``: :class:`~attn_course.GroupedQueryAttention` with ``G = H`` (the baseline of
    the ratios) and ``G = num_kv_heads`` (default ``H / 4``), rotary; and
    :class:`~attn_course.MultiHeadLatentAttention` with DeepSeek-V2's proportions by default,
    ``d_c = 4 D`` and ``d_h^R = D / 2``, once up-projecting the cached latents to keys and values
    (naive) and once scoring against them (absorbed). The caches are filled by a real prefill;
    before timing, the absorbed step is checked to give the naive step's output. The steps are
    timed in turns, round after round, and the median over the rounds is reported;
    ``cache_bytes_per_token`` is the cache's memory per token and sequence.
    """
    for name, value in (("batch_size", batch_size), ("context", context), ("embed_dim", embed_dim),
                        ("num_heads", num_heads), ("repeats", repeats)):
        check_positive_int(name, value)
    check_positive_int("warmup", warmup, allow_zero=True)
    if embed_dim % num_heads:
        raise ValueError(f"num_heads must divide embed_dim, got embed_dim={embed_dim} and num_heads={num_heads}")
    D = embed_dim // num_heads
    kv_latent_dim = 4 * D if kv_latent_dim is None else kv_latent_dim
    rope_head_dim = max(2, D // 4 * 2) if rope_head_dim is None else rope_head_dim
    num_kv_heads = max(1, num_heads // 4) if num_kv_heads is None else num_kv_heads
    device = get_device() if device is None else torch.device(device)
    torch.manual_seed(seed)
    mha, gqa = f"MHA (G = {num_heads})", f"GQA (G = {num_kv_heads})"
    naive, absorbed = f"MLA naive (d_c = {kv_latent_dim}, d_h^R = {rope_head_dim})", "MLA absorbed"
    latent = MultiHeadLatentAttention(embed_dim, num_heads, D, kv_latent_dim, rope_head_dim=rope_head_dim, backend="sdpa")
    modules = {mha: GroupedQueryAttention(embed_dim, num_heads, num_heads, rotary=True, backend="sdpa"),
               gqa: GroupedQueryAttention(embed_dim, num_heads, num_kv_heads, rotary=True, backend="sdpa"),
               naive: latent, absorbed: latent}
    modules = {name: module.to(device=device, dtype=dtype).eval() for name, module in modules.items()}
    prompt = torch.randn(batch_size, context, embed_dim, device=device, dtype=dtype)  # (B, context, E)
    new_token = torch.randn(batch_size, 1, embed_dim, device=device, dtype=dtype)  # (B, 1, E)
    caches, options = {}, {name: {} for name in modules}
    options[naive], options[absorbed] = {"absorb": False}, {"absorb": True}
    outputs = {}
    with torch.no_grad():
        for name, module in modules.items():
            caches[name] = module.new_cache(batch_size, context + 1)
            module.forward_cached(prompt, caches[name])  # the prefill, untimed

    def step(name):
        cache = caches[name]
        cache._lengths = [context] * cache.num_layers  # forget the previous timed token: the same step each time
        outputs[name] = modules[name].forward_cached(new_token, cache, **options[name])

    with torch.no_grad():
        step(naive), step(absorbed)
    tolerance = dict(atol=1e-4, rtol=1e-4) if dtype in (torch.float32, torch.float64) else dict(atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(outputs[absorbed], outputs[naive], **tolerance)  # the same step, two ways
    median = _median_step_times({name: (lambda name=name: step(name)) for name in modules}, device, warmup, repeats)
    return [MLADecodingResult(name, context, median[name], caches[name].bytes_per_token, median[name] / median[mha],
                              caches[name].bytes_per_token / caches[mha].bytes_per_token) for name in modules]


def mla_to_markdown(results: list[MLADecodingResult]) -> str:
    """The latent-attention decoding results as a markdown table, ratios to MHA of the same run."""
    lines = ["| attention | context | ms per step (B new tokens) | time vs MHA | cache bytes per token | cache vs MHA |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r.attention} | {r.context} | {1e3 * r.seconds_per_token:.3f} | {r.time_ratio:.2f} | "
                     f"{r.cache_bytes_per_token:,.0f} | {r.cache_ratio:.3f} |")
    return "\n".join(lines) + "\n"


def _write(target: str, text: str) -> None:
    if target == "-":
        sys.stdout.write(text)
    else:
        with open(target, "w", encoding="utf-8") as f:
            f.write(text)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point: run the benchmark and print a markdown table."""
    args = _parser().parse_args(argv)
    device = get_device() if args.device is None else torch.device(args.device)
    if args.linear:
        linear_results = linear_decoding(args.batch, tuple(args.length or (256, 1024, 4096)), args.embed_dim, args.heads,
                                         device=device, dtype=_DTYPES[args.dtype], warmup=args.warmup, repeats=args.repeats)
        print(f"one decoding step after `context` tokens, {args.dtype}; median of {args.repeats} rounds; {_environment(device)}")
        print(linear_to_markdown(linear_results))
        if args.markdown:
            _write(args.markdown, linear_to_markdown(linear_results))
        return 0
    if args.mla:
        mla_results = []
        for context in args.length or (256, 1024, 4096):  # every context, each with its own MHA baseline
            mla_results += mla_decoding(args.batch, context, args.embed_dim, args.heads, device=device,
                                        dtype=_DTYPES[args.dtype], warmup=args.warmup, repeats=args.repeats)
        print(f"one cached decoding step, {args.dtype}; median of {args.repeats} rounds; {_environment(device)}")
        print(mla_to_markdown(mla_results))
        if args.markdown:
            _write(args.markdown, mla_to_markdown(mla_results))
        return 0
    args.length = args.length or [512]
    if args.gqa:
        kv_heads = tuple(g for g in (args.heads, 4, 2, 1) if args.heads % g == 0)
        gqa_results = gqa_decoding(args.batch, args.length[0], args.embed_dim, args.heads, kv_heads, args.window,
                                   device=device, dtype=_DTYPES[args.dtype], warmup=args.warmup, repeats=args.repeats)
        print(f"one cached decoding step, {args.dtype}; median of {args.repeats} rounds; {_environment(device)}")
        print(gqa_to_markdown(gqa_results))
        if args.markdown:
            _write(args.markdown, gqa_to_markdown(gqa_results))
        return 0
    results = []
    for length in args.length:
        results += benchmark(
            args.batch, length, args.embed_dim, args.heads, causal=args.causal, device=device,
            dtype=_DTYPES[args.dtype], warmup=args.warmup, repeats=args.repeats, implementations=args.only,
            measure_memory=args.memory,
        )
    kind = "causal" if args.causal else "unmasked"
    print(f"{kind} self-attention, forward+backward, {args.dtype}; median of {args.repeats} rounds; {_environment(device)}")
    print(to_markdown(results))
    if args.csv:
        _write(args.csv, to_csv(results))
    if args.markdown:
        _write(args.markdown, to_markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
