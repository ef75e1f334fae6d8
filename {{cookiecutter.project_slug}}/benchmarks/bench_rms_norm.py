"""RMSNorm throughput against F.rms_norm, torch.compile, Liger and a copy of x.

    python benchmarks/bench_rms_norm.py --op fused_add_rms_norm --cuda-graphs --also other_ops
    python benchmarks/bench_rms_norm.py --device cpu --quick --plot bench.png  # a smoke test

RMSNorm is memory-bound, so each time is also given as a fraction of x.clone()'s bandwidth in the
same run. On CUDA a time is triton.testing.do_bench's median (L2 flushed before each call) of the
call, or of its replays from a CUDA graph; --decode takes a wall clock: at its sizes a call costs
what the host takes to issue it. Each implementation is first checked against the reference."""

import argparse
import gc
import importlib.util
import json
import statistics
import sys
import time
from functools import partial

import torch

from {{ cookiecutter.package_name }}.fused_add_rms_norm import fused_add_rms_norm_reference
from {{ cookiecutter.package_name }}.rms_norm import rms_norm_reference

PACKAGE, EPS = "{{ cookiecutter.package_name }}", 1e-6
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
GRID = [(m, n) for m in (4096, 8192, 32768, 65536) for n in (1024, 2048, 4096, 8192, 16384)]
QUICK = [(256, 1024), (1024, 4096)]
DECODE = [(m, 4096) for m in (1, 8, 32, 256)]
# Per op: its reference, and per mode the bytes it must move in units of M*N elements (weight,
# rstd and dw are O(M) or O(N)): fwd reads x (and residual), writes y (and h = x + residual); bwd
# reads x or h, dy (and h's gradient), writes dx or dh, the gradient of both x and residual.
OPS = {
    "rms_norm": (rms_norm_reference, {"fwd": 2, "fwd+bwd": 5}),
    "fused_add_rms_norm": (fused_add_rms_norm_reference, {"fwd": 4, "fwd+bwd": 8}),
    "fused_add_rms_norm_": (fused_add_rms_norm_reference, {"fwd": 4}),  # y over x, h over residual
}


def torch_rms_norm(x, w, eps):
    return torch.nn.functional.rms_norm(x, x.shape[-1:], w, eps)


def torch_add_rms_norm(x, residual, w, eps):
    h = x + residual
    return torch_rms_norm(h, w, eps), h


def reference_in_place(x, residual, w, eps):
    y, h = fused_add_rms_norm_reference(x, residual, w, eps)
    residual.copy_(h)
    x.copy_(y)


def implementations(op: str, device: str, also: list[str]) -> dict:
    """Name -> fn(x, w, eps) or fn(x, residual, w, eps): the packages' ops, then the peers."""
    impls = {name: getattr(importlib.import_module(name), op) for name in [PACKAGE, *also]}
    if op == "fused_add_rms_norm_":  # beside the out-of-place op; Liger has no in-place form
        impls["out of place"] = importlib.import_module(PACKAGE).fused_add_rms_norm
        if device == "cuda":
            impls["compile(ref)"] = torch.compile(reference_in_place, dynamic=False)
        else:  # pytorch/pytorch#196570
            print("note: compile(ref) not measured: Inductor's CPU code fails", file=sys.stderr)
        return impls
    impls["F.rms_norm"] = torch_rms_norm if op == "rms_norm" else torch_add_rms_norm
    impls["compile(ref)"] = torch.compile(OPS[op][0], dynamic=False)
    if device != "cuda":
        print("note: Liger not measured: its kernels run on CUDA only", file=sys.stderr)
        return impls
    try:  # in_place=False: Liger otherwise writes dx over dy, which every timed backward reuses
        liger = importlib.import_module("liger_kernel.transformers.functional")
        impls["Liger"] = partial(getattr(liger, f"liger_{op}"), in_place=False)
    except Exception as e:  # not installed, too old, or not importable with this torch or Triton
        print(f"note: Liger not measured ({e!r}); pip install liger-kernel", file=sys.stderr)
    return impls


def run(fn, inputs, grads=None) -> list[torch.Tensor]:
    """fn(*inputs, EPS)'s outputs; given the gradients of the outputs, then those of the inputs."""
    out = fn(*inputs, EPS)  # None from an in-place op: its outputs are x and residual, written over
    outs = [out] if isinstance(out, torch.Tensor) else list(inputs[:2] if out is None else out)
    return [*outs, *torch.autograd.grad(outs, inputs, grads)] if grads else outs


