/* The decode program's row ops at its two ends (runner.c): the embedding row's scaling, the
 * logits' division (Granite's logits_scaling) and the greedy argmax. Each does what the
 * Python step's torch op does, value for value: one IEEE multiply or divide per element
 * (no reciprocal, no contraction), and numpy's argmax (the first index of the maximum; a row
 * holding a NaN reports one: the caller then takes the Python path, which names the row). */

#ifndef HK_RUNNER_ROWS_H
#define HK_RUNNER_ROWS_H

#include <math.h>
#include <stdint.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

static void scale_row(float *x, int64_t n, float s) {
    for (int64_t i = 0; i < n; i++) x[i] = x[i] * s;
}

static void div_row(float *x, int64_t n, float s) {
    for (int64_t i = 0; i < n; i++) x[i] = x[i] / s;
}

/* The row's maximum (the scan's order does not matter: max is exact) and whether it holds a
 * NaN. */
static float row_max(const float *x, int64_t n, int *has_nan) {
    float best = -INFINITY;
    int64_t i = 0;
    int nan = 0;
#if defined(__AVX2__)
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    __m256 u = _mm256_setzero_ps();
    for (; i + 32 <= n; i += 32) {
        const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        const __m256 c = _mm256_loadu_ps(x + i + 16), d = _mm256_loadu_ps(x + i + 24);
        u = _mm256_or_ps(u, _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
        u = _mm256_or_ps(u, _mm256_cmp_ps(c, d, _CMP_UNORD_Q));
        m0 = _mm256_max_ps(m0, a), m1 = _mm256_max_ps(m1, b);
        m2 = _mm256_max_ps(m2, c), m3 = _mm256_max_ps(m3, d);
    }
    nan = _mm256_movemask_ps(u) != 0;
    float lanes[8];
    _mm256_storeu_ps(lanes, _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
    for (int j = 0; j < 8; j++) best = lanes[j] > best ? lanes[j] : best;
#endif
    for (; i < n; i++) {
        nan |= x[i] != x[i];
        best = x[i] > best ? x[i] : best;
    }
    *has_nan = nan;
    return best;
}

static void argmax_row(const float *x, int64_t n, int64_t *index, float *value) {
    int nan = 0;
    const float best = row_max(x, n, &nan);
    int64_t i = 0;
    if (nan) {
        while (x[i] == x[i]) i++;
        *index = i, *value = NAN;
        return;
    }
#if defined(__AVX2__)
    const __m256 b = _mm256_set1_ps(best);
    for (; i + 8 <= n; i += 8) {
        const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), b, _CMP_EQ_OQ));
        if (hit) {
            *index = i + __builtin_ctz((unsigned)hit), *value = best;
            return;
        }
    }
#endif
    while (i < n && x[i] != best) i++;
    *index = i < n ? i : 0, *value = best;
}

#endif
