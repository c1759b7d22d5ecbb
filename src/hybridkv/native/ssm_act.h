/* Activations shared by the Mamba2 kernels (ssm.c, ssm_prefill.c). */

#ifndef HK_SSM_ACT_H
#define HK_SSM_ACT_H

#include <math.h>

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

#endif
