"""``RMSNorm`` module, a drop-in for ``torch.nn.RMSNorm`` over the last dimension."""

from __future__ import annotations

from numbers import Integral

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
