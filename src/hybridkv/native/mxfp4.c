/* MXFP4 GEMM for decode steps: y[M][N] = x[M][K] W[N][K]^T (+ bias), M small, x and y float32,
 * W in the OCP MX FP4 layout gpt-oss checkpoints store (kept as the file has it):
 *   blocks [N][K / 32][16] uint8: 32 e2m1 values a block, value 2i in byte i's low nibble,
 *                                 value 2i + 1 in its high nibble;
 *   scales [N][K / 32] uint8:     e8m0 exponents, w = e2m1 * 2^(scale - 127).
 * e2m1 codes 0..7 are +{0, 0.5, 1, 1.5, 2, 3, 4, 6}, 8..15 the same negated; doubled they are
 * small integers, so every weight is exactly code2 * 2^(scale - 128) in float32.
 *
 * The product runs in *nibble order*: within a block, the 16 low nibbles (values 0, 2, .., 30)
 * then the 16 high ones (1, 3, .., 31). The x rows are permuted to that order once per call
 * (xp), so a block decodes without interleaving: AVX-512 widens its 16 bytes to 16 lanes once
 * and looks both nibbles up in the block's scaled 16-value table (vpermps reads an index's low
 * 4 bits); AVX2 looks the doubled codes up as int8 (pshufb) and widens them.
 *
 * Threads split the N rows in panels of NR. Up to MR x rows multiply a panel a block at a time,
 * dequantized in registers; more rows dequantize the panel into an L2-resident scratch once and
 * multiply every x row against it. Both sum every output in one order: VW lane-wise partial
 * sums along the nibble-ordered K (fused multiply-adds where the CPU has them), the lanes added
 * in a fixed pairwise tree, then the bias; so a row alone and the same row in any batch give the
 * same bits, on 1 or 2 threads. hk_mxfp4_dequantize writes values in the natural order.
 * Callers (hybridkv/native/mxfp4.py) check shapes, dtypes and that every scale is <= 252. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) || defined(__FMA__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__)
#define VW 16 /* floats per vector */
#define MR 4  /* x rows per register tile */
#else
#define VW 8
#define MR 2
#endif
#define NR 4             /* weight rows per panel */
#define PF_ROWS (2 * NR) /* a panel's blocks are prefetched while the panel 2 before computes */
#define QK 32
#define QB 16
#define PARALLEL_WORK 262144 /* N * K below this: one thread */

typedef float vf __attribute__((vector_size(VW * sizeof(float))));

static const int8_t LUT2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
static const float LUT2F[16] = {0, 1, 2, 3, 4, 6, 8, 12, -0.0f, -1, -2, -3, -4, -6, -8, -12};

static inline vf fma_v(vf a, vf b, vf c) { /* c + a * b, rounded once where the CPU has FMA */
#if VW == 16
    return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__)
    return (vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
    return c + a * b;
#endif
}

static inline vf load_v(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }

/* 2^(e - 128), exact: a normal float from e = 2, the subnormals 2^-127 and 2^-128 below. */
static inline float half_scale(uint8_t e) {
    const uint32_t bits = e >= 2 ? (uint32_t)(e - 1) << 23 : 0x00400000u >> (1 - e);
    float s;
    memcpy(&s, &bits, sizeof s);
    return s;
}

/* One block's 32 values in nibble order (low nibbles, then high ones) as QK / VW vectors. */
static inline __attribute__((always_inline)) void deq_vecs(const uint8_t *b, uint8_t e,
                                                           vf out[QK / VW]) {
#if VW == 16 /* the table times 2^(e - 128), exact (vscalefps) */
    const __m512 table = _mm512_scalef_ps(_mm512_loadu_ps(LUT2F), _mm512_set1_ps((float)e - 128));
    const __m512i lanes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)b));
    out[0] = (vf)_mm512_permutexvar_ps(lanes, table); /* vpermps: the index's low 4 bits */
    out[1] = (vf)_mm512_permutexvar_ps(_mm512_srli_epi32(lanes, 4), table);