def check(fn, inputs, grads, want) -> None:
    copies = [t.clone().requires_grad_(grads is not None) for t in inputs]  # fn may write over
    tol = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}[inputs[0].dtype]
    for i, (g, w) in enumerate(zip(run(fn, copies, grads), want, strict=True)):
        atol = tol * (1 + w.float().abs().max().item())  # relative to the largest entry (dw)
        if g.shape != w.shape or not torch.allclose(g.float(), w.float(), rtol=0, atol=atol):
            raise ValueError(f"output or gradient {i} differs from the reference")


def wall_clock_ms(fn, sync, min_ms: float = 50.0) -> float:
    fn()
    sync()
    calls, start = 0, time.perf_counter()
    while calls == 0 or time.perf_counter() - start < min_ms / 1e3:
        fn()
        calls += 1
    sync()
    return (time.perf_counter() - start) * 1e3 / calls


def graph_ms(fn, time_ms) -> float:
    stream, graph = torch.cuda.Stream(), torch.cuda.CUDAGraph()  # capture needs a side stream
    with torch.cuda.stream(stream):
        for _ in range(3):  # compilation, autotuning and allocator growth come before capture
            fn()
        gc.disable()  # a Triton kernel that gc finalizes during capture would unload its module
        try:
            with torch.cuda.graph(graph, stream=stream):
                fn()
        finally:
            gc.enable()
    torch.cuda.synchronize()
    return time_ms(graph.replay)  # fn, alive until then, holds the tensors the graph reads


def bench_shape(args, shape, impls, time_ms, time_copy) -> list[dict]:
    """A row for the copy of x, then one per implementation and mode, of one shape."""
    (m, n), (reference, units) = shape, OPS[args.op]
    x = torch.randn(m, n, dtype=DTYPES[args.dtype], device=args.device)
    w = 1 + 0.1 * torch.randn(n, dtype=x.dtype, device=x.device)
    base = (x, w) if args.op == "rms_norm" else (x, torch.randn_like(x), w)
    grads = [torch.randn_like(x) for _ in base[1:]] if "fwd+bwd" in units else None  # y (, h)
    want = run(reference, [t.clone().requires_grad_(grads is not None) for t in base], grads)
    cells, timers = {("copy", "copy"): []}, {("copy", "copy"): partial(time_copy, x.clone)}
    for name, fn in impls.items():
        inputs = [t.clone() for t in base]  # its own: an in-place op writes over its inputs
        leaves = [t.detach().requires_grad_() for t in inputs]
        calls = {"fwd": partial(fn, *inputs, EPS), "fwd+bwd": partial(run, fn, leaves, grads)}
        try:
            check(fn, inputs, grads, want)
        except (RuntimeError, ValueError) as e:  # also a wrong result
            cells.update({(name, mode): failed(e) for mode in units})
            continue
        for mode in units:
            cells[name, mode], timers[name, mode] = [], partial(time_ms, calls[mode])
    # Round after round over every cell, not a cell's runs in a row: a drift of the machine (its
    # clocks, other load) then falls on every implementation alike.
    for _ in range(args.runs):
        for key, timer in list(timers.items()):
            try:
                cells[key].append(timer())
            except RuntimeError as e:  # e.g. a CUDA-graph capture that fails
                cells[key] = failed(e)
                del timers[key]
    rows, nbytes = [], x.numel() * x.element_size()
    for (name, mode), times in cells.items():
        row = dict(impl=name, M=m, N=n, mode=mode, status="ok", ms=None, gbps=None)
        if isinstance(times, str):  # why the cell was not timed
            rows.append(row | dict(status=times, fraction_of_copy=None, times_ms=[]))
            continue
        ms = statistics.median(times)
        gbps = units.get(mode, 2) * nbytes / ms / 1e6  # the copy reads and writes x: 2
        fraction = gbps / rows[0]["gbps"] if rows else 1.0  # the first row is the copy's
        rows.append(row | dict(ms=ms, gbps=gbps, fraction_of_copy=fraction, times_ms=times))
    return rows


def failed(error: Exception) -> str:
    return f"failed: {str(error).splitlines()[0]}"


