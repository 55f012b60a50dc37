"""Grouped asymmetric int4, as the .fir format defines it.

For each row of a ``[out, in]`` matrix, each run of ``G`` consecutive input
elements is a group with ``scale = (max - min) / 15`` and
``q = clip(round((w - min) / scale), 0, 15)``; ``w' = q * scale + min``.
A group whose max equals its min gets scale 1 and q 0. Codes are packed two
per byte, low nibble first. Rounding is NumPy's round-half-to-even.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_GROUP = 32


@dataclass(frozen=True)
class Q4Matrix:
    rows: int
    cols: int
    group: int
    packed: np.ndarray  # uint8 [rows, ceil(ngroups*group/2)]
    scale: np.ndarray  # f32 [rows, ngroups]
    minimum: np.ndarray  # f32 [rows, ngroups]

    @property
    def ngroups(self) -> int:
        return self.scale.shape[1]

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scale.nbytes + self.minimum.nbytes

    def codes(self) -> np.ndarray:
        """uint8 codes 0..15 of shape [rows, cols]."""
        p = self.packed
        codes = np.empty((self.rows, p.shape[1] * 2), dtype=np.uint8)
        codes[:, 0::2] = p & 0x0F
        codes[:, 1::2] = p >> 4
        return codes[:, : self.cols]

    def dequantize(self, out: np.ndarray | None = None) -> np.ndarray:
        """f32 [rows, cols]: q * scale + min, computed in f32."""
        g = self.group
        ng = self.ngroups
        codes = self.codes()
        if ng * g != self.cols:
            codes = np.pad(codes, ((0, 0), (0, ng * g - self.cols)))
        q = codes.reshape(self.rows, ng, g).astype(np.float32)
        deq = q * self.scale[:, :, None] + self.minimum[:, :, None]
        deq = deq.reshape(self.rows, ng * g)[:, : self.cols]
        if out is not None:
            out[...] = deq
            return out
        return np.ascontiguousarray(deq)


def quantize(w: np.ndarray, group: int = DEFAULT_GROUP) -> Q4Matrix:
    """Quantize an f32 ``[rows, cols]`` matrix group-wise along its columns."""
    if w.ndim != 2:
        raise ValueError("quantize expects a 2-D matrix")
    if group < 1:
        raise ValueError("group must be positive")
    rows, cols = w.shape
    w = np.asarray(w, dtype=np.float32)
    ng = -(-cols // group)
    padded = ng * group
    if padded != cols:
        # Pad with each row's last element: it never widens a group's range.
        w = np.concatenate([w, np.repeat(w[:, -1:], padded - cols, axis=1)], axis=1)
    grouped = w.reshape(rows, ng, group)
    lo = grouped.min(axis=2)
    hi = grouped.max(axis=2)
    scale = ((hi - lo) / np.float32(15)).astype(np.float32)
    flat = scale == 0
    scale[flat] = 1.0
    # (w - min) / scale in f64: with f32 inputs this is exact enough that the
    # rounded code is the nearest one, so |w - w'| <= scale/2 up to f32 rounding.
    q = np.rint((grouped - lo[:, :, None]).astype(np.float64) / scale[:, :, None])
    np.clip(q, 0, 15, out=q)
    q = q.astype(np.uint8).reshape(rows, padded)
    if padded % 2:
        q = np.pad(q, ((0, 0), (0, 1)))
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
    return Q4Matrix(rows, cols, group, np.ascontiguousarray(packed), scale, lo.astype(np.float32))
