"""The ops in distributed training, against a single-process run: DTensors whose rows are sharded
(the rules of sharding.py), tensor and sequence parallelism with parallelize_module, FSDP2
(fully_shard), and torch.compile over DTensor programs.

Each test starts its processes itself, on this machine: two on the CPU (gloo), or with GPUs a
process per GPU, up to two (NCCL; a single GPU runs the same checks in one process). A process
costs seconds to start, so each test runs a batch of checks in one launch."""

import datetime
import socket
import time

import pytest
import torch

pytest.importorskip("torch.distributed.tensor", reason="this torch has no torch.distributed")

import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from {{ cookiecutter.package_name }} import (
    RMSNorm,
    fused_add_rms_norm,
    fused_add_rms_norm_,
    rms_norm,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
WORLD_SIZE = min(torch.cuda.device_count(), 2) if DEVICE == "cuda" else 2
TIMEOUT_S = 240  # a launch, start-up included: a hung collective fails the test, not the suite
# After a few steps of training: the sharded linear layers add their products in another order.
TRAINED = dict(rtol=1e-4, atol=1e-5)
# Rows that two ranks split unevenly on either leading dimension (5 = 3 + 2, 7 = 4 + 3).
SHAPE = (5, 7, 48)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _process(rank: int, check, port: int) -> None:
    if DEVICE == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl" if DEVICE == "cuda" else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD_SIZE,
        timeout=datetime.timedelta(seconds=TIMEOUT_S),
    )
    try:
        check(init_device_mesh(DEVICE, (WORLD_SIZE,)))
    finally:
        dist.destroy_process_group()


def run_distributed(check) -> None:
    """check(mesh) in WORLD_SIZE processes, each in a process group on this machine's loopback;
    a rank's error fails the test with its traceback, and so does running past TIMEOUT_S."""
    processes = mp.spawn(_process, args=(check, _free_port()), nprocs=WORLD_SIZE, join=False)
    deadline = time.monotonic() + TIMEOUT_S
    try:
        # join() raises a failed rank's error, after ending the other ranks.
        while not processes.join(timeout=max(deadline - time.monotonic(), 0), grace_period=5):
            if time.monotonic() >= deadline:
                pytest.fail(f"{check.__name__} did not finish in {TIMEOUT_S} s")
    finally:
        for process in processes.processes:
            if process.is_alive():
                process.kill()
            process.join()


def assert_close(dtensor, expected, what, **tolerances):
    # full_tensor() is a collective: every rank calls it, before any rank asserts.
    got = dtensor.full_tensor()
    torch.testing.assert_close(got, expected, msg=lambda m: f"{what}: {m}", **tolerances)


def _inputs(weight: bool):
    # The same on every rank (the seed), on this rank's device.
    torch.manual_seed(0)
    x, r = torch.randn(SHAPE, device=DEVICE), torch.randn(SHAPE, device=DEVICE)
    w = torch.randn(SHAPE[-1], device=DEVICE) if weight else None
    return x, r, w, torch.randn(SHAPE, device=DEVICE), torch.randn(SHAPE, device=DEVICE)


