"""DAPE's f (``dape.DAPEMLP``) on the CPU in C (``posenc_bench.native``): for every (query, key) pair the MLP
Linear(2H, W), LeakyReLU, Linear(W, H) of the pair's logits and bias over heads, computed in registers over a
block of 64 keys, with no (pairs, W) hidden layer in memory; backward recomputes the hidden layer the same way
and sums the weights' gradients per thread in double. Keys past a query row's ``limit`` (the last key its mask
lets any head see, plus one) are skipped: their logits are -inf after f, so f's value there (0 here) never
counts and their gradient is 0. The torch path (``F.linear`` on the permuted logits under autograd) holds the
hidden layer and its pre-activation for every pair; both are tested against the authors' formula
(tests/encodings/test_dape.py) and against each other (tests/encodings/test_dape_kernel.py). Used for float32
on the CPU where a C compiler is found.
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
#define CB 64

/* The pre-activation of hidden unit w over keys [c0, c0 + n) of one row: c[w] + sum_h fc[w, h] x_h + fc[w, H + h] b_h
   (fc (W, 2 H): the logits' columns, then the bias's; x_h at xr + h plane, b_h at br + h plane), leaky into act
   where act is not NULL. */
static inline void pre_of(float *pre, float *act, const float *xr, const float *br, const float *fc,
                          const float *cw, int64_t w, int64_t H, int64_t plane, int64_t c0, int64_t n, float slope) {
    for (int64_t i = 0; i < n; i++) pre[i] = cw[w];
    for (int64_t h = 0; h < H; h++) {
        const float a = fc[w * 2 * H + h], e = fc[w * 2 * H + H + h];
        const float *xh = xr + h * plane + c0, *bh = br + h * plane + c0;
        #pragma omp simd
        for (int64_t i = 0; i < n; i++) pre[i] += a * xh[i] + e * bh[i];
    }
    if (act) {
        #pragma omp simd
        for (int64_t i = 0; i < n; i++) act[i] = pre[i] > 0.0f ? pre[i] : slope * pre[i];
    }
}

/* out[b, h, r, c] = d[h] + sum_w p[h, w] leaky(pre_w) for keys c < limit[r], 0 after; x, out (B, H, Tq, Tk),
   bias (Bb, H, Tq, Tk) with Bb 1 (the same for every sequence) or B. */
void dape_mlp(const float *x, const float *bias, const int64_t *limit, const float *fc, const float *cw, const float *p, const float *d, float *out, int64_t B, int64_t Bb, int64_t H,
              int64_t Tq, int64_t Tk, int64_t W, float slope, int threads) {
    const int64_t plane = Tq * Tk;
    #pragma omp parallel for schedule(dynamic, 4) num_threads(threads)
    for (int64_t row = 0; row < B * Tq; row++) {
        const int64_t b = row / Tq, r = row % Tq, bb = Bb == 1 ? 0 : b, lim = limit[r];
        const float *xr = x + b * H * plane + r * Tk, *br = bias + bb * H * plane + r * Tk;
        float *orow = out + b * H * plane + r * Tk;
        float pre[CB], act[CB], acc[H * CB];
        for (int64_t c0 = 0; c0 < lim; c0 += CB) {
            const int64_t n = lim - c0 < CB ? lim - c0 : CB;
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < n; i++) acc[h * CB + i] = d[h];
            for (int64_t w = 0; w < W; w++) {
                pre_of(pre, act, xr, br, fc, cw, w, H, plane, c0, n, slope);
                for (int64_t h = 0; h < H; h++) {
                    const float ph = p[h * W + w];
                    float *ah = acc + h * CB;
                    #pragma omp simd
                    for (int64_t i = 0; i < n; i++) ah[i] += ph * act[i];
                }
            }
            for (int64_t h = 0; h < H; h++) memcpy(orow + h * plane + c0, acc + h * CB, n * sizeof(float));
        }
        for (int64_t h = 0; h < H; h++) memset(orow + h * plane + lim, 0, (Tk - lim) * sizeof(float));
    }
}

/* From f's gradient g (B, H, Tq, Tk): dx (B, H, Tq, Tk), db (Bb, H, Tq, Tk; summed over the batch where Bb is 1;
   NULL: not wanted), and into partial (threads, 2 W H + W + H W + H), one slice per thread, in double: the
   gradients of fc, c, p, d. Rows are split by query row, each thread taking every sequence of its rows, so
   a row of db has one writer. */
void dape_mlp_backward(const float *g, const float *x, const float *bias, const int64_t *limit, const float *fc,
                       const float *cw, const float *p, float *dx, float *db, double *partial,
                       int64_t B, int64_t Bb, int64_t H, int64_t Tq, int64_t Tk, int64_t W, float slope,
                       int threads) {
    const int64_t plane = Tq * Tk, np = 2 * W * H + W + H * W + H;
    memset(partial, 0, (size_t)threads * np * sizeof *partial);
    #pragma omp parallel num_threads(threads)
    {
        double *gfc = partial + (int64_t)omp_get_thread_num() * np;
        double *gc = gfc + 2 * W * H, *gp = gc + W, *gd = gp + H * W;
        float pre[CB], act[CB], dpre[CB], dxa[H * CB], dba[H * CB];
        #pragma omp for schedule(dynamic, 4)
        for (int64_t r = 0; r < Tq; r++) {
            const int64_t lim = limit[r];
            if (db)
                for (int64_t h = 0; h < Bb * H; h++) memset(db + h * plane + r * Tk, 0, Tk * sizeof(float));
            for (int64_t b = 0; b < B; b++) {
                const int64_t bb = Bb == 1 ? 0 : b;
                const float *xr = x + b * H * plane + r * Tk, *br = bias + bb * H * plane + r * Tk;
                const float *gr = g + b * H * plane + r * Tk;
                float *dxr = dx + b * H * plane + r * Tk, *dbr = db ? db + bb * H * plane + r * Tk : NULL;
                for (int64_t h = 0; h < H; h++) memset(dxr + h * plane + lim, 0, (Tk - lim) * sizeof(float));
                for (int64_t c0 = 0; c0 < lim; c0 += CB) {
                    const int64_t n = lim - c0 < CB ? lim - c0 : CB;
                    memset(dxa, 0, sizeof dxa);
                    memset(dba, 0, sizeof dba);
                    for (int64_t h = 0; h < H; h++) {
                        const float *gh = gr + h * plane + c0;
                        float s = 0.0f;
                        #pragma omp simd reduction(+:s)
                        for (int64_t i = 0; i < n; i++) s += gh[i];
                        gd[h] += s;
                    }
                    for (int64_t w = 0; w < W; w++) {
                        pre_of(pre, act, xr, br, fc, cw, w, H, plane, c0, n, slope);
                        for (int64_t i = 0; i < n; i++) dpre[i] = 0.0f;
                        for (int64_t h = 0; h < H; h++) {
                            const float ph = p[h * W + w], *gh = gr + h * plane + c0;
                            float s = 0.0f;
                            #pragma omp simd reduction(+:s)
                            for (int64_t i = 0; i < n; i++) {
                                s += gh[i] * act[i];
                                dpre[i] += ph * gh[i];
                            }
                            gp[h * W + w] += s;
                        }
                        float sc = 0.0f;
                        #pragma omp simd reduction(+:sc)
                        for (int64_t i = 0; i < n; i++) {
                            dpre[i] = pre[i] > 0.0f ? dpre[i] : slope * dpre[i];  /* leaky_relu's backward */
                            sc += dpre[i];
                        }
                        gc[w] += sc;
                        for (int64_t h = 0; h < H; h++) {
                            const float a = fc[w * 2 * H + h], e = fc[w * 2 * H + H + h];
                            const float *xh = xr + h * plane + c0, *bh = br + h * plane + c0;
                            float *dxh = dxa + h * CB, *dbh = dba + h * CB;
                            float sx = 0.0f, sb = 0.0f;
                            #pragma omp simd reduction(+:sx, sb)
                            for (int64_t i = 0; i < n; i++) {
                                sx += dpre[i] * xh[i];
                                sb += dpre[i] * bh[i];
                                dxh[i] += a * dpre[i];
                                dbh[i] += e * dpre[i];
                            }
                            gfc[w * 2 * H + h] += sx;
                            gfc[w * 2 * H + H + h] += sb;
                        }
                    }
                    for (int64_t h = 0; h < H; h++) {
                        memcpy(dxr + h * plane + c0, dxa + h * CB, n * sizeof(float));
                        if (dbr) {
                            float *o = dbr + h * plane + c0;
                            for (int64_t i = 0; i < n; i++) o[i] += dba[h * CB + i];
                        }
                    }
                }
            }
        }
    }
}
"""

