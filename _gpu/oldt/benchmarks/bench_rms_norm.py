"""RMSNorm throughput against PyTorch's own paths, as GB/s and as a fraction of a same-run copy.

RMSNorm is memory-bound, so the ceiling is moving its bytes at copy speed. rms_norm: fwd reads x
and writes y (2·M·N elements), bwd reads x and dy and writes dx (3·M·N), fwd+bwd 5·M·N.
fused_add_rms_norm: fwd reads x and residual and writes y and h (4·M·N), bwd reads h and the two
output gradients and writes dx and dresidual (5·M·N). The weight, rstd and dw are negligible.
Every implementation is checked against the reference before it is timed; a wrong one is
reported as WRONG, not timed.

    python benchmarks/bench_rms_norm.py                       # CUDA if available, default grid
    python benchmarks/bench_rms_norm.py --device cpu --quick --plot bench.png
    python benchmarks/bench_rms_norm.py --op fused_add_rms_norm --shapes 32768x4096
    python benchmarks/bench_rms_norm.py --cuda-graphs           # GPU time alone, no host overhead
    python benchmarks/bench_rms_norm.py --cuda-graphs --rounds 5  # median of 5 interleaved rounds

By default each call is timed as eager code runs it, host overhead included: where the host
takes longer to issue a call (Python, dispatch, kernel launches) than the GPU takes to run it,
the host time is what is measured. --cuda-graphs times replays of each call captured in a CUDA
graph instead, as in a model run with torch.compile(mode="reduce-overhead"): the kernels alone,
each implementation writing its outputs to the same addresses.
Timings of one kernel move by a few tenths of a microsecond from one measurement to the next:
to compare kernels within that, time them over several interleaved rounds (--rounds), which also
prints this package's time minus the fastest other implementation's, paired round by round.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import functools
import gc
import importlib.util
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from oldt_ops import fused_add_rms_norm, reference, rms_norm

PACKAGE = "oldt_ops"

DEFAULT_GRID = [(m, n) for m in (4096, 8192, 32768, 65536) for n in (1024, 2048, 4096, 8192, 16384)]
QUICK_GRID = [(256, 1024), (1024, 4096)]
DECODE_ROWS = (1, 8, 64, 256)
DECODE_N = 4096
DECODE_MODES = {"autograd": contextlib.nullcontext, "inference": torch.inference_mode}
MODES = ("fwd", "bwd", "fwd+bwd")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
EPS = 1e-6


def _liger_rms_norm():
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except ImportError:
        print("note: Liger-Kernel is not installed; its RMSNorm is not measured", file=sys.stderr)
        return None
    # in_place=False: Liger otherwise overwrites dy with dx, and dy is reused across timings.
    return lambda x, w: LigerRMSNormFunction.apply(x, w, EPS, 0.0, "llama", False)


def rms_norm_spec():
    """Inputs, elements moved per mode (units of M·N), the reference and the implementations."""
    impls = {
        PACKAGE: lambda x, w: rms_norm(x, w, EPS),
        "F.rms_norm": lambda x, w: F.rms_norm(x, (x.shape[-1],), w, EPS),
        "compile(ref)": torch.compile(reference.rms_norm, dynamic=False),
        "eager ref": reference.rms_norm,
    }
    liger = _liger_rms_norm()
    if liger is not None:
        impls["liger"] = liger

    def make_inputs(m, n, dtype, device):
        return torch.randn(m, n, dtype=dtype, device=device), weight(n, dtype, device)

    return dict(
        units={"fwd": 2, "bwd": 3, "fwd+bwd": 5},
        make_inputs=make_inputs,
        reference=reference.rms_norm,
        impls=impls,
    )


def fused_add_rms_norm_spec():
    def unfused(norm):
        def fn(x, residual, w):
            h = x + residual
            return norm(h, w), h

        return fn

    impls = {
        PACKAGE: lambda x, r, w: fused_add_rms_norm(x, r, w, EPS),
        "unfused (ours)": unfused(lambda h, w: rms_norm(h, w, EPS)),
        "unfused F.": unfused(lambda h, w: F.rms_norm(h, (h.shape[-1],), w, EPS)),
        "compile(ref)": torch.compile(reference.fused_add_rms_norm, dynamic=False),
        "eager ref": reference.fused_add_rms_norm,
    }

    def make_inputs(m, n, dtype, device):
        x = torch.randn(m, n, dtype=dtype, device=device)
        return x, torch.randn_like(x), weight(n, dtype, device)

    return dict(
        units={"fwd": 4, "bwd": 5, "fwd+bwd": 9},
        make_inputs=make_inputs,
        reference=reference.fused_add_rms_norm,
        impls=impls,
    )


SPECS = {"rms_norm": rms_norm_spec, "fused_add_rms_norm": fused_add_rms_norm_spec}


def weight(n, dtype, device):
    return 1 + 0.1 * torch.randn(n, dtype=dtype, device=device)


def as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


def timer(device: str):
    """Returns time_ms(fn): the median time of one call."""
    return _cuda_event_ms if device == "cuda" else _wall_clock_ms


def capture(calls: dict, pool) -> tuple[dict, dict]:
    """Each of ``calls`` (mode: callable) captured in a CUDA graph: (mode: replay, mode: error).

    Every implementation of a shape captures into the one memory pool ``pool``, its outputs freed
    before the next capture, so all of them write their outputs to the same addresses: at some
    sizes a kernel's time depends on where its output lands by more than the gaps between the
    kernels. Capture must not run on the default stream, and a backward runs on the stream of its
    forward: main() runs the whole benchmark on a side stream, which the graphs capture on.
    """
    replays, failed = {}, {}
    for mode, call in calls.items():
        try:
            for _ in range(3):  # compiles, autotuning and allocator growth happen before capture
                call()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=torch.cuda.current_stream()):
                call()
        except RuntimeError as e:  # e.g. a call that cannot be captured in a CUDA graph
            failed[mode] = str(e).splitlines()[0]
        else:
            # The replay keeps the graph, and the call's closure the tensors it reads.
            replays[mode] = lambda graph=graph, call=call: graph.replay()
    return replays, failed


# Written before every timed call to evict the last one's data: 5x the L2 of an H100 or H200.
L2_FLUSH_BYTES = 256 << 20


@functools.cache
def _l2_reset():
    """The CUDA driver's cuCtxResetPersistingL2Cache: returns the L2 lines held under an
    evict-last policy to normal status (a no-op where it cannot be called).

    A flush does not evict those lines, and torch.compile's kernels load some data that way: on an
    H100 (bf16, 8192x4096), every kernel reading x after one torch.compile call on it took
    47.0 us instead of 50.0 through a 256 MB flush, as part of x was still in L2.
    """
    try:
        reset = ctypes.CDLL("nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1")
        reset = reset.cuCtxResetPersistingL2Cache
    except (OSError, AttributeError):
        reset = None
    torch.cuda.synchronize()  # it acts on the current CUDA context: this makes sure there is one
    if reset is None or reset() != 0:
        print("note: evict-last L2 lines cannot be reset here", file=sys.stderr)
        return lambda: None
    return reset


def _cuda_event_ms(fn, reps: int = 100) -> float:
    """Median device time of one call, each from a cold L2: evict-last lines reset, then the
    L2 flushed."""
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    for _ in range(5):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends, strict=True):
        # The reset takes effect when it returns, not in stream order: after the last call.
        torch.cuda.synchronize()
        _l2_reset()()
        flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))


def _wall_clock_ms(fn, min_seconds: float = 0.2, min_reps: int = 5) -> float:
    fn()
    times: list[float] = []
    while len(times) < min_reps or sum(times) < min_seconds * 1e3:
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def run(fn, inputs, grads=None):
    """Calls fn on fresh leaves; returns (outputs, input gradients or None)."""
    leaves = [t.detach().requires_grad_(grads is not None) for t in inputs]
    outs = as_tuple(fn(*leaves))
    if grads is None:
        return outs, None
    return outs, torch.autograd.grad(outs, leaves, grads)


def check(fn, ref, inputs, grads) -> str | None:
    """Compares outputs and gradients with the reference; returns what is wrong, or None."""
    want_outs, want_grads = run(ref, inputs, grads)
    outs, in_grads = run(fn, inputs, grads)
    tol = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}[inputs[0].dtype]
    named = [("output", outs, want_outs), ("gradient", in_grads, want_grads)]
    for kind, got, want in named:
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            # Compare relative to the largest entry: dw sums over all rows.
            err = (g.float() - w.float()).abs().max().item() if g.numel() else 0.0
            if err > tol * (1.0 + w.float().abs().max().item()):
                return f"{kind} {i} differs from the reference"
    return None


def fits(m: int, n: int, dtype: torch.dtype, device: str, copies: int = 1) -> bool:
    """Whether one shape's tensors (inputs, grads, fp32 temporaries of the eager paths) fit,
    `copies` times over (graph captures keep their own)."""
    if device != "cuda":
        return True
    need = copies * m * n * (dtype.itemsize * 10 + 4 * 8)
    free, _total = torch.cuda.mem_get_info()
    return need < 0.8 * free


def bench_shape(m, n, dtype, device, spec, time_ms, rounds=1, graphs=False) -> list[dict]:
    """Times every implementation and mode, and the copy, `rounds` times over, interleaved (each
    round in another order), so that clock and temperature drift spread over all of them; each
    row reports the median over the rounds and keeps every round's time. With `graphs`, each call
    is captured once and its replays are timed."""
    inputs = spec["make_inputs"](m, n, dtype, device)
    x = inputs[0]
    grads = tuple(torch.randn_like(o) for o in as_tuple(spec["reference"](*inputs)))
    copy_dst = torch.empty_like(x)
    element_bytes = m * n * dtype.itemsize
    impls = spec["impls"]
    problems = {name: check(fn, spec["reference"], inputs, grads) for name, fn in impls.items()}

    def copy():
        return copy_dst.copy_(x)

    calls: dict[str, dict] = {}
    failed: dict[tuple[str, str], str] = {}
    pool = torch.cuda.graph_pool_handle() if graphs else None
    for name, fn in impls.items():
        if not problems[name]:
            calls[name] = _calls(fn, inputs, grads)
            if graphs:
                calls[name], errors = capture(calls[name], pool)
                failed.update(((name, mode), e) for mode, e in errors.items())
    times: dict[tuple[str, str], list[float]] = {}
    order = ["copy", *impls]
    for r in range(rounds):
        for name in order[r % len(order) :] + order[: r % len(order)]:
            if name == "copy":
                # Always timed eagerly: captured, it becomes a DMA memcpy node, slower than the
                # copy kernel the same call launches eagerly.
                times.setdefault(("copy", "copy"), []).append(time_ms(copy))
                continue
            for mode, call in calls.get(name, {}).items():
                if (name, mode) in failed:
                    continue
                try:
                    times.setdefault((name, mode), []).append(time_ms(call))
                except RuntimeError as e:
                    failed[(name, mode)] = str(e).splitlines()[0]
    copy_times = times[("copy", "copy")]
    copy_ms = statistics.median(copy_times)
    copy_gbps = 2 * element_bytes / copy_ms / 1e6
    copy_row = dict(M=m, N=n, impl="copy", mode="copy", ms=copy_ms, gbps=copy_gbps, frac=1.0)
    rows = [dict(copy_row, status="ok", rounds_ms=copy_times)]
    for name in impls:
        for mode in MODES:
            row = dict(M=m, N=n, impl=name, mode=mode, ms=None, gbps=None, frac=None)
            if problems[name]:
                row["status"] = f"WRONG: {problems[name]}"
            elif (name, mode) in failed:
                row["status"] = f"FAILED: {failed[(name, mode)]}"
            else:
                ms = statistics.median(times[(name, mode)])
                gbps = spec["units"][mode] * element_bytes / ms / 1e6
                row.update(ms=ms, gbps=gbps, frac=gbps / copy_gbps, status="ok")
                row["rounds_ms"] = times[(name, mode)]
            rows.append(row)
    return rows


def _calls(fn, inputs, grads) -> dict:
    """The call that each mode times: the forward, the backward of one forward (replayed with
    retain_graph=True), and both."""
    leaves = [t.detach().requires_grad_() for t in inputs]
    outs = as_tuple(fn(*leaves))
    return {
        "fwd": lambda: fn(*inputs),
        "bwd": lambda: torch.autograd.grad(outs, leaves, grads, retain_graph=True),
        "fwd+bwd": lambda: torch.autograd.grad(as_tuple(fn(*leaves)), leaves, grads),
    }


def decode_latency(dtype, spec) -> list[dict]:
    """Per-call forward time at decode sizes, where launch and dispatch overhead shows: latency
    (host clock around a synchronized call) and host time (back-to-back calls, no synchronization:
    what a call costs the CPU). Measured with autograd on (inputs not requiring grad) and under
    torch.inference_mode(), where autograd's dispatch step is skipped, as in serving."""
    rows = []
    calls = 200
    for m in DECODE_ROWS:
        inputs = spec["make_inputs"](m, DECODE_N, dtype, "cuda")
        for mode, context in DECODE_MODES.items():
            for name, fn in spec["impls"].items():
                with context():
                    for _ in range(10):
                        fn(*inputs)
                    times = []
                    for _ in range(calls):
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        fn(*inputs)
                        torch.cuda.synchronize()
                        times.append((time.perf_counter() - t0) * 1e6)
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        fn(*inputs)
                    host_us = (time.perf_counter() - t0) * 1e6 / calls
                    torch.cuda.synchronize()
                us = statistics.median(times)
                rows.append(dict(M=m, N=DECODE_N, mode=mode, impl=name, us=us, host_us=host_us))
    return rows


