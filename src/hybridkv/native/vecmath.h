/* Vectorizable float math shared by the kernels (included; the library's cache key covers
 * the headers of this directory, hybridkv/native/__init__.py). */

#ifndef HK_VECMATH_H
#define HK_VECMATH_H

#include <stdint.h>

/* exp(x) for x <= 0 (and NaN), vectorizable: 2^n * p(r), |r| <= ln2 / 2, relative error
 * ~1e-7; below -87 it returns ~1e-38 instead of a denormal or 0. */
#pragma omp declare simd
static inline float exp_le0(float x) {
    x = x < -87.0f ? -87.0f : x;
    const float round = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float n = (x * 1.44269504f + round) - round;
    float r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
    float p = 1.0f / 720;
    p = 1.0f / 120 + r * p;
    p = 1.0f / 24 + r * p;
    p = 1.0f / 6 + r * p;
    p = 0.5f + r * p;
    p = 1.0f + r * (1.0f + r * p);
    union {
        int32_t i;
        float f;
    } two_n = {.i = ((int32_t)n + 127) << 23};
    return p * two_n.f;
}

#endif
