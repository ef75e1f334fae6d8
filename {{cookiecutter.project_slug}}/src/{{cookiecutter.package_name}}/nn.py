"""``RMSNorm`` module, a drop-in for ``torch.nn.RMSNorm`` over the last dimension, and
``replace_rms_norm``, which swaps a model's RMSNorms for it."""

from __future__ import annotations

from numbers import Integral, Real
from typing import NamedTuple

import torch

from ._checks import compute_dtype
from .rms_norm import rms_norm


class RMSNorm(torch.nn.Module):
    """RMSNorm over the last dimension; arguments, ``weight`` and ``state_dict`` match
    torch.nn.RMSNorm's. As there, ``eps=None`` is the machine epsilon of the dtype the math runs
    in: float32's, float64's for float64 ``x``."""

    def __init__(
        self,
        normalized_shape: int,
        eps: float | None = None,
        elementwise_affine: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if isinstance(normalized_shape, Integral):  # Python's int or numpy's, as torch takes
            normalized_shape = (normalized_shape,)
        shape = tuple(normalized_shape)
        if len(shape) != 1:
            raise ValueError(
                f"normalized_shape must be an int (the size of the last dimension), got {shape!r}"
            )
        self.normalized_shape = (int(shape[0]),)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = torch.nn.Parameter(
                torch.ones(self.normalized_shape, device=device, dtype=dtype)
            )
        else:
            self.register_parameter("weight", None)

    def reset_parameters(self) -> None:
        if self.weight is not None:
            torch.nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1:] != self.normalized_shape:  # as torch.nn.RMSNorm, with or without a weight
            raise ValueError(
                f"x must have a last dimension of {self.normalized_shape[0]} (normalized_shape), "
                f"got shape {tuple(x.shape)}"
            )
        eps = torch.finfo(compute_dtype(x)).eps if self.eps is None else self.eps
        return rms_norm(x, self.weight, eps)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        )


class Replaced(NamedTuple):
    """What ``replace_rms_norm`` did: the qualified names of the norms it swapped, and those of
    the RMSNorm-like modules it left alone, each with the reason."""

    replaced: list[str]
    skipped: dict[str, str]


def replace_rms_norm(model: torch.nn.Module) -> Replaced:
    """Swaps, in place, every ``torch.nn.RMSNorm`` in ``model`` and every module whose class name
    ends in "RMSNorm" and whose math is Llama's (weight times x normalized in float32) for this
    package's ``RMSNorm``. The new module holds the same ``weight`` Parameter object (optimizers
    and FSDP keep their references), with its eps (``eps`` or Hugging Face's
    ``variance_epsilon``). A candidate is swapped only if a probe agrees: on a random float32
    input and a random weight, through ``torch.func.functional_call`` (the module's own state is
    untouched, its hooks run), it returns what ``RMSNorm`` returns. Norms with other math (Gemma's
    ``1 + weight``, eps outside the square root, ...) are left alone and reported. Call it before
    ``fully_shard`` or ``torch.compile``."""
    done: dict[torch.nn.Module, RMSNorm | str] = {}  # each module probed once
    replaced, skipped = [], {}
    for name, module in model.named_modules(remove_duplicate=False):
        if isinstance(module, RMSNorm) or not (
            isinstance(module, torch.nn.RMSNorm) or type(module).__name__.endswith("RMSNorm")
        ):
            continue
        if module not in done:
            done[module] = "it is the model itself" if module is model else _swap_for(module)
        new = done[module]
        if isinstance(new, str):
            skipped[name] = new
            continue
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, new)
        replaced.append(name)
    return Replaced(replaced, skipped)


def _swap_for(module: torch.nn.Module) -> RMSNorm | str:
    """This package's RMSNorm computing what ``module`` computes, or why there is none."""
    weight = getattr(module, "weight", None)
    shape = tuple(getattr(module, "normalized_shape", ()))
    if isinstance(weight, torch.nn.Parameter) and weight.dim() == 1:
        size = weight.shape[0]
    elif weight is None and not getattr(module, "elementwise_affine", True) and len(shape) == 1:
        size = shape[0]
    else:
        return "no 1-D weight Parameter (nor elementwise_affine=False and a 1-D normalized_shape)"
    eps = next((getattr(module, a) for a in ("eps", "variance_epsilon") if hasattr(module, a)), "")
    if not (eps is None or isinstance(eps, Real)):
        return "no float eps (an eps or variance_epsilon attribute)"
    new = RMSNorm(size, eps, elementwise_affine=weight is not None, device="meta")
    if weight is not None:
        new.weight = weight
    new.train(module.training)
    # Rows of mean square 1 and 1e-6, so that eps counts; a weight not all ones, so that a norm
    # that scales by 1 + weight, or ignores it, differs. A generator of its own: the caller's
    # random stream stays as it was.
    device = torch.device("cpu") if weight is None or weight.is_meta else weight.device
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, size, generator=gen) * torch.tensor([[1.0], [1.0], [1e-3], [1e-3]])
    x = x.to(device)
    params = {}
    if weight is not None:
        params["weight"] = torch.rand(size, generator=gen).add(0.5).to(device, weight.dtype)
    try:
        with torch.no_grad():
            expected = torch.func.functional_call(new, params, (x,))
            got = torch.func.functional_call(module, params, (x,))
    except Exception as e:  # a norm whose forward takes other arguments, or other tensors
        return f"the probe failed: {type(e).__name__}: {e}"
    if got.shape != expected.shape or not torch.allclose(
        got.float(), expected, rtol=1e-4, atol=1e-5
    ):
        return "its output differs from RMSNorm's (other math, e.g. 1 + weight)"
    return new