def table(rows, modes, unit: str) -> str:
    """A line per shape and mode: each implementation's time and fraction of copy; then failures."""
    scale, digits = (1e3, 1) if unit == "us" else (1.0, 4)
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    width = max(15, *map(len, impls))
    lines = {f"{'M x N':>12} {'mode':<8}": impls, " " * 21: [f"{unit}  /copy"] * len(impls)}
    for r in rows:  # a cell on the line of its shape and mode; the copy's, on each mode's line
        ms, frac = r["ms"], r["fraction_of_copy"]
        cell = r["status"][:width] if ms is None else f"{ms * scale:.{digits}f} {frac:6.2f}"
        for mode in modes if r["impl"] == "copy" else [r["mode"]]:
            lines.setdefault(f"{r['M']}x{r['N']}".rjust(12) + f" {mode:<8}", []).append(cell)
    text = [head + "".join(f" | {c.rjust(width)}" for c in cells) for head, cells in lines.items()]
    failed = [f"{r['impl']} {r['mode']}: {r['status']}" for r in rows if r["ms"] is None]
    return "\n".join([*text, *dict.fromkeys(failed)])


def plot(rows, modes, path: str, title: str) -> None:
    from matplotlib.figure import Figure  # not pyplot: a file, with no window to show

    shapes = list(dict.fromkeys((r["M"], r["N"]) for r in rows))
    fig = Figure(figsize=(max(5 * len(modes), 0.9 * len(shapes)), 4.5), layout="tight")
    for ax, mode in zip(fig.subplots(1, len(modes), squeeze=False)[0], modes, strict=True):
        for impl in dict.fromkeys(r["impl"] for r in rows if r["mode"] == mode):
            ys = [r["fraction_of_copy"] for r in rows if (r["impl"], r["mode"]) == (impl, mode)]
            ax.plot(range(len(shapes)), [y or float("nan") for y in ys], marker="o", label=impl)
        ax.axhline(1.0, color="gray", linestyle="--", linewidth=1)  # the copy's bandwidth
        ax.set(title=mode, xlabel="M x N", ylabel="fraction of copy bandwidth", ylim=(0, None))
        ax.set_xticks(range(len(shapes)), [f"{m}x{n}" for m, n in shapes], rotation=60)
        ax.legend()
    fig.suptitle(title)
    fig.savefig(path, dpi=120)


def parse_shapes(text: str) -> list[tuple[int, int]]:
    return [(int(m), int(n)) for m, n in (shape.split("x") for shape in text.split(","))]


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add, names = parser.add_argument, lambda text: text.split(",")
    add("--op", choices=list(OPS), default="rms_norm")
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
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.cuda_graphs and (args.device != "cuda" or args.decode):
        parser.error("--cuda-graphs needs CUDA, and does not apply to --decode")
    if args.runs < 1:
        parser.error("--runs wants at least 1")
    if args.plot and importlib.util.find_spec("matplotlib") is None:  # before the timing
        parser.error("--plot needs matplotlib: pip install matplotlib")
    impls = implementations(args.op, args.device, args.also)
    if unknown := set(args.impls or []) - {*impls, "Liger"}:
        parser.error(f"--impls: unknown {sorted(unknown)}; choose from {list(impls)}")
    impls = {name: fn for name, fn in impls.items() if name in (args.impls or impls)}
    if args.device == "cuda" and not args.decode:  # Triton here: CPU-only installs may lack it
        do_bench = importlib.import_module("triton.testing").do_bench
        time_copy = partial(do_bench, return_mode="median")
    else:
        time_copy = partial(wall_clock_ms, sync=torch.get_device_module(args.device).synchronize)
    # The copy stays eager: captured, a clone becomes a memcpy node, slower than its eager kernel.
    time_ms = partial(graph_ms, time_ms=time_copy) if args.cuda_graphs else time_copy
    shapes = DECODE if args.decode else args.shapes or (QUICK if args.quick else GRID)
    rows = []
    torch.manual_seed(0)
    for i, shape in enumerate(shapes, 1):
        print(f"{shape[0]}x{shape[1]} ({i}/{len(shapes)})", file=sys.stderr, flush=True)
        torch.compiler.reset()  # compile(ref): a graph per shape, so none hits the recompile limit
        try:
            rows += bench_shape(args, shape, impls, time_ms, time_copy)
        except torch.OutOfMemoryError:
            print(f"note: {shape} skipped: out of device memory", file=sys.stderr)
    where = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    how = "eager per call" if args.decode else "CUDA graphs" if args.cuda_graphs else "eager"
    title = f"{args.op} {args.dtype} on {where}, torch {torch.__version__}, {how}, {args.runs} runs"
    print(title)
    if args.device == "cpu":
        print("CPU timings are for smoke-testing the benchmark, not for comparing kernels.")
    print(table(rows, OPS[args.op][1], "us" if args.decode else "ms"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"title": title, "rows": rows}, f, indent=1)
    if args.plot:
        plot(rows, OPS[args.op][1], args.plot, title)
    return rows


if __name__ == "__main__":
    main()