def _ops_on_sharded_rows(mesh):
    for placement in (Shard(0), Shard(1), Shard(2), Replicate()):
        # A sharded last dimension is gathered (replicated) first: rows must be whole.
        out = placement if placement in (Shard(0), Shard(1)) else Replicate()
        for weight in (True, False):
            case = f"{placement}, {'weight' if weight else 'no weight'}"
            x, r, w, dy, dh = _inputs(weight)
            leaves = [t.requires_grad_() for t in (x, r, w) if t is not None]

            def shard(t, placements=(placement,)):
                return None if t is None else distribute_tensor(t.detach(), mesh, placements)

            dx, dr = (shard(t).requires_grad_() for t in (x, r))
            dw = shard(w, (Replicate(),))
            if dw is not None:
                dw.requires_grad_()

            # rms_norm: the forward autograd records (rms_norm_fwd), its backward (rms_norm_bwd),
            # and the forward without rstd (rms_norm), each against the same call on tensors.
            y = rms_norm(x, w)
            y.backward(dy)
            got = rms_norm(dx, dw)
            assert got.placements == (out,), f"rms_norm {case}: {got.placements}"
            got.backward(shard(dy, got.placements))
            assert_close(got, y, f"rms_norm {case}")
            assert_close(dx.grad, x.grad, f"rms_norm's x.grad, {case}")
            if weight:
                # Each rank's sum over its own rows, added up when the full tensor is asked for.
                sharded = placement in (Shard(0), Shard(1))
                want = (Partial(),) if sharded else (Replicate(),)
                assert dw.grad.placements == want, f"{case}: w.grad is {dw.grad.placements}"
                assert_close(dw.grad, w.grad, f"rms_norm's w.grad, {case}")
            with torch.no_grad():
                assert_close(rms_norm(dx, dw), y, f"rms_norm without grad, {case}")

            for t in leaves + [dx, dr, dw]:
                if t is not None:
                    t.grad = None
            y, h = fused_add_rms_norm(x, r, w)
            torch.autograd.backward((y, h), (dy, dh))
            got_y, got_h = fused_add_rms_norm(dx, dr, dw)
            assert got_y.placements == got_h.placements == (out,), f"fused {case}"
            torch.autograd.backward((got_y, got_h), (shard(dy, (out,)), shard(dh, (out,))))
            assert_close(got_y, y, f"fused_add_rms_norm's y, {case}")
            assert_close(got_h, h, f"fused_add_rms_norm's new residual, {case}")
            assert_close(dx.grad, x.grad, f"fused_add_rms_norm's x.grad, {case}")
            assert_close(dr.grad, r.grad, f"fused_add_rms_norm's residual.grad, {case}")
            if weight:
                assert_close(dw.grad, w.grad, f"fused_add_rms_norm's w.grad, {case}")
            with torch.no_grad():
                got_y, got_h = fused_add_rms_norm(dx, dr, dw)
                assert_close(got_y, y, f"fused_add_rms_norm without grad, {case}")
                assert_close(got_h, h, f"fused_add_rms_norm's residual without grad, {case}")

                # In place, x and residual as they are: an in-place op cannot gather them.
                dx, dr = shard(x), shard(r)
                if placement == Shard(2):
                    with pytest.raises(RuntimeError, match="in-place operations that require"):
                        fused_add_rms_norm_(dx, dr, dw)
                    continue
                fused_add_rms_norm_(dx, dr, dw)
                assert dx.placements == dr.placements == (placement,)
                assert_close(dx, y, f"fused_add_rms_norm_'s x, {case}")
                assert_close(dr, h, f"fused_add_rms_norm_'s residual, {case}")

    # The in-place op on x and residual placed differently: a clear error, not a lost write.
    x, r, w, _, _ = _inputs(weight=True)
    dx, dr = distribute_tensor(x, mesh, [Shard(0)]), distribute_tensor(r, mesh, [Replicate()])
    with torch.no_grad(), pytest.raises(RuntimeError, match="must have the same placements"):
        fused_add_rms_norm_(dx, dr, distribute_tensor(w, mesh, [Replicate()]))


def test_ops_on_sharded_rows():
    """Every op on rows sharded on dim 0 and dim 1 of 3-D input (unevenly), with and without a
    weight: forward and backward as on one process, the weight's gradient a Partial sum; the last
    dimension sharded: gathered first (in place: refused); the in-place op's x and residual placed
    differently: refused."""
    run_distributed(_ops_on_sharded_rows)


def _compiled_dtensor_program(mesh):
    # On CPU the ops run PyTorch code, which Inductor's C++ backend fails to compile where an op
    # writes into its inputs (pytorch/pytorch#196570); aot_eager still traces all of it.
    backend = "inductor" if DEVICE == "cuda" else "aot_eager"

    def block(x, residual, w):
        y, h = fused_add_rms_norm(x, residual, w)
        return (rms_norm(y, w) * y).sum() + h.square().sum()

    def decode_step(x, residual, w):
        fused_add_rms_norm_(x, residual, w)
        return x * 2.0

    x, r, w, _, _ = _inputs(weight=True)
    leaves = [t.detach().requires_grad_() for t in (x, r, w)]
    block(*leaves).backward()
    # Rows sharded on the sequence dimension, as sequence parallelism shards them.
    dx, dr = (distribute_tensor(t, mesh, [Shard(1)]).requires_grad_() for t in (x, r))
    dw = distribute_tensor(w, mesh, [Replicate()]).requires_grad_()
    loss = torch.compile(block, fullgraph=True, backend=backend)(dx, dr, dw)
    loss.backward()
    assert_close(loss, block(*leaves).detach(), "compiled loss")
    for got, leaf, name in zip((dx, dr, dw), leaves, ("x", "residual", "w"), strict=True):
        assert_close(got.grad, leaf.grad, f"compiled {name}.grad")

    with torch.no_grad():
        y, h = fused_add_rms_norm(x, r, w)
        dx, dr = (distribute_tensor(t, mesh, [Shard(1)]) for t in (x, r))
        out = torch.compile(decode_step, fullgraph=True, backend=backend)(dx, dr, dw.detach())
        assert_close(dx, y, "compiled in-place x")
        assert_close(dr, h, "compiled in-place residual")
        assert_close(out, y * 2.0, "compiled in-place output")