def progress(items, desc):
    try:
        from tqdm import tqdm
    except ImportError:
        for i, item in enumerate(items):
            print(f"{desc}: {i + 1}/{len(items)} {item}", file=sys.stderr, flush=True)
            yield item
    else:
        yield from tqdm(items, desc=desc, file=sys.stderr)


def _cell(r) -> str:
    if r["status"] != "ok":
        return f" | {r['status'][:24]:>24}"
    return f" | {r['ms']:>11.4f} {r['gbps']:>6.0f} {r['frac']:>5.2f}"


def throughput_table(rows) -> str:
    """One line per shape and implementation: median ms, GB/s and fraction of copy, per mode."""
    impls = list(dict.fromkeys(r["impl"] for r in rows if r["impl"] != "copy"))
    shapes = list(dict.fromkeys((r["M"], r["N"]) for r in rows))
    head = f"{'M x N':>12} {'impl':<14}"
    head += "".join(f" | {mode + ' ms':>11} {'GB/s':>6} {'/copy':>5}" for mode in MODES)
    lines = [head, "-" * len(head)]
    for m, n in shapes:
        at = {(r["impl"], r["mode"]): r for r in rows if (r["M"], r["N"]) == (m, n)}
        lines.append(f"{f'{m}x{n}':>12} {'copy':<14}{_cell(at[('copy', 'copy')])}")
        for impl in impls:
            lines.append(
                f"{'':>12} {impl:<14}" + "".join(_cell(at[(impl, mode)]) for mode in MODES)
            )
    return "\n".join(lines)


