"""RMSNorm throughput against F.rms_norm, torch.compile, Liger and a copy of x.

RMSNorm is memory-bound: its ceiling is moving its bytes as fast as x.clone() moves its own, so
each time is also given as a fraction of the copy's bandwidth, measured in the same run.

    python benchmarks/bench_rms_norm.py                          # CUDA if available, full grid
    python benchmarks/bench_rms_norm.py --op fused_add_rms_norm --shapes 32768x4096
    python benchmarks/bench_rms_norm.py --op fused_add_rms_norm_ --cuda-graphs  # in place
    python benchmarks/bench_rms_norm.py --cuda-graphs --also other_ops --json bench.json
    python benchmarks/bench_rms_norm.py --decode                 # per-call time at decode sizes
    python benchmarks/bench_rms_norm.py --device cpu --quick --plot bench.png  # a smoke test

On CUDA a cell is triton.testing.do_bench's median: L2 flushed before each call, which also
hides the host's time to issue the call where the flush takes longer. --cuda-graphs times the
replays of the call captured in a CUDA graph: its kernels alone, with none of the host's work.
--decode times eager calls with a wall clock: at those sizes a call costs what the host takes to
issue it. A cell is measured --runs times, the implementations taking turns, and reports the
median; one whose runs spread by more than 2x is "noisy", with no fraction. Each implementation
is first checked against the reference: a wrong one is reported, not timed.
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib.util
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from {{ cookiecutter.package_name }}.fused_add_rms_norm import fused_add_rms_norm_reference
from {{ cookiecutter.package_name }}.rms_norm import rms_norm_reference

PACKAGE = "{{ cookiecutter.package_name }}"
EPS = 1e-6
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
GRID = [(m, n) for m in (4096, 8192, 32768, 65536) for n in (1024, 2048, 4096, 8192, 16384)]
QUICK = [(256, 1024), (1024, 4096)]
DECODE = [(m, 4096) for m in (1, 8, 32, 256)]
# Per op, its modes and the bytes each must move, in units of M*N elements (weight, rstd and dw
# are O(M) or O(N)). rms_norm: fwd reads x, writes y; the backward reads x and dy, writes dx.
# fused_add_rms_norm (its residual in x's dtype here): fwd reads x and residual, writes y and
# h = x + residual; the backward reads h, dy and dh (the gradient of h), writes dx and dresidual.
# fused_add_rms_norm_ moves what its forward does, writing over x and residual; no backward.
UNITS = {
    "rms_norm": {"fwd": 2, "fwd+bwd": 5},
    "fused_add_rms_norm": {"fwd": 4, "fwd+bwd": 9},
    "fused_add_rms_norm_": {"fwd": 4},
}
REFERENCES = {
    "rms_norm": rms_norm_reference,
    "fused_add_rms_norm": fused_add_rms_norm_reference,
    "fused_add_rms_norm_": fused_add_rms_norm_reference,  # (y, h): what x and residual become
}


def add_then_rms_norm(x, residual, w):
    h = x + residual
    return F.rms_norm(h, h.shape[-1:], w, EPS), h


def in_place(fn):
    """fn(x, residual, w), which writes over x and residual, as a call that returns them."""

    def call(x, residual, w):
        fn(x, residual, w)
        return x, residual

    return call


def reference_in_place(x, residual, w):
    y, h = fused_add_rms_norm_reference(x, residual, w, EPS)
    residual.copy_(h)
    x.copy_(y)


def implementations(op: str, device: str, also: list[str]) -> dict:
    """Name -> fn(x, w) or fn(x, residual, w): the packages' public functions, then the peers."""
    impls = {}
    for name in [PACKAGE, *also]:
        public = getattr(importlib.import_module(name), op)
        impls[name] = lambda *args, public=public: public(*args, EPS)
    if op == "fused_add_rms_norm_":  # beside the out-of-place op; Liger has no in-place form
        out_of_place = importlib.import_module(PACKAGE).fused_add_rms_norm
        impls = {name: in_place(fn) for name, fn in impls.items()}
        impls["out of place"] = lambda *args: out_of_place(*args, EPS)
        if device != "cuda":  # pytorch/pytorch#196570
            print("note: compile(ref) not measured: Inductor's CPU code fails", file=sys.stderr)
        else:
            impls["compile(ref)"] = in_place(torch.compile(reference_in_place, dynamic=False))
        return impls
    if op == "rms_norm":
        impls["F.rms_norm"] = lambda x, w: F.rms_norm(x, x.shape[-1:], w, EPS)
    else:
        impls["F.rms_norm"] = add_then_rms_norm
    reference = REFERENCES[op]
    impls["compile(ref)"] = torch.compile(lambda *args: reference(*args, eps=EPS), dynamic=False)
    if device != "cuda":
        print("note: Liger not measured: its kernels run on CUDA only", file=sys.stderr)
        return impls
    try:
        from liger_kernel.transformers import functional as liger

        fn = getattr(liger, f"liger_{op}")  # liger_rms_norm or liger_fused_add_rms_norm
    except Exception as e:  # not installed, too old, or not importable with this torch or Triton
        print(f"note: Liger not measured ({e!r}); pip install liger-kernel", file=sys.stderr)
        return impls
    # in_place=False: Liger otherwise writes dx over dy, which every timed backward reuses.
    impls["Liger"] = lambda *args: fn(*args, EPS, in_place=False)
    return impls


