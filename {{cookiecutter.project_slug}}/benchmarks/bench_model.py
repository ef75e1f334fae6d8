"""A training step of a Llama-style decoder with three choices of norm: torch.nn.RMSNorm, this
package's RMSNorm, and blocks that fuse each residual add into the next norm (fused_add_rms_norm).

    python benchmarks/bench_model.py                  # hidden 1024 x 8 layers, 4096 x 2; bf16
    python benchmarks/bench_model.py --quick          # a smoke test (on CPU: float32, tiny)

A step is forward, backward and AdamW's update on batch x seq random tokens, eager and under
torch.compile; the time is the median of the timed steps (wall clock after a device sync), as ms
and tokens/s. The norms move a small share of a step's bytes: the table shows what swapping them
buys in a whole model, not what the kernels buy alone (bench_rms_norm.py measures that)."""

import argparse
import importlib.util
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from {{ cookiecutter.package_name }} import RMSNorm, fused_add_rms_norm, rms_norm

NORMS = ["torch.nn.RMSNorm", "RMSNorm", "fused_add_rms_norm"]
SIZES = [(1024, 8), (4096, 2)]  # (hidden, layers)
EPS = 1e-6


class Block(nn.Module):
    """Pre-norm attention (scaled_dot_product_attention, causal) and SwiGLU MLP. With ``fused``,
    the block takes and returns the residual stream apart from the last sublayer's output, and
    each residual add happens inside fused_add_rms_norm, as in vLLM's and HF's fused models."""

    def __init__(self, hidden: int, heads: int, norm: type, fused: bool):
        super().__init__()
        self.heads, self.fused = heads, fused
        self.attn_norm, self.mlp_norm = norm(hidden, eps=EPS), norm(hidden, eps=EPS)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.out = nn.Linear(hidden, hidden, bias=False)
        self.gate_up = nn.Linear(hidden, 2 * 4 * hidden, bias=False)
        self.down = nn.Linear(4 * hidden, hidden, bias=False)

    def attention(self, h):
        b, t, d = h.shape
        q, k, v = self.qkv(h).view(b, t, 3, self.heads, d // self.heads).transpose(1, 3).unbind(2)
        return self.out(
            F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        )

    def mlp(self, h):
        gate, up = self.gate_up(h).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)

    def forward(self, x, residual=None):
        if not self.fused:
            x = x + self.attention(self.attn_norm(x))
            return x + self.mlp(self.mlp_norm(x))
        # x is the last sublayer's output; residual the stream before it (None: x is the stream).
        if residual is None:
            h, residual = rms_norm(x, self.attn_norm.weight, EPS), x
        else:
            h, residual = fused_add_rms_norm(x, residual, self.attn_norm.weight, EPS)
        h, residual = fused_add_rms_norm(self.attention(h), residual, self.mlp_norm.weight, EPS)
        return self.mlp(h), residual


class Decoder(nn.Module):
    def __init__(self, vocab: int, hidden: int, layers: int, norm_choice: str):
        super().__init__()
        norm = torch.nn.RMSNorm if norm_choice == "torch.nn.RMSNorm" else RMSNorm
        self.fused = norm_choice == "fused_add_rms_norm"
        self.embed = nn.Embedding(vocab, hidden)
        heads = max(hidden // 128, 1)
        self.blocks = nn.ModuleList(Block(hidden, heads, norm, self.fused) for _ in range(layers))
        self.norm = norm(hidden, eps=EPS)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens):
        x, residual = self.embed(tokens), None
        for block in self.blocks:
            x, residual = block(x, residual) if self.fused else (block(x), None)
        if self.fused:  # the last residual add, fused into the final norm
            return self.head(fused_add_rms_norm(x, residual, self.norm.weight, EPS)[0])
        return self.head(self.norm(x))


