"""RMSNorm throughput against PyTorch's own paths, as GB/s and as a fraction of a same-run copy.

RMSNorm is memory-bound, so the ceiling is moving its bytes at copy speed:
fwd reads x and writes y (2·M·N elements), bwd reads x and dy and writes dx (3·M·N), fwd+bwd 5·M·N
(the weight, rstd and dw are negligible). Every implementation is checked against the reference
before it is timed; a wrong one is reported as WRONG, not timed.

    python benchmarks/bench_rms_norm.py                       # CUDA if available, default grid
    python benchmarks/bench_rms_norm.py --device cpu --quick --plot bench.png
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import {{ cookiecutter.package_name }}
from {{ cookiecutter.package_name }} import reference

DEFAULT_GRID = [(m, n) for m in (4096, 8192, 32768, 65536) for n in (1024, 2048, 4096, 8192, 16384)]
QUICK_GRID = [(256, 1024), (1024, 4096)]
DECODE_ROWS = (1, 8, 64, 256)
DECODE_N = 4096
MODES = {"fwd": 2, "bwd": 3, "fwd+bwd": 5}  # elements moved, in units of M·N
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
EPS = 1e-6


def implementations(only: list[str] | None = None) -> dict:
    """name -> fn(x, weight, eps); optional ones are skipped with a note when not installed."""
    impls = {
        "{{ cookiecutter.package_name }}": {{ cookiecutter.package_name }}.rms_norm,
        "F.rms_norm": lambda x, w, eps: F.rms_norm(x, (x.shape[-1],), w, eps),
        "compile(ref)": torch.compile(reference.rms_norm, dynamic=False),
        "eager ref": reference.rms_norm,
    }
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except ImportError:
        print("note: Liger-Kernel is not installed; its RMSNorm is not measured", file=sys.stderr)
    else:
        # in_place=False: Liger otherwise overwrites dy with dx, and dy is reused across timings.
        impls["liger"] = lambda x, w, eps: LigerRMSNormFunction.apply(
            x, w, eps, 0.0, "llama", False
        )
    if only:
        unknown = set(only) - set(impls)
        if unknown:
            raise SystemExit(f"--impls: unknown {sorted(unknown)}; choose from {list(impls)}")
        impls = {name: fn for name, fn in impls.items() if name in only}
    return impls


def timer(device: str):
    """Returns time_ms(fn): the median time of one call."""
    if device == "cuda":
        try:
            from triton.testing import do_bench
        except ImportError:
            do_bench = None
        if do_bench is not None:
            # Device-event timing; do_bench also flushes L2 between calls.
            return lambda fn: do_bench(fn, warmup=25, rep=100, return_mode="median")
        return _cuda_event_ms
    return _wall_clock_ms


def _cuda_event_ms(fn, reps: int = 50) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _wall_clock_ms(fn, min_seconds: float = 0.2, min_reps: int = 5) -> float:
    fn()
    times: list[float] = []
    while len(times) < min_reps or sum(times) < min_seconds * 1e3:
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def check(fn, x, w, dy) -> str | None:
    """Compares output and gradients with the reference; returns what is wrong, or None."""
    xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
    y_ref = reference.rms_norm(xr, wr, EPS)
    dx_ref, dw_ref = torch.autograd.grad(y_ref, (xr, wr), dy)
    xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
    y = fn(xg, wg, EPS)
    dx, dw = torch.autograd.grad(y, (xg, wg), dy)
    tol = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}[x.dtype]
    for name, got, want in (("y", y, y_ref), ("dx", dx, dx_ref)):
        if not torch.allclose(got.float(), want.float(), atol=tol, rtol=tol):
            return f"{name} differs from the reference"
    # dw sums over all rows: compare relative to its largest entry.
    dw_err = (dw.float() - dw_ref.float()).abs().max().item()
    if dw_err > tol * (1.0 + dw_ref.float().abs().max().item()):
        return "dw differs from the reference"
    return None


def fits(m: int, n: int, dtype: torch.dtype, device: str) -> bool:
    """Whether one shape's tensors (inputs, grads, fp32 temporaries of the eager paths) fit."""
    if device != "cuda":
        return True
    need = m * n * (dtype.itemsize * 10 + 4 * 8)
    free, _total = torch.cuda.mem_get_info()
    return need < 0.8 * free