def make_inputs(op, m, n, dtype, device):
    """(inputs, gradients of the outputs, or None for an op without backward) of one shape."""
    x = torch.randn(m, n, dtype=dtype, device=device)
    w = 1 + 0.1 * torch.randn(n, dtype=dtype, device=device)
    if op == "rms_norm":
        return (x, w), (torch.randn_like(x),)
    grads = (torch.randn_like(x), torch.randn_like(x)) if "fwd+bwd" in UNITS[op] else None
    return (x, torch.randn_like(x), w), grads


def forward(fn, leaves) -> tuple:
    out = fn(*leaves)
    return out if isinstance(out, tuple) else (out,)


def outputs_and_grads(fn, inputs, grads) -> list[torch.Tensor]:
    if grads is None:  # no backward; an in-place op writes over these copies
        return list(forward(fn, [t.clone() for t in inputs]))
    leaves = [t.detach().requires_grad_() for t in inputs]
    outs = forward(fn, leaves)
    return [*outs, *torch.autograd.grad(outs, leaves, grads)]


def check(fn, inputs, grads, want) -> str:
    """Returns "ok", or what differs from the reference's outputs and gradients (want)."""
    try:
        got = outputs_and_grads(fn, inputs, grads)
    except RuntimeError as e:
        return f"failed: {str(e).splitlines()[0]}"
    tol = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}[inputs[0].dtype]
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        atol = tol * (1 + w.float().abs().max().item())  # relative to the largest entry (dw)
        if g.shape != w.shape or not torch.allclose(g.float(), w.float(), rtol=0, atol=atol):
            return f"wrong: output or gradient {i} differs from the reference"
    return "ok"


def mode_calls(fn, inputs, grads) -> dict:
    """The call each mode times."""
    leaves = [t.detach().requires_grad_() for t in inputs]
    return {
        "fwd": lambda: fn(*inputs),
        "fwd+bwd": lambda: torch.autograd.grad(forward(fn, leaves), leaves, grads),
    }


def wall_clock_ms(fn, sync, min_ms: float = 50.0) -> float:
    """Mean time of back-to-back calls, from a synchronized start to a synchronized end."""
    fn()
    sync()
    calls, start = 0, time.perf_counter()
    while calls == 0 or time.perf_counter() - start < min_ms / 1e3:
        fn()
        calls += 1
    sync()
    return (time.perf_counter() - start) * 1e3 / calls


def graph_ms(fn, time_ms) -> float:
    """time_ms of the replays of one call captured in a CUDA graph: its kernels alone."""
    stream = torch.cuda.Stream()  # not the default stream, which capture cannot use
    with torch.cuda.stream(stream):
        for _ in range(3):  # compilation, autotuning and allocator growth come before capture
            fn()
        graph = torch.cuda.CUDAGraph()
        gc.disable()  # a Triton kernel that gc finalizes during capture would unload its module
        try:
            with torch.cuda.graph(graph, stream=stream):
                fn()
        finally:
            gc.enable()
    torch.cuda.synchronize()
    return time_ms(graph.replay)  # fn, alive until then, holds the tensors the graph reads


