"""FIRE's per-pair lines (``fire._Lines``) on the CPU in C (``posenc_bench.native``): the bias C[s] + A[s] (u -
p[s]) of every head written in one pass over a row of pairs, and in backward du with, per piece and head, the
sums of the gradient and of the gradient times u - p[s], over runs of equal pieces (u is monotone along a row)
summed in double. The torch ops of ``_Lines`` take a gather per head and an ``index_add_`` over all pairs for
the same values; both paths are tested against the MLP run pair by pair (tests/encodings/test_fire.py). Used
for float32 on the CPU with pieces counted into uint8 (``fire.pieces``), where a C compiler is found.
"""

from __future__ import annotations

import ctypes
from typing import Optional

import torch

from posenc_bench import native
from posenc_bench.native import pointer as _ptr

SOURCE = r"""#include <omp.h>
#include <stdint.h>
#include <string.h>

/* The bias C[s] + A[s] (u - p[s]) of every head at each pair, s = piece: out (L, H, Tq, Tk) from u, piece
   (L, Tq, Tk); offset (u - p[s], same shape) written too where it is not NULL (training keeps it). */
void fire_lines(const float *u, const uint8_t *piece, const float *inside, const float *values,
                const float *slopes, float *out, float *offset, int64_t L, int64_t Tq, int64_t Tk, int64_t H,
                int64_t S, int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t row = 0; row < L * Tq; row++) {
        const int64_t b = row / Tq, r = row % Tq;
        const float *ur = u + row * Tk;
        const uint8_t *pr = piece + row * Tk;
        float *offr = offset ? offset + row * Tk : NULL;
        for (int64_t h = 0; h < H; h++) {
            const float *vh = values + h * S, *sh = slopes + h * S;
            float *o = out + ((b * H + h) * Tq + r) * Tk;
            #pragma omp simd
            for (int64_t c = 0; c < Tk; c++) {
                const int s = pr[c];
                o[c] = vh[s] + sh[s] * (ur[c] - inside[s]);
            }
        }
        if (offr) {
            #pragma omp simd
            for (int64_t c = 0; c < Tk; c++) offr[c] = ur[c] - inside[pr[c]];
        }
    }
}

/* Backward from the bias's gradient g (L, H, Tq, Tk): du = sum_h g_h A_h[s] per pair, and per piece s and
   head h the sums of g_h and of g_h (u - p[s]), in double, into partial (threads, 2 H, S), one slice per
   thread: row by row, a run of equal pieces (u is monotone along a row: long runs) summed, then added once. */
void fire_lines_backward(const float *g, const float *offset, const uint8_t *piece, const float *slopes,
                         float *du, double *partial, int64_t L, int64_t Tq, int64_t Tk, int64_t H, int64_t S,
                         int threads) {
    memset(partial, 0, (size_t)threads * 2 * H * S * sizeof *partial);
    #pragma omp parallel num_threads(threads)
    {
        double *acc = partial + (int64_t)omp_get_thread_num() * 2 * H * S;
        #pragma omp for schedule(static)
        for (int64_t row = 0; row < L * Tq; row++) {
            const int64_t b = row / Tq, r = row % Tq;
            const float *off = offset + row * Tk;
            const uint8_t *pr = piece + row * Tk;
            float *d = du + row * Tk;
            const float *gr = g + (b * H * Tq + r) * Tk;  /* head h's row at gr + h Tq Tk */
            for (int64_t c = 0; c < Tk; c++) d[c] = 0.0f;
            for (int64_t h = 0; h < H; h++) {
                const float *gh = gr + h * Tq * Tk, *sh = slopes + h * S;
                #pragma omp simd
                for (int64_t c = 0; c < Tk; c++) d[c] += gh[c] * sh[pr[c]];
            }
            int64_t start = 0;
            while (start < Tk) {
                const int s = pr[start];
                int64_t end = start + 1;
                while (end < Tk && pr[end] == s) end++;
                for (int64_t h = 0; h < H; h++) {
                    const float *gh = gr + h * Tq * Tk;
                    double sg = 0.0, sgo = 0.0;
                    #pragma omp simd reduction(+:sg, sgo)
                    for (int64_t c = start; c < end; c++) {
                        sg += gh[c];
                        sgo += (double)gh[c] * off[c];
                    }
                    acc[h * S + s] += sg;
                    acc[(H + h) * S + s] += sgo;
                }
                start = end;
            }
        }
    }
}
"""

_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SIGNATURES = {
    "fire_lines": [_P, _P, _P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _INT],
    "fire_lines_backward": [_P, _P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _INT],
}


def library() -> Optional[ctypes.CDLL]:
    return native.load("fire", SOURCE, _SIGNATURES)


def usable(u: torch.Tensor, piece: torch.Tensor) -> bool:
    """Whether the kernels take these pairs: float32 u on the CPU, uint8 pieces, the library built (a warning,
    once, where it cannot be)."""
    return (u.device.type == "cpu" and u.dtype == torch.float32 and piece.dtype == torch.uint8
            and native.loaded("fire", SOURCE, _SIGNATURES, "FIRE"))


def lines(u: torch.Tensor, piece: torch.Tensor, inside: torch.Tensor, values: torch.Tensor, slopes: torch.Tensor,
          keep: bool) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The bias (L, H, Tq, Tk) = values[h, s] + slopes[h, s] (u - inside[s]) at s = piece, from u and piece
    (L, Tq, Tk), values and slopes (H, S); and u - inside[s] (L, Tq, Tk) where ``keep`` (for backward)."""
    L, Tq, Tk = u.shape
    H, S = values.shape
    out = torch.empty(L, H, Tq, Tk, dtype=u.dtype)
    offset = torch.empty_like(u) if keep else None
    library().fire_lines(_ptr(u), _ptr(piece, torch.uint8), _ptr(inside), _ptr(values), _ptr(slopes), _ptr(out),
                         _ptr(offset), L, Tq, Tk, H, S, torch.get_num_threads())
    return out, offset


def lines_backward(g: torch.Tensor, offset: torch.Tensor, piece: torch.Tensor, slopes: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """From the bias's gradient g (L, H, Tq, Tk): du (L, Tq, Tk) and the per-piece sums (2 H, S), float64:
    rows h of g, rows H + h of g (u - p[s])."""
    L, H, Tq, Tk = g.shape
    S = slopes.shape[-1]
    threads = torch.get_num_threads()
    du = torch.empty_like(offset)
    partial = torch.empty(threads, 2 * H, S, dtype=torch.float64)
    library().fire_lines_backward(_ptr(g), _ptr(offset), _ptr(piece, torch.uint8), _ptr(slopes), _ptr(du),
                                  _ptr(partial, torch.float64), L, Tq, Tk, H, S, threads)
    return du, partial.sum(0)
