"""A reference dequantisation of the GGUF block formats Gemma 3 270M's Q4_K_M file holds, written
here from ggml's block layouts (``block_q4_K``, ``block_q6_K``, ``block_q5_0``, ``block_q8_0``), one
block at a time and kept deliberately plain: a second reading of the format, independent of the
vectorised one in the ``gguf`` package that transformers uses. Each function maps the raw bytes of
one row to float32 values."""

from __future__ import annotations

import numpy as np

QK_K = 256


def _f16(b: np.ndarray, at: int) -> float:
    return float(b[at : at + 2].view(np.float16)[0])


def _scale_min_k4(j: int, s: np.ndarray) -> tuple[int, int]:
    """The 6-bit scale and min of sub-block ``j`` (of 8) from the 12 packed bytes."""
    if j < 4:
        return int(s[j]) & 63, int(s[j + 4]) & 63
    sc = (int(s[j + 4]) & 0xF) | ((int(s[j - 4]) >> 6) << 4)
    m = (int(s[j + 4]) >> 4) | ((int(s[j]) >> 6) << 4)
    return sc, m


def q4_k_block(b: np.ndarray) -> np.ndarray:
    """144 bytes: d, dmin (f16), 12 bytes of packed 6-bit scales and mins, 128 bytes of 4-bit quants."""
    d, dmin, scales, qs = _f16(b, 0), _f16(b, 2), b[4:16], b[16:144]
    out = np.empty(QK_K, np.float32)
    for chunk in range(4):
        q = qs[32 * chunk : 32 * chunk + 32].astype(np.int32)
        for half, nib in ((0, q & 0xF), (1, q >> 4)):
            sc, m = _scale_min_k4(2 * chunk + half, scales)
            start = 64 * chunk + 32 * half
            out[start : start + 32] = d * sc * nib - dmin * m
    return out


def q6_k_block(b: np.ndarray) -> np.ndarray:
    """210 bytes: 128 bytes low 4 bits, 64 bytes high 2 bits, 16 int8 scales, d (f16)."""
    ql, qh, sc, d = (
        b[0:128].astype(np.int32),
        b[128:192].astype(np.int32),
        b[192:208].view(np.int8),
        _f16(b, 208),
    )
    out = np.empty(QK_K, np.float32)
    for n in range(2):
        lo, hi, s = ql[64 * n : 64 * n + 64], qh[32 * n : 32 * n + 32], sc[8 * n : 8 * n + 8].astype(np.int32)
        for ll in range(32):
            g = ll // 16
            q1 = ((lo[ll] & 0xF) | (((hi[ll] >> 0) & 3) << 4)) - 32
            q2 = ((lo[ll + 32] & 0xF) | (((hi[ll] >> 2) & 3) << 4)) - 32
            q3 = ((lo[ll] >> 4) | (((hi[ll] >> 4) & 3) << 4)) - 32
            q4 = ((lo[ll + 32] >> 4) | (((hi[ll] >> 6) & 3) << 4)) - 32
            base = 128 * n
            out[base + ll] = d * s[g] * q1
            out[base + ll + 32] = d * s[g + 2] * q2
            out[base + ll + 64] = d * s[g + 4] * q3
            out[base + ll + 96] = d * s[g + 6] * q4
    return out


def q5_0_block(b: np.ndarray) -> np.ndarray:
    """22 bytes: d (f16), 32 high bits (u32), 16 bytes of low nibbles; 32 values."""
    d, qh, qs = _f16(b, 0), int(b[2:6].view(np.uint32)[0]), b[6:22].astype(np.int32)
    out = np.empty(32, np.float32)
    for j in range(16):
        out[j] = d * (((qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - 16)
        out[j + 16] = d * (((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16)
    return out


def q8_0_block(b: np.ndarray) -> np.ndarray:
    """34 bytes: d (f16), 32 int8 quants."""
    return (_f16(b, 0) * b[2:34].view(np.int8).astype(np.float32)).astype(np.float32)


BLOCKS = {
    "Q4_K": (144, q4_k_block),
    "Q6_K": (210, q6_k_block),
    "Q5_0": (22, q5_0_block),
    "Q8_0": (34, q8_0_block),
}


def dequantize_row(kind: str, row: np.ndarray) -> np.ndarray:
    """One row of a quantised tensor (its raw bytes, as ``GGUFReader`` gives them) as float32."""
    size, block = BLOCKS[kind]
    row = np.ascontiguousarray(row, dtype=np.uint8)
    if row.size % size:
        raise ValueError(f"{kind}: a row of {row.size} bytes is not whole {size}-byte blocks")
    return np.concatenate([block(row[i : i + size]) for i in range(0, row.size, size)])
