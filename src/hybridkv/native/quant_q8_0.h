/* Q8_0 weights by int8 activations, per weight row (hk_quant_gemm_i8, quant_int8.h).
 *
 * A block's product with an x row is kept as 8 int32 lane sums, lane l the 4 values 4l..4l+3
 * (the lanes vpmaddwd and vpdpbusd give): |q| as unsigned bytes by x with q's sign moved to it
 * (vpmaddubsw; pair sums at most 2*128*127 < 32767, nothing saturates), then pairs of int16
 * added (vpmaddwd by 1) or the four products at once (vpdpbusd). Each lane becomes float and
 * is multiply-added by (d dx) into that lane's running float sum, rounded once (FMA); the 8
 * lanes are added once, at the row's end, in a fixed tree (sum8):
 *     acc[l] = fma(d * dx, sum_{u<4} q[4l+u] xq[4l+u], acc[l])  for every block, in order
 *     y      = ((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) + (acc3 + acc7))
 * The scalar build does exactly this lane by lane (fmaf, correctly rounded without FMA), so
 * every variant gives the same bits. No horizontal sum per block (the float-only kernel's and
 * the earlier per-block int32 total's cost). Up to Q8_NJ weight rows are read interleaved: their
 * chains are independent and each (weight row, x row) sum does the same operations whatever
 * the number of rows beside it. Included by quant_int8.h only. */

#define Q8_NJ 1 /* weight rows per pass when x has at most 2 rows */

static inline float q8_lanes_sum(const float a[8]) { /* sum8's tree */
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

#if I8_SIMD
/* the 8 lane sums of a block (|q| = aq, q) with 32 x bytes, as floats (exact: < 2^24) */
static inline __m256 q8_0_lanes(__m256i aq, __m256i q, const int8_t *x) {
    const __m256i sx = _mm256_sign_epi8(load32(x), q);
#if defined(I8_VNNI)
    return _mm256_cvtepi32_ps(DPBUSD(_mm256_setzero_si256(), aq, sx));
#else
    const __m256i pairs = _mm256_maddubs_epi16(aq, sx);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
#endif
}

/* acc[i] = weight row w . x row i, i < mi */
static inline __attribute__((always_inline)) void q8_row(const uint8_t *w, const XRows *xr,
                                                         const int mi, float *acc) {
    __m256 a[I8_MR];
    for (int i = 0; i < mi; i++) a[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < xr->nd; b++) {
        const uint8_t *blk = w + 34 * b;
        __builtin_prefetch(blk + I8_PF_BYTES, 0, 2); /* may pass W's end: no fault */
        const __m256i q = load32(blk + 2), aq = _mm256_abs_epi8(q);
        const float d = half_to_float(blk);
        for (int i = 0; i < mi; i++) {
            const __m256 s = _mm256_set1_ps(d * xr->d[i * xr->nd + b]);
            a[i] = _mm256_fmadd_ps(q8_0_lanes(aq, q, xr->q + i * xr->K + 32 * b), s, a[i]);
        }
    }
    for (int i = 0; i < mi; i++) acc[i] = sum8(a[i]);
}
#else
/* the scalar reference of the same sums, lane by lane */
static void q8_row(const uint8_t *w, const XRows *xr, const int mi, float *acc) {
    for (int i = 0; i < mi; i++) {
        float a[8] = {0};
        const int8_t *x = xr->q + i * xr->K;
        for (int64_t b = 0; b < xr->nd; b++) {
            const int8_t *q = (const int8_t *)(w + 34 * b + 2), *xb = x + 32 * b;
            const float s = half_to_float(w + 34 * b) * xr->d[i * xr->nd + b];
            for (int l = 0; l < 8; l++) {
                int32_t t = 0;
                for (int u = 4 * l; u < 4 * l + 4; u++) t += q[u] * xb[u];
                a[l] = fmaf(s, (float)t, a[l]);
            }
        }
        acc[i] = q8_lanes_sum(a);
    }
}
#endif