def timers(device: str, cuda_graphs: bool, decode: bool) -> tuple:
    """time_ms(fn) for the implementations, and for the copy."""
    if device != "cuda" or decode:
        sync = torch.cuda.synchronize if device == "cuda" else lambda: None
        return (functools.partial(wall_clock_ms, sync=sync),) * 2
    import triton.testing  # here, not at the top: CPU-only installs may lack Triton

    eager = functools.partial(triton.testing.do_bench, return_mode="median")
    # The copy stays eager: captured, a clone becomes a memcpy node, slower than the copy kernel
    # that the eager call launches.
    return functools.partial(graph_ms, time_ms=eager) if cuda_graphs else eager, eager


def bench_shape(op, shape, dtype, device, impls, modes, timer, runs) -> list[dict]:
    """A row per implementation and mode of one shape, and one for the copy: the median of
    `runs` measurements, taken in turns (each run starts with another implementation)."""
    (m, n), (time_ms, time_copy) = shape, timer
    base, grads = make_inputs(op, m, n, dtype, device)
    want = outputs_and_grads(REFERENCES[op], base, grads)
    order, times, status = ["copy", *impls], {}, {}
    for run in range(runs):
        for name in order[run % len(order) :] + order[: run % len(order)]:
            # Its own copy of the inputs: lines of x another implementation left in L2 (a flush
            # may not evict lines loaded as evict-last) must not speed this one up.
            inputs = [t.clone() for t in base]
            if name == "copy":
                times.setdefault(("copy", "copy"), []).append(time_copy(inputs[0].clone))
                continue
            if run == 0 and (result := check(impls[name], inputs, grads, want)) != "ok":
                status.update({(name, mode): result for mode in modes})
            for mode, call in mode_calls(impls[name], inputs, grads).items():
                if mode in modes and (name, mode) not in status:
                    try:
                        times.setdefault((name, mode), []).append(time_ms(call))
                    except RuntimeError as e:  # e.g. a call that a CUDA graph cannot capture
                        status[name, mode] = f"failed: {str(e).splitlines()[0]}"
    rows, unit_bytes, copy_gbps = [], m * n * base[0].element_size(), None
    for name, mode in [("copy", "copy"), *((name, mode) for name in impls for mode in modes)]:
        row = dict(impl=name, M=m, N=n, mode=mode, ms=None, gbps=None, fraction_of_copy=None)
        row.update(status=status.get((name, mode), "ok"), times_ms=times.get((name, mode), []))
        if row["status"] == "ok":
            ts = row["times_ms"]
            row["ms"] = statistics.median(ts)
            row["gbps"] = UNITS[op].get(mode, 2) * unit_bytes / row["ms"] / 1e6
            row["status"] = "noisy" if max(ts) > 2 * min(ts) else "ok"
            if name == "copy" and row["status"] == "ok":
                copy_gbps = row["gbps"]
            if row["status"] == "ok" and copy_gbps:
                row["fraction_of_copy"] = row["gbps"] / copy_gbps
        rows.append(row)
    return rows


def table(rows, modes, unit: str) -> str:
    """A line per shape and mode; per implementation its time and fraction of copy bandwidth.
    Then a line per cell that failed, with why."""
    scale, digits = (1e3, 1) if unit == "us" else (1.0, 4)
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    width = max(15, *map(len, impls))
    lines = [f"{'M x N':>12} {'mode':<8}" + "".join(f" | {i.rjust(width)}" for i in impls)]
    lines.append(" " * 21 + f" | {(unit + '  /copy').rjust(width)}" * len(impls))
    for m, n in dict.fromkeys((r["M"], r["N"]) for r in rows):
        at = {(r["impl"], r["mode"]): r for r in rows if (r["M"], r["N"]) == (m, n)}
        for mode in modes:
            cells = []
            for r in (at.get((impl, mode)) or at[impl, "copy"] for impl in impls):
                if r["ms"] is None:
                    cells.append(r["status"][:width].rjust(width))
                    continue
                frac = "noisy" if r["fraction_of_copy"] is None else f"{r['fraction_of_copy']:.2f}"
                cells.append(f"{r['ms'] * scale:>{width - 7}.{digits}f} {frac:>6}")
            lines.append(f"{f'{m}x{n}':>12} {mode:<8}" + "".join(f" | {c}" for c in cells))
    failed = dict.fromkeys((r["impl"], r["mode"], r["status"]) for r in rows if r["ms"] is None)
    return "\n".join(lines + [f"{impl} {mode}: {status}" for impl, mode, status in failed])