def time_steps(model, tokens, compiled: bool, steps: int, device: str, backend: str) -> list[float]:
    """The first step's loss, and the seconds of each timed training step after warm-up steps
    (compilation among them)."""
    forward = torch.compile(model, fullgraph=True, backend=backend) if compiled else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    sync = torch.get_device_module(device).synchronize
    times, losses = [], []
    for i in range(3 + steps):
        sync()
        start = time.perf_counter()
        logits = forward(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        losses.append(loss.item())
        if i >= 3:
            times.append(time.perf_counter() - start)
    return losses[0], times


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--device", choices=["cuda", "cpu"], help="default: cuda if available")
    add("--batch", type=int, default=8)
    add("--seq", type=int, default=1024, help="tokens per sequence")
    add("--vocab", type=int, default=32000)
    add("--steps", type=int, default=10, help="timed steps per cell, reported: their median")
    add("--quick", action="store_true", help="hidden 64 x 2 layers, batch 2 x 32 tokens")
    add("--json", metavar="PATH", help="write every row as JSON")
    add("--plot", metavar="PATH.png", help="plot each norm's time relative to torch.nn.RMSNorm's")
    args = parser.parse_args(argv)
    if args.plot and importlib.util.find_spec("matplotlib") is None:  # before the timing
        parser.error("--plot needs matplotlib: pip install matplotlib")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    sizes, batch, seq, vocab = SIZES, args.batch, args.seq, args.vocab
    if args.quick:
        sizes, batch, seq, vocab, args.steps = [(64, 2)], 2, 32, 256, 2
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    # Inductor's CPU code generation takes minutes to build; on CPU, trace and run the graph.
    backend = "inductor" if device == "cuda" else "aot_eager"
    rows = []
    for hidden, layers in sizes:
        torch.manual_seed(0)
        tokens = torch.randint(vocab, (batch, seq + 1), device=device)
        for norm in NORMS:
            for compiled in (False, True):
                print(
                    f"{hidden} x {layers}: {norm}, {'compiled' if compiled else 'eager'}",
                    file=sys.stderr,
                )
                torch.compiler.reset()
                torch.manual_seed(0)
                model = Decoder(vocab, hidden, layers, norm).to(device, dtype)
                loss, times = time_steps(model, tokens, compiled, args.steps, device, backend)
                ms = statistics.median(times) * 1e3
                rows.append(
                    dict(
                        hidden=hidden,
                        layers=layers,
                        norm=norm,
                        mode="compile" if compiled else "eager",
                        ms=ms,
                        tokens_per_s=batch * seq / ms * 1e3,
                        times_ms=[t * 1e3 for t in times],
                        first_loss=loss,  # the same model and data: the same loss for each norm
                    )
                )
                del model
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    title = f"training step, {dtype}, batch {batch} x {seq} tokens, on {where}"
    title += f", torch {torch.__version__}"
    print(title)
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"title": title, "rows": rows}, f, indent=1)
    if args.plot:
        plot(rows, args.plot, title)
    return rows


def table(rows) -> str:
    """A line per model size and mode: each norm's ms per step, and its time relative to the
    torch.nn.RMSNorm model's (below 1.00: faster)."""
    width = max(map(len, NORMS))
    lines = [f"{'model':<16} {'mode':<8}" + "".join(f" | {n.rjust(width)}" for n in NORMS)]
    for key in dict.fromkeys((r["hidden"], r["layers"], r["mode"]) for r in rows):
        ms = {r["norm"]: r["ms"] for r in rows if (r["hidden"], r["layers"], r["mode"]) == key}
        cells = [f"{ms[n]:.2f} ms {ms[n] / ms[NORMS[0]]:5.2f}" for n in NORMS]
        model = f"{key[0]} x {key[1]} layers"
        lines.append(f"{model:<16} {key[2]:<8}" + "".join(f" | {c.rjust(width)}" for c in cells))
    return "\n".join(lines)


def plot(rows, path: str, title: str) -> None:
    from matplotlib.figure import Figure  # not pyplot: a file, with no window to show

    keys = list(dict.fromkeys((r["hidden"], r["layers"], r["mode"]) for r in rows))
    fig = Figure(figsize=(max(6, 2 * len(keys)), 4.5), layout="tight")
    ax = fig.subplots()
    for i, norm in enumerate(NORMS):
        ms = {(r["hidden"], r["layers"], r["mode"]): r["ms"] for r in rows if r["norm"] == norm}
        base = {
            (r["hidden"], r["layers"], r["mode"]): r["ms"] for r in rows if r["norm"] == NORMS[0]
        }
        xs = [k + (i - 1) * 0.27 for k in range(len(keys))]
        ax.bar(xs, [ms[k] / base[k] for k in keys], width=0.27, label=norm)
    ax.axhline(1.0, color="gray", linestyle="--", linewidth=1)
    ax.set_xticks(range(len(keys)), [f"{h} x {n}, {m}" for h, n, m in keys])
    ax.set(ylabel="step time / torch.nn.RMSNorm's", title=title)
    ax.legend()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