def bench_shape(m, n, dtype, device, impls, time_ms) -> list[dict]:
    x = torch.randn(m, n, dtype=dtype, device=device)
    w = 1 + 0.1 * torch.randn(n, dtype=dtype, device=device)
    dy = torch.randn(m, n, dtype=dtype, device=device)
    copy_dst = torch.empty_like(x)
    element_bytes = m * n * dtype.itemsize
    copy_gbps = 2 * element_bytes / time_ms(lambda: copy_dst.copy_(x)) / 1e6
    rows = [
        dict(M=m, N=n, impl="copy", mode="copy", ms=2 * element_bytes / copy_gbps / 1e6,
             gbps=copy_gbps, frac=1.0, status="ok")
    ]  # fmt: skip
    for name, fn in impls.items():
        problem = check(fn, x, w, dy)
        xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
        y = fn(xg, wg, EPS)
        runs = {
            "fwd": lambda fn=fn: fn(x, w, EPS),
            "bwd": lambda y=y, xg=xg, wg=wg: torch.autograd.grad(
                y, (xg, wg), dy, retain_graph=True
            ),
            "fwd+bwd": lambda fn=fn, xg=xg, wg=wg: torch.autograd.grad(
                fn(xg, wg, EPS), (xg, wg), dy
            ),
        }
        for mode, units in MODES.items():
            row = dict(M=m, N=n, impl=name, mode=mode, ms=None, gbps=None, frac=None)
            if problem:
                row["status"] = f"WRONG: {problem}"
            else:
                ms = time_ms(runs[mode])
                gbps = units * element_bytes / ms / 1e6
                row.update(ms=ms, gbps=gbps, frac=gbps / copy_gbps, status="ok")
            rows.append(row)
        del y, xg, wg
    return rows


def decode_latency(dtype, impls) -> list[dict]:
    """Per-call forward latency at decode sizes, host clock around a synchronized call, so that
    launch and dispatch overhead shows."""
    rows = []
    for m in DECODE_ROWS:
        x = torch.randn(m, DECODE_N, dtype=dtype, device="cuda")
        w = torch.randn(DECODE_N, dtype=dtype, device="cuda")
        for name, fn in impls.items():
            for _ in range(10):
                fn(x, w, EPS)
            times = []
            for _ in range(200):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                fn(x, w, EPS)
                torch.cuda.synchronize()
                times.append((time.perf_counter() - t0) * 1e6)
            rows.append(dict(M=m, N=DECODE_N, impl=name, us=statistics.median(times)))
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


def decode_table(rows) -> str:
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    lines = [f"decode-size forward latency, us per call (host clock), N = {DECODE_N}"]
    lines.append(f"{'M':>5}  " + "  ".join(f"{i:>14}" for i in impls))
    for m in DECODE_ROWS:
        at = {r["impl"]: r["us"] for r in rows if r["M"] == m}
        lines.append(f"{m:>5}  " + "  ".join(f"{at[i]:>14.1f}" for i in impls))
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
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None)
    parser.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    parser.add_argument("--shapes", type=parse_shapes, help="MxN[,MxN...], e.g. 32768x4096")
    parser.add_argument("--quick", action="store_true", help="a few small shapes")
    parser.add_argument("--impls", type=lambda t: t.split(","), help="a subset, comma-separated")
    parser.add_argument("--plot", metavar="PATH.png", help="plot fraction of copy bandwidth")
    parser.add_argument("--json", metavar="PATH", help="write every row as JSON")
    args = parser.parse_args(argv)

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but CUDA is not available")
    dtype = DTYPES[args.dtype]
    grid = args.shapes or (QUICK_GRID if args.quick else DEFAULT_GRID)
    kept = [s for s in grid if fits(*s, dtype, device)]
    for m, n in sorted(set(grid) - set(kept)):
        print(f"note: {m}x{n} skipped: not enough free device memory", file=sys.stderr)

    torch.manual_seed(0)
    # One compiled graph per shape: raise dynamo's recompile limit above the grid size.
    torch._dynamo.config.cache_size_limit = max(64, 4 * len(kept))
    # Timing the backward alone replays one graph (retain_graph=True), which compiled graphs
    # allow only without donated buffers.
    torch._functorch.config.donated_buffer = False
    impls = implementations(args.impls)
    time_ms = timer(device)
    rows = []
    for m, n in progress(kept, "shapes"):
        rows += bench_shape(m, n, dtype, device, impls, time_ms)
        if device == "cuda":
            torch.cuda.empty_cache()
    decode = decode_latency(dtype, impls) if device == "cuda" else []

    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    title = f"RMSNorm {args.dtype} on {name}, torch {torch.__version__}"
    title += f", {datetime.date.today().isoformat()}"
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(title=title, throughput=rows, decode=decode), f, indent=1)
    if args.plot:
        plot(rows, args.plot, title)
    print(title)
    print(throughput_table(rows))
    if decode:
        print(decode_table(decode))


if __name__ == "__main__":
    main()
