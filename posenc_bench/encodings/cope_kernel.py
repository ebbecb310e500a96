"""CoPE's per-row work on the CPU in C (``posenc_bench.native``): the gates and counts, the position logits and
softmax, and the backward's element-wise part, each one pass over a row held in cache, where the torch ops of
``CoPEAttention`` take a pass and a fresh (B, H, q, k) tensor per operation. The values are those ops': the same
float32 formulas, counts and the gates' backward summed in double as torch's cumsum does, exp to about 1 ulp
(Cephes' expf), so the two paths agree to float32 rounding (tests/encodings/test_cope.py runs both against
autograd through the definition). Used for float32 on the CPU where a C compiler is found; elsewhere the torch
ops run.
"""

from __future__ import annotations

import ctypes
from typing import Optional

import torch

from posenc_bench import native
from posenc_bench.native import pointer as _ptr

SOURCE = r"""#include <math.h>
#include <stdint.h>
#include <string.h>

/* exp(x) for float32 as Cephes' expf (about 1 ulp): x = m ln 2 + r, |r| <= ln 2 / 2, a degree-6 polynomial
   in r times 2^m. Written without branches so that gcc vectorizes the loops that call it. Inputs below
   -87.3 give 2^-126 (callers zero the masked entries themselves). */
static inline float exp32(float x) {
    x = x < -87.3f ? -87.3f : x;
    x = x > 88.3f ? 88.3f : x;
    float m = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - m * 0.693359375f + m * 2.12194440e-4f;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * r * r + r + 1.0f;
    int32_t bits = ((int32_t)m + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

typedef struct {
    float *x, *g, *p, *P, *dx, *dfixed;
    const float *fixed, *diff, *delta;
    int64_t rows, K, n;
    float last;  /* the largest position, npos - 1 */
} Args;

typedef void (*RowFn)(const Args *, int64_t);

/* gates and counts of row r: g = sigmoid(x) (0 where x = -inf), p = reverse cumsum of g (summed in double, as
   torch's cumsum does), clamped to last */
static void gates_row(const Args *a, int64_t r) {
    const int64_t K = a->K;
    const float *restrict x = a->x + r * K;
    float *restrict g = a->g + r * K, *restrict p = a->p + r * K;
    #pragma omp simd
    for (int64_t j = 0; j < K; j++)
        g[j] = x[j] == -INFINITY ? 0.0f : 1.0f / (1.0f + exp32(-x[j]));
    double acc = 0.0;
    for (int64_t j = K - 1; j >= 0; j--) {
        acc += g[j];
        float c = (float)acc;
        p[j] = c < a->last ? c : a->last;
    }
}

/* row r's logits x + fixed[f] + (p - f) diff[f], f = floor p, then their softmax, written over x */
static void probs_row(const Args *a, int64_t r) {
    float *x = a->x + r * a->K;
    const float *p = a->p + r * a->K, *fixed = a->fixed + r * a->n, *diff = a->diff + r * a->n;
    const float top = (float)(a->n - 1);
    float hi = -INFINITY;
    for (int64_t j = 0; j < a->K; j++) {
        float c = p[j] < top ? p[j] : top;  /* in bounds whatever p holds (NaN included) */
        int64_t f = (int64_t)c;
        float y = x[j] + (fixed[f] + (p[j] - (float)f) * diff[f]);
        x[j] = y;
        hi = y > hi ? y : hi;
    }
    float sum = 0.0f;
    #pragma omp simd reduction(+:sum)
    for (int64_t j = 0; j < a->K; j++) {
        float e = x[j] == -INFINITY ? 0.0f : exp32(x[j] - hi);
        x[j] = e;
        sum += e;
    }
    float inv = 1.0f / sum;
    #pragma omp simd
    for (int64_t j = 0; j < a->K; j++)
        x[j] *= inv;
}

/* row r's backward: dx = dL + cumsum(dL d) g (1 - g), dL = (dPv - delta) P, d = diff[f]; dfixed gets dL (1 - w)
   at f and dL w at f + 1. dPv (dout . v) comes in dx and is overwritten. */
static void backward_row(const Args *a, int64_t r) {
    float *dx = a->dx + r * a->K, *dfixed = a->dfixed + r * a->n;
    const float *P = a->P + r * a->K, *g = a->g + r * a->K, *p = a->p + r * a->K, *diff = a->diff + r * a->n;
    const float delta = a->delta[r], top = (float)(a->n - 1);
    memset(dfixed, 0, a->n * sizeof *dfixed);
    #pragma omp simd
    for (int64_t j = 0; j < a->K; j++)
        dx[j] = (dx[j] - delta) * P[j];
    double acc = 0.0;
    for (int64_t j = 0; j < a->K; j++) {
        float c = p[j] < top ? p[j] : top;
        int64_t f = (int64_t)c;
        float dL = dx[j], w = p[j] - (float)f;
        dfixed[f] += dL - w * dL;
        if (f + 1 < a->n) dfixed[f + 1] += w * dL;
        acc += dL * diff[f];
        dx[j] = dL + (float)acc * (g[j] - g[j] * g[j]);
    }
}

/* rows in parallel on OpenMP's threads: torch's own pool when torch is loaded first (one libgomp.so.1) */
static void run_rows(const Args *a, RowFn fn, int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t r = 0; r < a->rows; r++) fn(a, r);
}

void cope_gates(const float *x, float *g, float *p, int64_t rows, int64_t K, float last, int threads) {
    Args a = {.x = (float *)x, .g = g, .p = p, .rows = rows, .K = K, .last = last};
    run_rows(&a, gates_row, threads);
}

void cope_probs(float *x, const float *p, const float *fixed, const float *diff, int64_t rows, int64_t K,
                int64_t n, int threads) {
    Args a = {.x = x, .p = (float *)p, .fixed = fixed, .diff = diff, .rows = rows, .K = K, .n = n};
    run_rows(&a, probs_row, threads);
}

void cope_backward(float *dx, const float *delta, const float *P, const float *g, const float *p,
                   const float *diff, float *dfixed, int64_t rows, int64_t K, int64_t n, int threads) {
    Args a = {.dx = dx, .delta = delta, .P = (float *)P, .g = (float *)g, .p = (float *)p, .diff = diff,
              .dfixed = dfixed, .rows = rows, .K = K, .n = n};
    run_rows(&a, backward_row, threads);
}
"""

