"""How the ops run on DTensors (``torch.distributed.tensor``), for tensor and sequence parallelism.

An RMSNorm normalizes each row (the last dimension) on its own, so rows sharded on any leading
dimension stay sharded, and each rank runs the op on its own rows. The weight is replicated. Its
gradient is a sum over all rows: each rank holds the sum over its own rows, a ``Partial`` sum that
DTensor adds up across ranks where it is needed (labelled ``Replicate`` it would be silently wrong).
No strategy shards the last dimension or the weight: DTensor gathers such an input first.

FSDP2 (``fully_shard``) needs none of this: it hands the ops plain tensors.

An added op gets a line in ``RULES`` per overload.
"""

from __future__ import annotations

import functools

import torch
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.experimental import register_sharding

ops = torch.ops.{{ cookiecutter.package_name }}

# What a tensor is to the rows the op works on:
ROWS = "rows"  # one or more values per row (x, y, rstd, ...): sharded as the rows are
WRITTEN = "rows written in place"  # as ROWS, in an argument the op writes into
REPLICATED = "replicated"  # the weight: each rank reads all of it
SUM_OVER_ROWS = "sum over rows"  # the weight's gradient: with sharded rows, a Partial sum

# Each op overload: what each of its arguments is (None: not a tensor), then what each of its
# outputs is, in the order of its schema.
RULES = {
    ops.rms_norm.default: ((ROWS, REPLICATED, None), (ROWS,)),
    ops.rms_norm_fwd.default: ((ROWS, REPLICATED, None), (ROWS, ROWS)),
    ops.rms_norm_bwd.default: ((ROWS, ROWS, ROWS, REPLICATED), (ROWS, SUM_OVER_ROWS)),
    ops.fused_add_rms_norm.default: ((ROWS, ROWS, REPLICATED, None), (ROWS, ROWS)),
    ops.fused_add_rms_norm_fwd.default: ((ROWS, ROWS, REPLICATED, None), (ROWS, ROWS, ROWS)),
    ops.fused_add_rms_norm_bwd.default: (
        (ROWS, ROWS, ROWS, ROWS, REPLICATED),
        (ROWS, SUM_OVER_ROWS),
    ),
    ops.fused_add_rms_norm_.default: ((WRITTEN, WRITTEN, REPLICATED, None), ()),
}


def row_wise(op, *args, inputs: tuple, outputs: tuple) -> list[tuple[list, list]]:
    """``register_sharding``'s strategies for ``op``, which works on each row on its own, called
    with ``args`` (DTensor specs in place of tensors): every tensor replicated, or the rows sharded
    on one leading dimension. An optional tensor passed as None gets no placement."""
    written = [arg.placements for arg, kind in zip(args, inputs, strict=True) if kind == WRITTEN]
    if any(placements != written[0] for placements in written):
        # DTensor runs an in-place op on its first argument as it is, but would hand it a
        # redistributed copy of another placed otherwise: what the op wrote there would be lost.
        raise RuntimeError(
            f"{op} writes into its arguments in place: as DTensors they must have the same "
            f"placements, got {', '.join(str(p) for p in written)}"
        )
    ndim = next(arg.ndim for arg, kind in zip(args, inputs, strict=True) if kind in (ROWS, WRITTEN))
    strategies = []
    for rows in [Replicate(), *(Shard(dim) for dim in range(ndim - 1))]:
        placement = {
            ROWS: rows,
            WRITTEN: rows,
            REPLICATED: Replicate(),
            SUM_OVER_ROWS: Partial() if rows.is_shard() else Replicate(),
        }
        ins = [
            None if arg is None or kind is None else placement[kind]
            for arg, kind in zip(args, inputs, strict=True)
        ]
        strategies.append(([placement[kind] for kind in outputs], ins))
    return strategies


for op, (inputs, outputs) in RULES.items():
    register_sharding(op)(functools.partial(row_wise, op, inputs=inputs, outputs=outputs))