def paired_table(rows) -> str:
    """Per shape and mode, this package's time minus the fastest other implementation's, round by
    round. The rounds of a shape run in turns, so each round's difference is paired: their median,
    and the rounds this package was ahead in, tell a gap of tenths of a microsecond from what moves
    between measurements better than two medians do."""
    lines = [f"{PACKAGE} minus the fastest other implementation, paired by round (us)"]
    lines.append(f"{'M x N':>12} {'mode':<8} {'median':>9} {'ahead':>6}  {'against':<14} rounds")
    for m, n in dict.fromkeys((r["M"], r["N"]) for r in rows):
        for mode in MODES:
            at = {
                r["impl"]: r
                for r in rows
                if (r["M"], r["N"], r["mode"], r["status"]) == (m, n, mode, "ok")
            }
            mine = at.pop(PACKAGE, None)
            if mine is None or not at:
                continue
            other = min(at.values(), key=lambda r: r["ms"])
            diffs = [
                (a - b) * 1e3 for a, b in zip(mine["rounds_ms"], other["rounds_ms"], strict=True)
            ]
            ahead = f"{sum(d < 0 for d in diffs)}/{len(diffs)}"
            lines.append(
                f"{f'{m}x{n}':>12} {mode:<8} {statistics.median(diffs):>+9.2f} {ahead:>6}  "
                f"{other['impl']:<14} " + " ".join(f"{d:+.2f}" for d in diffs)
            )
    return "\n".join(lines)