def test_compile_fullgraph_over_dtensors():
    """torch.compile(fullgraph=True) over a DTensor program: both ops, a backward, and the
    in-place op writing into sharded x and residual."""
    run_distributed(_compiled_dtensor_program)


class FeedForward(torch.nn.Module):
    """norm, then a two-layer MLP, then norm: the pieces of a transformer block that tensor and
    sequence parallelism shard."""

    def __init__(self, dim=32, hidden=64):
        super().__init__()
        self.norm_in = RMSNorm(dim)
        self.up = torch.nn.Linear(dim, hidden)
        self.down = torch.nn.Linear(hidden, dim)
        self.norm_out = RMSNorm(dim)
        with torch.no_grad():  # weights other than ones, so that a wrong dw shows
            self.norm_in.weight.uniform_(0.5, 1.5)
            self.norm_out.weight.uniform_(0.5, 1.5)

    def forward(self, x):
        return self.norm_out(self.down(torch.nn.functional.gelu(self.up(self.norm_in(x)))))


def _train(model, batches, loss_of):
    """A few SGD steps; returns each step's loss."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    losses = []
    for x in batches:
        optimizer.zero_grad()
        loss = loss_of(model, x)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return losses


def _batches(count=3, shape=(4, 8, 32)):
    torch.manual_seed(1)
    return [torch.randn(shape, device=DEVICE) for _ in range(count)]


def _mean_square(model, x):
    return model(x).square().mean()


def _parallel_training(mesh):
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same initial weights on every rank
    reference = FeedForward().to(DEVICE)
    want = _train(reference, _batches(), _mean_square)

    # Tensor and sequence parallelism: the norms work on the rows of a sequence shard
    # (SequenceParallel, which the registered sharding allows), the linear layers on shards of
    # their weights, with an all-gather of the sequence before and a reduce-scatter after.
    torch.manual_seed(0)
    model = parallelize_module(
        FeedForward().to(DEVICE),
        mesh,
        {
            "norm_in": SequenceParallel(),
            "up": ColwiseParallel(input_layouts=Shard(1)),
            "down": RowwiseParallel(output_layouts=Shard(1)),
            "norm_out": SequenceParallel(use_local_output=False),
        },
    )

    def sequence_shard_loss(model, x):  # each rank feeds its part of the sequence (dim 1)
        return model(x.chunk(mesh.size(), dim=1)[rank]).full_tensor().square().mean()

    got = _train(model, _batches(), sequence_shard_loss)
    torch.testing.assert_close(torch.stack(got), torch.stack(want), msg="TP/SP losses", **TRAINED)
    for (name, p), p_ref in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert_close(p, p_ref.detach(), f"TP/SP {name} after training", **TRAINED)

    # FSDP2: each rank trains on its share of every batch with its shard of the parameters.
    torch.manual_seed(0)
    model = FeedForward().to(DEVICE)
    for layer in (model.up, model.down):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)

    def batch_shard_loss(model, x):  # the mean over all ranks' shares is the full batch's mean
        return _mean_square(model, x.chunk(mesh.size(), dim=0)[rank])

    got = _train(model, _batches(), batch_shard_loss)
    mean = torch.stack(got)
    dist.all_reduce(mean)
    mean /= mesh.size()
    torch.testing.assert_close(mean, torch.stack(want), msg="FSDP2 losses", **TRAINED)
    for (name, p), p_ref in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert_close(p, p_ref.detach(), f"FSDP2 {name} after training", **TRAINED)


def test_parallel_training_matches_one_process():
    """A few optimizer steps of a norm-MLP-norm model, as on one process: with tensor and
    sequence parallelism (parallelize_module), then with FSDP2 (fully_shard)."""
    run_distributed(_parallel_training)