#elif defined(__AVX2__)
    const float s = half_scale(e);
    const __m128i lut = _mm_loadu_si128((const __m128i *)LUT2), low = _mm_set1_epi8(15);
    const __m128i q = _mm_loadu_si128((const __m128i *)b);
    const __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(q, low));
    const __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(q, 4), low));
    const __m256 sv = _mm256_set1_ps(s);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int p = 0; p < 4; p++)
        out[p] = (vf)_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[p])), sv);
#else
    const float s = half_scale(e);
    float f[QK];
    for (int i = 0; i < QB; i++) {
        f[i] = (float)LUT2[b[i] & 15] * s;
        f[QB + i] = (float)LUT2[b[i] >> 4] * s;
    }
    for (int c = 0; c < QK / VW; c++) out[c] = load_v(f + c * VW);
#endif
}

static void deq_row(const uint8_t *blocks, const uint8_t *scales, int64_t K, float *out) {
    for (int64_t g = 0; g < K / QK; g++) {
        vf v[QK / VW];
        deq_vecs(blocks + g * QB, scales[g], v);
        memcpy(out + g * QK, v, sizeof v);
    }
}

/* out: x's M rows (ldx apart) in nibble order, K floats a row. */
static void permute_x(const float *x, int64_t M, int64_t ldx, int64_t K, float *out) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k += QK)
            for (int i = 0; i < QB; i++) {
                out[m * K + k + i] = x[m * ldx + k + 2 * i];
                out[m * K + k + QB + i] = x[m * ldx + k + 2 * i + 1];
            }
}

#include "tile_sums.h"

/* acc[i][j] += x_i[k0 .. k0 + QK) . w_j[0 .. QK) for i < mr, j < NR; w rows ldw floats apart. */
static inline __attribute__((always_inline)) void fma_block(vf *acc, const float *x, int64_t ldx,
                                                            const float *w, int64_t ldw,
                                                            const int mr) {
    for (int c = 0; c < QK; c += VW) {
        vf wv[NR];
        for (int j = 0; j < NR; j++) wv[j] = load_v(w + j * ldw + c);
        for (int i = 0; i < mr; i++) {
            const vf xv = load_v(x + i * ldx + c);
            for (int j = 0; j < NR; j++) acc[i * NR + j] = fma_v(xv, wv[j], acc[i * NR + j]);
        }
    }
}

/* mr <= MR x rows (nibble order, K apart) against NR weight rows, each block dequantized in
 * registers just before use (the panel path's values and order). pf: the rows PF_ROWS on. */
static inline __attribute__((always_inline)) void tile_fused(
    const float *x, const uint8_t *blocks, const uint8_t *scales, int64_t K, const float *bias,
    float *y, int64_t ldy, const int mr, const uint8_t *pf) {
    const int64_t groups = K / QK;
    vf acc[MR * NR];
    for (int t = 0; t < MR * NR; t++) acc[t] = (vf){0};
    for (int64_t g = 0; g < groups; g++) {
        vf wv[NR][QK / VW];
        for (int j = 0; j < NR; j++) {
            if (pf && g % 4 == 0) __builtin_prefetch(pf + (j * groups + g) * QB, 0, 2);
            deq_vecs(blocks + (j * groups + g) * QB, scales[j * groups + g], wv[j]);
        }
        for (int c = 0; c < QK / VW; c++)
            for (int i = 0; i < mr; i++) {
                const vf xv = load_v(x + i * K + g * QK + c * VW);
                for (int j = 0; j < NR; j++) acc[i * NR + j] = fma_v(xv, wv[j][c], acc[i * NR + j]);
            }
    }
    store_sums(acc, bias, y, ldy, mr, NR);
}