_P, _I64, _INT, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
_SIGNATURES = {
    "dape_mlp": [_P] * 8 + [_I64] * 6 + [_F, _INT],
    "dape_mlp_backward": [_P] * 10 + [_I64] * 6 + [_F, _INT],
}


def library() -> Optional[ctypes.CDLL]:
    return native.load("dape", SOURCE, _SIGNATURES)


def usable(x: torch.Tensor, bias: torch.Tensor, *weights: torch.Tensor) -> bool:
    """Whether the kernels take these: float32 logits, bias and weights on the CPU, the library built (a
    warning, once, where it cannot be)."""
    return (all(t.device.type == "cpu" and t.dtype == torch.float32 for t in (x, bias, *weights))
            and native.loaded("dape", SOURCE, _SIGNATURES, "DAPE"))


def row_limits(mask: torch.Tensor) -> torch.Tensor:
    """Per query row of ``mask`` (..., q, k; 0 or -inf), the last key any sequence or head may see plus one
    (int64, (q,)): keys from there on are hidden from the whole row."""
    q, k = mask.shape[-2:]
    seen = torch.isfinite(mask).reshape(-1, q, k).any(0)  # (q, k)
    return (torch.where(seen, torch.arange(k), -1).amax(-1) + 1).to(torch.int64)


