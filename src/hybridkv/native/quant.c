/* Block-quantized GEMM for decode steps: y[M][N] = x[M][K] W[N][K]^T (+ bias), M small, x and
 * y float32, W in GGUF block layouts (one weight row = K / QK blocks, rows contiguous):
 *   Q8_0 (type 8):  32 values in 34 bytes:  d fp16 | 32 x int8 q;            w = d * q
 *   Q4_K (type 12): 256 values in 144 bytes: d fp16 | dmin fp16 | 12 bytes of 6-bit scale and
 *                   min for 8 sub-blocks of 32 | 128 bytes of nibbles;       w = d*sc*q - dmin*m
 *   Q6_K (type 14): 256 values in 210 bytes: 128 bytes of low nibbles | 64 of high 2-bit pairs |
 *                   16 int8 scales (one per 16 values) | d fp16;             w = d*sc*(q - 32)
 * (Where a byte holds two values and which: ``hybridkv/native/quant_blocks.py``, the reference.)
 *
 * The weight stays quantized in memory. Threads split the N rows in panels of NR; a thread
 * dequantizes its panel (NR rows x K) into a float32 scratch that stays in L2, then multiplies
 * every x row against it in register tiles of MR x NR. Every output is summed in one order
 * whatever M, N, the tile or the thread count: VW lane-wise partial sums along K (explicit
 * fused multiply-adds where the CPU has them), the lanes then added in a fixed pairwise tree,
 * then the bias; so a row alone and the same row in any batch give the same bits, on 1 or 2
 * threads. Dequantizing is the same code for every tile, and hk_quant_dequantize runs it too.
 * Up to MR rows of Q8_0 / Q4_K skip the scratch: the weights are dequantized in registers by
 * the same arithmetic, in the same order along K (quant_fused.h).
 * Callers (hybridkv/native/quant.py) check shapes, strides and dtypes. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) || defined(__FMA__) || defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__)
#define VW 16 /* floats per vector */
#define MR 4  /* x rows per register tile: 16 accumulators + 4 weight vectors + x */
#else
#define VW 8
#define MR 2 /* 16 registers (AVX2): 8 accumulators + 5 */
#endif
#define NR 4                 /* weight rows per panel and tile */
#define PARALLEL_WORK 262144 /* N * K below this: one thread */
#define PF_ROWS (2 * NR)     /* a panel's rows are prefetched while the panel 2 before computes */

enum { Q8_0 = 8, Q4_K = 12, Q6_K = 14 };

typedef float vf __attribute__((vector_size(VW * sizeof(float))));
typedef int8_t vb __attribute__((vector_size(VW)));
typedef uint8_t vu __attribute__((vector_size(VW)));

static inline vf madd(vf a, vf b, vf c) { /* c + a * b, rounded once where the CPU has FMA */
#if VW == 16
    return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__)
    return (vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
    return c + a * b;
#endif
}

static inline vf splat(float s) { return (vf){0} + s; }
static inline vf loadf(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline vu loadu(const uint8_t *p) { vu v; memcpy(&v, p, sizeof v); return v; }
/* bytes to floats, unsigned (tof) and signed (tof_signed). NOTE: not __builtin_convertvector:
 * GCC 12 turns that into one scalar conversion per lane. */
static inline vf tof(vu v) {
#if VW == 16
    __m128i b;
    memcpy(&b, &v, sizeof b);
    return (vf)_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b));
#elif defined(__AVX2__)
    __m128i b = _mm_setzero_si128();
    memcpy(&b, &v, sizeof v);
    return (vf)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
#else
    float f[VW];
    for (int l = 0; l < VW; l++) f[l] = (float)v[l];
    return loadf(f);
#endif
}

static inline vf tof_signed(vb v) {
#if VW == 16
    __m128i b;
    memcpy(&b, &v, sizeof b);
    return (vf)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
#elif defined(__AVX2__)
    __m128i b = _mm_setzero_si128();
    memcpy(&b, &v, sizeof v);
    return (vf)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
#else
    float f[VW];
    for (int l = 0; l < VW; l++) f[l] = (float)v[l];
    return loadf(f);
#endif
}

static inline float half_to_float(const uint8_t *p) { /* IEEE fp16, little-endian, exact */
#if defined(__F16C__)
    uint16_t f16;
    memcpy(&f16, p, sizeof f16);
    return _cvtsh_ss(f16);
#else
    const uint32_t h = (uint32_t)p[0] | (uint32_t)p[1] << 8;
    const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) { /* zero or subnormal: man * 2^-24 is exact in float32 */
        const float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    }
    bits = sign | (exp == 31 ? 0x7f800000u | man << 13 : (exp + 112) << 23 | man << 13);
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
#endif
}