def plot(rows, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys((r["M"], r["N"]) for r in rows))
    impls = list(dict.fromkeys(r["impl"] for r in rows if r["impl"] != "copy"))
    modes = list(dict.fromkeys(r["mode"] for r in rows if r["impl"] != "copy"))
    size = (max(5 * len(modes), 0.9 * len(shapes)), 4.5)
    fig, axes = plt.subplots(1, len(modes), figsize=size, sharey=True, squeeze=False)
    for ax, mode in zip(axes[0], modes, strict=True):
        for impl in impls:
            at = {(r["M"], r["N"]): r for r in rows if (r["impl"], r["mode"]) == (impl, mode)}
            ys = [at[s]["fraction_of_copy"] or float("nan") for s in shapes]
            ax.plot(range(len(shapes)), ys, marker="o", label=impl)
        ax.axhline(1.0, color="gray", linestyle="--", linewidth=1)
        ax.set(title=mode, xlabel="M x N")
        ax.set_xticks(range(len(shapes)), [f"{m}x{n}" for m, n in shapes], rotation=60)
    axes[0][0].set(ylabel="fraction of copy bandwidth", ylim=(0, None))
    axes[0][0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_shapes(text: str) -> list[tuple[int, int]]:
    return [(int(m), int(n)) for m, n in (shape.split("x") for shape in text.split(","))]


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add, names = parser.add_argument, lambda text: text.split(",")
    add("--op", choices=list(UNITS), default="rms_norm")
    add("--device", choices=["cuda", "cpu"], help="default: cuda if available")
    add("--dtype", choices=list(DTYPES), default="bf16")
    add("--shapes", type=parse_shapes, help="MxN[,MxN...], e.g. 32768x4096")
    add("--quick", action="store_true", help=f"the shapes {QUICK}")
    add("--decode", action="store_true", help=f"eager per-call time at the shapes {DECODE}")
    add("--cuda-graphs", action="store_true", help="time the kernels alone")
    add("--runs", type=int, default=3, help="measurements per cell, reported: their median")
    add("--impls", type=names, help="a subset of the implementations, comma-separated")
    add("--also", type=names, default=[], help="PKG[,PKG]: other packages with the same API")
    add("--plot", metavar="PATH.png", help="plot the fractions of copy bandwidth")
    add("--json", metavar="PATH", help="write every row as JSON")
    args = parser.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but CUDA is not available")
    if args.cuda_graphs and (device != "cuda" or args.decode):
        parser.error("--cuda-graphs needs CUDA, and does not apply to --decode")
    if args.runs < 1:
        parser.error("--runs wants at least 1")
    if args.plot and importlib.util.find_spec("matplotlib") is None:  # before the timing
        parser.error('--plot needs matplotlib (pip install matplotlib, or the ".[bench]" extra)')
    impls = implementations(args.op, device, args.also)
    if args.impls:
        if unknown := set(args.impls) - {*impls, "Liger"}:
            parser.error(f"--impls: unknown {sorted(unknown)}; choose from {list(impls)}")
        impls = {name: fn for name, fn in impls.items() if name in args.impls}
    shapes = DECODE if args.decode else args.shapes or (QUICK if args.quick else GRID)
    modes = tuple(UNITS[args.op])
    timer, dtype = timers(device, args.cuda_graphs, args.decode), DTYPES[args.dtype]
    torch.manual_seed(0)
    rows = []
    for i, shape in enumerate(shapes):
        print(f"{shape[0]}x{shape[1]} ({i + 1}/{len(shapes)})", file=sys.stderr, flush=True)
        torch.compiler.reset()  # compile(ref): a graph per shape, so none hits the recompile limit
        try:
            rows += bench_shape(args.op, shape, dtype, device, impls, modes, timer, args.runs)
        except torch.OutOfMemoryError:
            print(f"note: {shape} skipped: out of device memory", file=sys.stderr)

    where = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    how = "eager per call" if args.decode else "CUDA graphs" if args.cuda_graphs else "eager"
    title = f"{args.op} {args.dtype} on {where}, torch {torch.__version__}, {how}, {args.runs} runs"
    print(title)
    if device == "cpu":
        print("CPU timings are for smoke-testing the benchmark, not for comparing kernels.")
    print(table(rows, modes, "us" if args.decode else "ms"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"title": title, "rows": rows}, f, indent=1)
    if args.plot:
        plot(rows, args.plot, title)
    return rows


if __name__ == "__main__":
    main()