def decode_table(rows) -> str:
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    lines = [f"decode-size forward, us per call (latency / host time), N = {DECODE_N}"]
    lines.append(f"{'M':>5} {'mode':<10}" + "".join(f"{i:>16}" for i in impls))
    for m in DECODE_ROWS:
        for mode in DECODE_MODES:
            at = {r["impl"]: r for r in rows if (r["M"], r["mode"]) == (m, mode)}
            cells = (f"{at[i]['us']:>9.1f} /{at[i]['host_us']:>5.1f}" for i in impls)
            lines.append(f"{m:>5} {mode:<10}" + "".join(cells))
    return "\n".join(lines)


def plot(rows, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys((r["M"], r["N"]) for r in rows))
    labels = [f"{m}x{n}" for m, n in shapes]
    impls = list(dict.fromkeys(r["impl"] for r in rows if r["impl"] != "copy"))
    fig, axes = plt.subplots(1, 2, figsize=(max(10, len(shapes) * 0.9), 4.5), sharey=True)
    for ax, mode in zip(axes, ("fwd", "fwd+bwd"), strict=True):
        for impl in impls:
            by_shape = {
                (r["M"], r["N"]): r["frac"] for r in rows if (r["impl"], r["mode"]) == (impl, mode)
            }
            ax.plot(
                labels, [by_shape.get(s) or float("nan") for s in shapes], marker="o", label=impl
            )
        ax.axhline(1.0, color="gray", linestyle="--", linewidth=1)
        ax.set_title(mode)
        ax.set_xlabel("M x N")
        ax.tick_params(axis="x", rotation=60)
    axes[0].set_ylabel("fraction of copy bandwidth")
    axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_shapes(text: str) -> list[tuple[int, int]]:
    try:
        return [tuple(int(v) for v in s.lower().split("x")) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shapes wants MxN[,MxN...], got {text!r}") from None


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--op", choices=list(SPECS), default="rms_norm")
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None)
    parser.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    parser.add_argument("--shapes", type=parse_shapes, help="MxN[,MxN...], e.g. 32768x4096")
    parser.add_argument("--quick", action="store_true", help="a few small shapes")
    parser.add_argument("--impls", type=lambda t: t.split(","), help="a subset, comma-separated")
    parser.add_argument(
        "--cuda-graphs", action="store_true", help="time CUDA-graph replays: no host overhead"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="time each shape this many times over, interleaved, and report the median",
    )
    parser.add_argument("--plot", metavar="PATH.png", help="plot fraction of copy bandwidth")
    parser.add_argument("--json", metavar="PATH", help="write every row as JSON")
    args = parser.parse_args(argv)

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but CUDA is not available")
    if args.rounds < 1:
        parser.error(f"--rounds wants a positive count, got {args.rounds}")
    if args.cuda_graphs and device != "cuda":
        parser.error("--cuda-graphs needs --device cuda")
    if args.plot and importlib.util.find_spec("matplotlib") is None:  # before hours of timing
        parser.error('--plot needs matplotlib: pip install matplotlib (or the ".[bench]" extra)')
    dtype = DTYPES[args.dtype]
    grid = args.shapes or (QUICK_GRID if args.quick else DEFAULT_GRID)
    kept = [s for s in grid if fits(*s, dtype, device, copies=2 if args.cuda_graphs else 1)]
    for m, n in sorted(set(grid) - set(kept)):
        print(f"note: {m}x{n} skipped: not enough free device memory", file=sys.stderr)

    torch.manual_seed(0)
    # One compiled graph per shape: raise dynamo's recompile limit above the grid size.
    torch._dynamo.config.cache_size_limit = max(64, 4 * len(kept))
    # Timing the backward alone replays one graph (retain_graph=True), which compiled graphs
    # allow only without donated buffers.
    torch._functorch.config.donated_buffer = False
    spec = SPECS[args.op]()
    if args.impls:
        unknown = set(args.impls) - set(spec["impls"])
        if unknown:
            parser.error(f"--impls: unknown {sorted(unknown)}; choose from {list(spec['impls'])}")
        spec["impls"] = {k: v for k, v in spec["impls"].items() if k in args.impls}
    time_ms = timer(device)
    rows = []
    side_stream = torch.cuda.Stream() if args.cuda_graphs else None
    for m, n in progress(kept, "shapes"):
        with torch.cuda.stream(side_stream):  # no-op for None
            try:
                rows += bench_shape(
                    m, n, dtype, device, spec, time_ms, args.rounds, graphs=args.cuda_graphs
                )
            except torch.OutOfMemoryError:  # fits() is an estimate: keep the shapes measured
                print(f"note: {m}x{n} skipped: out of device memory", file=sys.stderr)
        gc.collect()  # the shape's graphs and tensors, before the next shape allocates
        if device == "cuda":
            torch.cuda.empty_cache()
    # Decode latency is an eager, host-timed measurement: not part of a CUDA-graph run.
    decode = decode_latency(dtype, spec) if device == "cuda" and not args.cuda_graphs else []

    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    title = f"{args.op} {args.dtype} on {name}, torch {torch.__version__}"
    title += ", CUDA-graph replays" if args.cuda_graphs else ""
    title += f", median of {args.rounds} rounds" if args.rounds > 1 else ""
    title += f", {datetime.date.today().isoformat()}"
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(title=title, throughput=rows, decode=decode), f, indent=1)
    if args.plot:
        plot(rows, args.plot, title)
    print(title)
    print(throughput_table(rows))
    if args.rounds > 1:
        print(paired_table(rows))
    if decode:
        print(decode_table(decode))


if __name__ == "__main__":
    main()
