/* Activations shared by the Mamba2 kernels (ssm.c, ssm_prefill.c). */

#ifndef HK_SSM_ACT_H
#define HK_SSM_ACT_H

#include <math.h>
#include <stdint.h>

#include "vecmath.h"

#pragma omp declare simd
static inline float silu(float v) {
    const float e = exp_le0(-fabsf(v)); /* exp(-|v|) in (0, 1] */
    const float sig = v >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
    return v * sig;
}

/* torch's softplus (beta 1, threshold 20), then clamp to [lo, hi]; NaN passes through. */
static inline float softplus_clamp(float v, float lo, float hi) {
    const float s = v > 20.0f ? v : log1pf(expf(v));
    return s < lo ? lo : (s > hi ? hi : s);
}

/* One token of the Mamba2 output norm (model/layers/norm.py GatedRMSNorm): with gate_first,
 * v = y * silu(gate) RMS-normalised per group of dim / groups channels, times weight; else y
 * normalised per group, times weight, times silu(gate). o may be y itself. */
static inline void gated_norm_row(const float *yv, const float *gv, const float *weight,
                                  float *o, int64_t dim, int64_t groups, float eps,
                                  int gate_first) {
    const int64_t width = dim / groups;
#pragma omp simd
    for (int64_t i = 0; i < dim; i++) o[i] = gate_first ? yv[i] * silu(gv[i]) : yv[i];
    for (int64_t g0 = 0; g0 < dim; g0 += width) {
        float total = 0.0f;
#pragma omp simd reduction(+ : total)
        for (int64_t i = g0; i < g0 + width; i++) total += o[i] * o[i];
        const float inv = 1.0f / sqrtf(total / (float)width + eps);
        if (gate_first) {
#pragma omp simd
            for (int64_t i = g0; i < g0 + width; i++) o[i] = weight[i] * (o[i] * inv);
        } else {
#pragma omp simd
            for (int64_t i = g0; i < g0 + width; i++)
                o[i] = weight[i] * (o[i] * inv) * silu(gv[i]);
        }
    }
}

#endif
