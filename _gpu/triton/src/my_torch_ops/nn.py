"""``RMSNorm`` module, a drop-in for ``torch.nn.RMSNorm`` over the last dimension."""

from __future__ import annotations

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
        if not isinstance(normalized_shape, int):
            shape = tuple(normalized_shape)
            if len(shape) != 1:
                raise ValueError(
                    f"normalized_shape must be an int (the size of the last dimension), "
                    f"got {normalized_shape!r}"
                )
            normalized_shape = shape[0]
        self.normalized_shape = (normalized_shape,)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = torch.nn.Parameter(
                torch.ones(normalized_shape, device=device, dtype=dtype)
            )
        else:
            self.register_parameter("weight", None)

    def reset_parameters(self) -> None:
        if self.weight is not None:
            torch.nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        eps = torch.finfo(compute_dtype(x)).eps if self.eps is None else self.eps
        return rms_norm(x, self.weight, eps)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        )
