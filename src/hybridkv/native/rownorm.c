/* Row-wise kernels of the decoder layers, float32: RMS norm with an optional fused residual
 * add, and rotary embedding in place. Callers (hybridkv/native/rownorm.py) check shapes,
 * strides, dtypes and table bounds; the torch code in model/layers/ is the reference.
 *
 * A "row" is one head-sized vector: x holds [tokens][heads][dim] with token t's first element
 * at x + t * token_stride and head h's at + h * dim. */

#include <math.h>
#include <stdint.h>

#define PARALLEL_ELEMENTS 65536 /* less is not worth waking threads */

/* For every row r = (t, h): if residual: residual[r] += x[r], and the sum is normalised;
 * out[r] = (v * 1 / sqrt(mean(v * v) + eps)) * scale[r % scale_rows]  (residual, out:
 * contiguous [tokens * heads][dim]; out may be residual or, with token_stride = heads * dim,
 * x itself). */
void hk_rms_norm(const float *x, int64_t tokens, int64_t heads, int64_t dim,
                 int64_t token_stride, float *residual, const float *scale, int64_t scale_rows,
                 float *out, float eps) {
    const int64_t rows = tokens * heads;
#pragma omp parallel for schedule(static) if (rows * dim > PARALLEL_ELEMENTS)
    for (int64_t r = 0; r < rows; r++) {
        const float *v = x + (r / heads) * token_stride + (r % heads) * dim;
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
        const float *c = cos + pos[t] * rot, *s = signed_sin + pos[t] * rot;
#pragma omp simd
        for (int64_t i = 0; i < half; i++) {
            const float a = v[i], b = v[i + half];
            v[i] = a * c[i] + b * s[i];
            v[i + half] = b * c[i + half] + a * s[i + half];
        }
    }
}