class PairMLP(torch.autograd.Function):
    """f of every pair, ``x`` (B, H, q, k) the logits, ``b`` (1 or B, H, q, k) the bias, ``limit`` (q,) int64;
    the weights fc (W, 2H: the logits' columns, then the bias's), c (W,), p (H, W), d (H,); slope the
    LeakyReLU's."""

    @staticmethod
    def forward(ctx, x, b, limit, fc, c, p, d, slope: float):
        x, b = x.contiguous(), b.contiguous()
        fc, c, p, d = (t.detach().contiguous() for t in (fc, c, p, d))
        B, H, q, k = x.shape
        out = torch.empty_like(x)
        library().dape_mlp(_ptr(x), _ptr(b), _ptr(limit, torch.int64), _ptr(fc), _ptr(c), _ptr(p), _ptr(d),
                           _ptr(out), B, b.shape[0], H, q, k, fc.shape[0], slope, torch.get_num_threads())
        ctx.save_for_backward(x, b, limit, fc, c, p)
        ctx.slope = slope
        return out

    @staticmethod
    def backward(ctx, grad):
        x, b, limit, fc, c, p = ctx.saved_tensors
        B, H, q, k = x.shape
        W, threads = fc.shape[0], torch.get_num_threads()
        grad = grad.float().contiguous()
        dx = torch.empty_like(x)
        db = torch.empty_like(b) if ctx.needs_input_grad[1] else None
        partial = torch.empty(threads, 2 * W * H + W + H * W + H, dtype=torch.float64)
        library().dape_mlp_backward(_ptr(grad), _ptr(x), _ptr(b), _ptr(limit, torch.int64), _ptr(fc), _ptr(c),
                                    _ptr(p), _ptr(dx), _ptr(db), _ptr(partial, torch.float64), B, b.shape[0], H, q, k,
                                    W, ctx.slope, threads)
        dfc, dc, dp, dd = partial.sum(0).float().split([2 * W * H, W, H * W, H])
        return dx, db, None, dfc.view(W, 2 * H), dc, dp.view(H, W), dd, None
