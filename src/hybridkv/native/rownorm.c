/* Row-wise kernels of the decoder layers, float32: RMS norm with an optional fused residual
 * add, and rotary embedding in place. Callers (hybridkv/native/rownorm.py) check shapes,
 * strides, dtypes and table bounds; the torch code in model/layers/ is the reference.
 *
 * A "row" is one head-sized vector: x holds [tokens][heads][dim] with token t's first element
 * at x + t * token_stride and head h's at + h * dim. */

#include <math.h>
#include <stdint.h>

#include "vecmath.h"

#define PARALLEL_ELEMENTS 65536 /* less is not worth waking threads */

/* For every row r = (t, h): if residual: residual[r] += x[r], and the sum is normalised;
 * out[r] = (v * 1 / sqrt(mean(v * v) + eps)) * scale[r % scale_rows]  (residual, out:
 * contiguous [tokens * heads][dim]; out may be residual or, with token_stride = heads * dim,
 * x itself). x_scale != 1 (with residual only): x[r] *= x_scale first, in place (x is then
 * the caller's own scratch), rounded and stored before the add -- the bits of a separate
 * multiply then add (two loops: the product is not fused into the sum). */
void hk_rms_norm(const float *x, int64_t tokens, int64_t heads, int64_t dim,
                 int64_t token_stride, float *residual, const float *scale, int64_t scale_rows,
                 float *out, float eps, float x_scale) {
    const int64_t rows = tokens * heads;
#pragma omp parallel for schedule(static) if (rows * dim > PARALLEL_ELEMENTS)
    for (int64_t r = 0; r < rows; r++) {
        const float *v = x + (r / heads) * token_stride + (r % heads) * dim;
        if (residual && x_scale != 1.0f) {
            float *xs = (float *)v;
#pragma omp simd
            for (int64_t i = 0; i < dim; i++) xs[i] = xs[i] * x_scale;
        }
        if (residual) {
            float *res = residual + r * dim;
#pragma omp simd
            for (int64_t i = 0; i < dim; i++) res[i] += v[i];
            v = res;
        }
        float total = 0.0f;
#pragma omp simd reduction(+ : total)
        for (int64_t i = 0; i < dim; i++) total += v[i] * v[i];
        const float inv = 1.0f / sqrtf(total / (float)dim + eps);
        const float *w = scale + (r % scale_rows) * dim;
        float *o = out + r * dim;
#pragma omp simd
        for (int64_t i = 0; i < dim; i++) o[i] = (v[i] * inv) * w[i];
    }
}

/* Rotate one row's first 2 * half elements in place (rotate-half form, the sign folded
 * into signed_sin). */
static inline void rotate_row(float *v, const float *c, const float *s, int64_t half) {
#pragma omp simd
    for (int64_t i = 0; i < half; i++) {
        const float a = v[i], b = v[i + half];
        v[i] = a * c[i] + b * s[i];
        v[i + half] = b * c[i + half] + a * s[i + half];
    }
}

/* Rotate the first `rot` elements of every row of x in place by its token's position:
 * with half = rot / 2, c = cos + pos[t] * rot, s = signed_sin + pos[t] * rot (first half of
 * each sin row negated), x[i] = x[i] c[i] + x[i + half] s[i] and
 * x[i + half] = x[i + half] c[i + half] + x[i] s[i + half], for i < half. */
void hk_rope(float *x, int64_t tokens, int64_t heads, int64_t dim, int64_t token_stride,
             const float *cos, const float *signed_sin, int64_t rot, const int64_t *pos) {
    const int64_t rows = tokens * heads, half = rot / 2;
#pragma omp parallel for schedule(static) if (rows * rot > PARALLEL_ELEMENTS)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t t = r / heads;
        float *v = x + t * token_stride + (r % heads) * dim;
        rotate_row(v, cos + pos[t] * rot, signed_sin + pos[t] * rot, half);
    }
}

/* hk_rms_norm then hk_rope, in one pass over x (in place): every row r normalised and
 * scaled by scale[r % scale_rows], then its first `rot` elements rotated by its token's
 * position (the same arithmetic as the two calls, in the same order). */
void hk_rms_norm_rope(float *x, int64_t tokens, int64_t heads, int64_t dim,
                      int64_t token_stride, const float *scale, int64_t scale_rows, float eps,
                      const float *cos, const float *signed_sin, int64_t rot,
                      const int64_t *pos) {
    const int64_t rows = tokens * heads, half = rot / 2;
#pragma omp parallel for schedule(static) if (rows * dim > PARALLEL_ELEMENTS)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t t = r / heads;
        float *v = x + t * token_stride + (r % heads) * dim;
        float total = 0.0f;
#pragma omp simd reduction(+ : total)
        for (int64_t i = 0; i < dim; i++) total += v[i] * v[i];
        const float inv = 1.0f / sqrtf(total / (float)dim + eps);
        const float *w = scale + (r % scale_rows) * dim;
#pragma omp simd
        for (int64_t i = 0; i < dim; i++) v[i] = (v[i] * inv) * w[i];
        rotate_row(v, cos + pos[t] * rot, signed_sin + pos[t] * rot, half);
    }
}

/* sigmoid(x) from e = exp(-|x|) <= 1 (no overflow): 1 / (1 + e) for x >= 0, e / (1 + e) below. */
#pragma omp declare simd
static inline float sigmoid(float x) {
    const float e = exp_le0(x < 0.0f ? x : -x);
    return (x < 0.0f ? e : 1.0f) / (1.0f + e);
}

/* out[t][i] = act(gu[t][i]) * gu[t][inner + i] (gate and up halves side by side, rows of
 * gu_stride elements); act 0: silu x sigmoid(x), 1: gelu's tanh form
 * 0.5 x (1 + tanh(y)), y = sqrt(2 / pi) (x + 0.044715 x^3), with 1 + tanh(y) = 2 sigmoid(2y).
 * exp through exp_le0 (relative error ~1e-7), so both vectorize. out: contiguous
 * [tokens][inner]. */
void hk_act_mul(const float *gu, int64_t tokens, int64_t inner, int64_t gu_stride, int64_t act,
                float *out) {
#pragma omp parallel for schedule(static) if (tokens * inner > PARALLEL_ELEMENTS)
    for (int64_t t = 0; t < tokens; t++) {
        const float *g = gu + t * gu_stride, *u = g + inner;
        float *o = out + t * inner;
        if (act == 0) {
#pragma omp simd
            for (int64_t i = 0; i < inner; i++) o[i] = g[i] * sigmoid(g[i]) * u[i];
        } else {
            const float k2 = 2.0f * 0.7978845608028654f; /* 2 sqrt(2 / pi) */
#pragma omp simd
            for (int64_t i = 0; i < inner; i++) {
                const float x = g[i];
                o[i] = x * sigmoid(k2 * (x + 0.044715f * x * x * x)) * u[i];
            }
        }
    }
}