/* mr <= MR x rows (K apart) against nr <= NR rows of a dequantized panel (rows K apart). */
static inline __attribute__((always_inline)) void tile_panel(const float *x, const float *p,
                                                             int64_t K, const float *bias,
                                                             float *y, int64_t ldy,
                                                             const int mr, const int nr) {
    vf acc[MR * NR];
    float pad[NR * QK];
    for (int t = 0; t < MR * NR; t++) acc[t] = (vf){0};
    memset(pad, 0, sizeof pad);
    for (int64_t k = 0; k < K; k += QK) {
        const float *w = p + k;
        int64_t ldw = K;
        if (nr < NR) { /* the last panel: its missing rows read zeros */
            for (int j = 0; j < nr; j++) memcpy(pad + j * QK, p + j * K + k, QK * sizeof(float));
            w = pad, ldw = QK;
        }
        fma_block(acc, x + k, K, w, ldw, mr);
    }
    store_sums(acc, bias, y, ldy, mr, nr);
}

#define FUSED(MRC) tile_fused(x + m * K, bl, sc, K, b, y + m * ldy, ldy, MRC, pf)
#define PANEL(MRC) tile_panel(x + m * K, panel, K, b, y + m * ldy, ldy, MRC, nr)

/* One panel of nr rows (blocks bl, scales sc) against all M x rows (nibble order, K apart).
 * panel: NR x K scratch. */
static void panel_rows(const float *x, int64_t M, const uint8_t *bl, const uint8_t *sc,
                       int64_t K, const float *b, float *y, int64_t ldy, int64_t nr,
                       float *panel, const uint8_t *pf) {
    int64_t m = 0;
    if (nr == NR && M <= MR) {
        if (M == 1) FUSED(1);
        else if (M == 2) FUSED(2);
#if MR > 2
        else if (M == 3) FUSED(3);
        else FUSED(4);
#endif
        return;
    }
    for (int64_t j = 0; j < nr; j++) deq_row(bl + j * (K / 2), sc + j * (K / QK), K, panel + j * K);
    for (; m + MR <= M; m += MR) PANEL(MR);
    for (; m < M; m++) PANEL(1);
}

/* x: rows of K floats at x + m * ldx; blocks / scales: N rows of K / 32 blocks; bias: [N] or
 * NULL; y: [M][N] contiguous. threads: the OpenMP team size. 0, or -1 without scratch memory. */
int hk_mxfp4_gemm(const float *x, int64_t M, int64_t ldx, const uint8_t *blocks,
                  const uint8_t *scales, int64_t N, int64_t K, const float *bias, float *y,
                  int threads) {
    const int64_t panels = (N + NR - 1) / NR;
    float *xp = aligned_alloc(64, (size_t)((M * K * sizeof(float) + 63) / 64 * 64));
    if (!xp) return -1;
    permute_x(x, M, ldx, K, xp);
    int failed = 0;
#pragma omp parallel num_threads(threads) if (threads > 1 && N * K >= PARALLEL_WORK)
    {
        const int need_panel = M > MR || N % NR;
        float *panel = need_panel ? aligned_alloc(64, (size_t)(NR * K) * sizeof(float)) : NULL;
        if (need_panel && !panel) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t pi = 0; pi < panels; pi++) {
            const int64_t n = pi * NR, nr = N - n < NR ? N - n : NR;
            if (!panel && (M > MR || nr < NR)) continue;
            const uint8_t *pf = n + PF_ROWS + NR <= N ? blocks + (n + PF_ROWS) * (K / 2) : NULL;
            panel_rows(xp, M, blocks + n * (K / 2), scales + n * (K / QK), K,
                       bias ? bias + n : NULL, y + n, N, nr, panel, pf);
        }
        free(panel);
    }
    free(xp);
    return failed ? -1 : 0;
}

/* out[N][K] = the float32 values of the N rows in the natural order, rows split over threads. */
void hk_mxfp4_dequantize(const uint8_t *blocks, const uint8_t *scales, int64_t N, int64_t K,
                         float *out, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && N * K >= PARALLEL_WORK)
    for (int64_t n = 0; n < N; n++) {
        float *row = out + n * K;
        deq_row(blocks + n * (K / 2), scales + n * (K / QK), K, row);
        for (int64_t k = 0; k < K; k += QK) { /* nibble order back to the natural one */
            float t[QK];
            memcpy(t, row + k, sizeof t);
            for (int i = 0; i < QB; i++) row[k + 2 * i] = t[i], row[k + 2 * i + 1] = t[QB + i];
        }
    }
}