static int64_t block_values(int fmt) { return fmt == Q8_0 ? 32 : 256; }
static int64_t block_bytes(int fmt) { return fmt == Q8_0 ? 34 : fmt == Q4_K ? 144 : 210; }

static void deq_q8_0(const uint8_t *b, float *out) {
    const vf d = splat(half_to_float(b));
    for (int c = 0; c < 32; c += VW) {
        vb q;
        memcpy(&q, b + 2 + c, sizeof q);
        const vf w = tof_signed(q) * d;
        memcpy(out + c, &w, sizeof w);
    }
}

/* A Q4_K block's 8 sub-block scales d * sc[t] and negated mins -(dmin * m[t]). */
static inline void q4_k_scales(const uint8_t *b, float ds[8], float dm[8]) {
    const float d = half_to_float(b), dmin = half_to_float(b + 2);
    const uint8_t *s = b + 4;
    for (int t = 0; t < 8; t++) {
        const int sc = t < 4 ? s[t] & 63 : (s[t + 4] & 15) | (s[t - 4] >> 6) << 4;
        const int mn = t < 4 ? s[t + 4] & 63 : (s[t + 4] >> 4) | (s[t] >> 6) << 4;
        ds[t] = d * (float)sc;
        dm[t] = -(dmin * (float)mn);
    }
}

static void deq_q4_k(const uint8_t *b, float *out) {
    const uint8_t *qs = b + 16;
    float sc[8], mn[8];
    q4_k_scales(b, sc, mn);
    for (int j = 0; j < 4; j++) { /* 64 values: sub-block 2j low nibbles, 2j+1 high ones */
        const vf ds[2] = {splat(sc[2 * j]), splat(sc[2 * j + 1])};
        const vf dm[2] = {splat(mn[2 * j]), splat(mn[2 * j + 1])};
        for (int c = 0; c < 32; c += VW) {
            const vu q = loadu(qs + 32 * j + c);
            const vf lo = madd(tof(q & 15), ds[0], dm[0]), hi = madd(tof(q >> 4), ds[1], dm[1]);
            memcpy(out + 64 * j + c, &lo, sizeof lo);
            memcpy(out + 64 * j + 32 + c, &hi, sizeof hi);
        }
    }
}

static void deq_q6_k(const uint8_t *b, float *out) {
    const float d = half_to_float(b + 208);
    const int8_t *sc = (const int8_t *)(b + 192);
    for (int h = 0; h < 2; h++) { /* 128 values from ql[64 h ..], qh[32 h ..] */
        const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
        float *o = out + 128 * h;
        for (int c = 0; c < 32; c += VW) {
            const vu l0 = loadu(ql + c), l1 = loadu(ql + 32 + c), hb = loadu(qh + c);
            const vu q[4] = {(l0 & 15) | (hb & 3) << 4, (l1 & 15) | (hb >> 2 & 3) << 4,
                             (l0 >> 4) | (hb >> 4 & 3) << 4, (l1 >> 4) | (hb >> 6) << 4};
            for (int r = 0; r < 4; r++) { /* values 32 r + c ..: scale (128 h + 32 r + c) / 16 */
                const int v = 32 * r + c;
                const vf w = (tof(q[r]) - 32.0f) * splat(d * (float)sc[(128 * h + v) / 16]);
                memcpy(o + v, &w, sizeof w);
            }
        }
    }
}

#if VW < 16
_Static_assert(16 % VW == 0, "a Q6_K scale covers whole vectors");
#endif

/* One row of K values into out; meanwhile the row at pf (the same row of a later panel, or
 * NULL) is prefetched into L2 a block at a time: memory streams it while this one computes. */
static void dequantize_row(int fmt, const uint8_t *row, int64_t K, float *out,
                           const uint8_t *pf) {
    const int64_t qk = block_values(fmt), bytes = block_bytes(fmt);
    for (int64_t k = 0; k < K; k += qk, row += bytes, out += qk) {
        if (pf) {
            for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(pf + o, 0, 2);
            pf += bytes;
        }
        if (fmt == Q8_0) deq_q8_0(row, out);
        else if (fmt == Q4_K) deq_q4_k(row, out);
        else deq_q6_k(row, out);
    }
}