_P, _I64, _INT, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
_SIGNATURES = {
    "cope_gates": [_P, _P, _P, _I64, _I64, _F32, _INT],
    "cope_probs": [_P, _P, _P, _P, _I64, _I64, _I64, _INT],
    "cope_backward": [_P, _P, _P, _P, _P, _P, _P, _I64, _I64, _I64, _INT],
}


def library() -> Optional[ctypes.CDLL]:
    return native.load("cope", SOURCE, _SIGNATURES)


def usable(x: torch.Tensor) -> bool:
    """Whether the kernels take this chunk: float32 logits on the CPU, with the library built (a warning, once,
    where it cannot be)."""
    return x.device.type == "cpu" and x.dtype == torch.float32 and native.loaded("cope", SOURCE, _SIGNATURES, "CoPE")


def gates(x: torch.Tensor, npos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """g = sigmoid(x) (0 where x is -inf) and p_j = sum_{t >= j} g_t clamped to npos - 1, each (..., k)."""
    g, p = torch.empty_like(x), torch.empty_like(x)
    library().cope_gates(_ptr(x), _ptr(g), _ptr(p), x[..., 0].numel(), x.shape[-1], float(npos - 1),
                         torch.get_num_threads())
    return g, p


def probs_(x: torch.Tensor, p: torch.Tensor, fixed: torch.Tensor, diff: torch.Tensor) -> torch.Tensor:
    """softmax(x + fixed[floor p] + (p - floor p) diff[floor p]) over the last dimension, written over x."""
    library().cope_probs(_ptr(x), _ptr(p), _ptr(fixed), _ptr(diff), x[..., 0].numel(), x.shape[-1],
                         fixed.shape[-1], torch.get_num_threads())
    return x


def backward_(dx: torch.Tensor, delta: torch.Tensor, P: torch.Tensor, g: torch.Tensor, p: torch.Tensor,
              diff: torch.Tensor) -> torch.Tensor:
    """From dx = dout . v (..., k), written over with the gradient of the gates' input x, dL + cumsum(dL d)
    g (1 - g) (dL = (dout . v - delta) P, d = diff[floor p]); returns d(fixed) (..., n)."""
    dfixed = torch.empty_like(diff)
    library().cope_backward(_ptr(dx), _ptr(delta), _ptr(P), _ptr(g), _ptr(p), _ptr(diff), _ptr(dfixed),
                            dx[..., 0].numel(), dx.shape[-1], diff.shape[-1], torch.get_num_threads())
    return dfixed
