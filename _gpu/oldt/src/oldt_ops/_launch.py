"""Launches Triton kernels with less host time per call than ``kernel[grid](...)``.

``kernel[grid](*args, **meta)`` works out on every call which compiled variant of the kernel the
arguments select, from facts Triton specializes on: each tensor's dtype and whether its address
is a multiple of 16, whether each integer is 1, a multiple of 16 or beyond 32 bits, the constexpr
values and the launch options. That, and the reading of its settings around it, costs more host
time than a decode-size kernel runs. A ``Launcher`` keys a cache on the same facts, computed
directly from the few argument types these kernels take; a miss goes through ``kernel[grid]``,
which compiles as usual and returns the compiled kernel, kept for the next call with that key. Under
Triton's interpreter, or with a launch hook set (a profiler), every call takes the plain path.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import triton

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def _args_key(args: tuple) -> tuple:
    # One comprehension, not a call per argument: this runs on every launch.
    return tuple(
        [
            (a.dtype, not a.data_ptr() & 15)
            if isinstance(a, torch.Tensor)
            else (a == 1, not a & 15, -(2**31) <= a < 2**31)
            if type(a) is int
            else type(a)  # float, bool or None
            for a in args
        ]
    )


def _hooks_set() -> bool:
    # Triton keeps launch hooks in chains (empty unless a profiler adds one), not None.
    runtime = triton.knobs.runtime
    return bool(runtime.launch_enter_hook.calls or runtime.launch_exit_hook.calls)


class Launcher:
    """``Launcher(kernel, **meta)(grid, *args)`` runs ``kernel[grid](*args, **meta)``.

    One launcher serves one kernel with one set of constexprs and launch options (``num_warps``),
    fixed when it is built, once per configuration; ``args`` are the kernel's runtime parameters,
    in order and ahead of its constexprs. Launches go to the device of ``args[0]`` and its current
    stream.
    """

    def __init__(self, kernel: Any, **meta: Any) -> None:
        self.kernel = kernel
        self.meta = meta
        # A compiled kernel's launcher takes every parameter in signature order, the constexprs
        # last: those are the ones named in meta, minus the launch options.
        names = [name for name in kernel.arg_names if name in meta]
        if names != kernel.arg_names[len(kernel.arg_names) - len(names) :]:
            raise ValueError(f"{kernel.__name__}: the constexprs must be its last parameters")
        self._constexprs = tuple(meta[name] for name in names)
        self._compiled: dict[tuple, Any] = {}

    def __call__(self, grid: tuple[int, ...], *args: Any) -> None:
        if _INTERPRETED:
            self.kernel[grid](*args, **self.meta)
            return
        device = args[0].get_device()
        if device != torch._C._cuda_getDevice():  # torch.cuda.current_device(), less Python
            # Triton compiles for and launches on the current device.
            with torch.cuda.device(device):
                self(grid, *args)
            return
        key = (device, _args_key(args))
        compiled = self._compiled.get(key)
        if compiled is None or _hooks_set():
            compiled = self.kernel[grid](*args, **self.meta)
            if compiled is not None:
                self._compiled[key] = compiled
            return
        compiled.run(
            grid[0],
            grid[1] if len(grid) > 1 else 1,
            grid[2] if len(grid) > 2 else 1,
            # What Triton itself launches on: the current stream's raw handle, no Stream object.
            torch._C._cuda_getCurrentRawStream(device),
            compiled.function,
            compiled.packed_metadata,
            None,  # launch metadata: only read by launch hooks, unset here
            None,
            None,
            *args,
            *self._constexprs,
        )