#include "tile_sums.h"

#include "quant_fused.h"

/* y[i][j] = x_i . p_j (+ bias[j]) for i < mr, j < nr (constants once inlined); p: the panel,
 * nr rows of K floats. */
static inline __attribute__((always_inline)) void tile(const float *x, int64_t ldx,
                                                       const float *p, int64_t K,
                                                       const float *bias, float *y, int64_t ldy,
                                                       const int mr, const int nr) {
    vf acc[MR * NR];
    for (int t = 0; t < MR * NR; t++) acc[t] = (vf){0};
    for (int64_t k = 0; k < K; k += VW) {
        vf wv[NR];
        for (int j = 0; j < nr; j++) wv[j] = loadf(p + j * K + k);
        for (int i = 0; i < mr; i++) {
            const vf xv = loadf(x + i * ldx + k);
            for (int j = 0; j < nr; j++) acc[i * NR + j] = madd(xv, wv[j], acc[i * NR + j]);
        }
    }
    store_sums(acc, bias, y, ldy, mr, nr);
}

/* Every x row against panel rows [0, nr) (y: their first output column). */
static inline __attribute__((always_inline)) void rows(const float *x, int64_t M, int64_t ldx,
                                                       const float *p, int64_t K,
                                                       const float *b, float *y, int64_t ldy,
                                                       const int nr) {
    int64_t m = 0;
    for (; m + MR <= M; m += MR) tile(x + m * ldx, ldx, p, K, b, y + m * ldy, ldy, MR, nr);
    const float *xm = x + m * ldx;
    float *ym = y + m * ldy;
    switch (M - m) {
    case 1: tile(xm, ldx, p, K, b, ym, ldy, 1, nr); break;
    case 2: if (MR > 2) tile(xm, ldx, p, K, b, ym, ldy, 2, nr); break;
    case 3: if (MR > 3) tile(xm, ldx, p, K, b, ym, ldy, 3, nr); break;
    default: break;
    }
}

/* x: rows of K floats at x + m * ldx; W: N rows of K / QK blocks; bias: [N] or NULL; y: [M][N]
 * contiguous. threads: the OpenMP team size. Returns 0, or -1 if scratch could not be had. */
int hk_quant_gemm(int fmt, const float *x, int64_t M, int64_t ldx, const uint8_t *W, int64_t N,
                  int64_t K, const float *bias, float *y, int threads) {
    const int64_t panels = (N + NR - 1) / NR, row_bytes = K / block_values(fmt) * block_bytes(fmt);
    int failed = 0;
#pragma omp parallel num_threads(threads) if (threads > 1 && N * K >= PARALLEL_WORK)
    {
        float *panel = aligned_alloc(64, (size_t)(NR * K) * sizeof(float));
        if (!panel) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t pi = 0; pi < panels; pi++) {
            const int64_t n = pi * NR, nr = N - n < NR ? N - n : NR;
            const float *b = bias ? bias + n : NULL;
            const uint8_t *pf = n + PF_ROWS < N ? W + (n + PF_ROWS) * row_bytes : NULL;
            if (fused(fmt, x, M, ldx, W + n * row_bytes, row_bytes, K, b, y + n, N, nr, pf))
                continue;
            if (!panel) continue;
            for (int64_t j = 0; j < nr; j++)
                dequantize_row(fmt, W + (n + j) * row_bytes, K, panel + j * K,
                               n + PF_ROWS + j < N ? W + (n + PF_ROWS + j) * row_bytes : NULL);
            if (nr == NR) {
                rows(x, M, ldx, panel, K, b, y + n, N, NR);
            } else {
                for (int64_t j = 0; j < nr; j++)
                    rows(x, M, ldx, panel + j * K, K, b ? b + j : NULL, y + n + j, N, 1);
            }
        }
        free(panel);
    }
    return failed ? -1 : 0;
}

/* out[N][K] = the float32 values of W's N rows (the panels' own code), rows split over threads. */
void hk_quant_dequantize(int fmt, const uint8_t *W, int64_t N, int64_t K, float *out,
                         int threads) {
    const int64_t row_bytes = K / block_values(fmt) * block_bytes(fmt);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && N * K >= PARALLEL_WORK)
    for (int64_t n = 0; n < N; n++)
        dequantize_row(fmt, W + n * row_bytes, K, out + n * K,
                       n + 1 < N ? W + (n + 1) * row_bytes : NULL);
}

#include "quant_int8.h"
