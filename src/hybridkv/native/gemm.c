/* Skinny float32 GEMM for decode steps: y[M][N] = x[M][K] W[N][K]^T (+ bias), M small.
 * W is read in its own row-major [N][K] layout (no packed copy), once per call: threads split
 * the N rows (contiguous ranges, static schedule), and while a tile of NR weight rows stays
 * in cache every tile of MR x rows is multiplied against it. Callers (hybridkv/native/gemm.py)
 * check shapes, strides and dtypes.
 *
 * Every output is summed in the same order whatever M, N, the tile it falls in or the thread
 * count: VW lane-wise partial sums along K (the tail, K % VW, zero-padded into one more
 * vector), then the lanes folded in halves (8+8, 4+4, 2+2, 1+1 for VW = 16), then the bias.
 * So results are bitwise the same on 1 or 2 threads and for a row alone or in any batch.
 *
 * NOTE: each partial sum is an explicit fused multiply-add (madd), never left to the
 * compiler's contraction: GCC's Zen tuning declines to fuse some multiply-add chains, and did
 * so in one tile shape but not another, so a row alone and the same row in a batch rounded
 * differently on AVX2 machines (issue 25). Without FMA (the scalar build) every product is
 * rounded, then added, in every tile alike. */

#include <stdint.h>
#include <string.h>
#if defined(__FMA__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__)
#define VW 16 /* floats per vector */
#define MR 4  /* x rows per tile: MR * NR accumulators + NR + 1 vectors in 32 registers */
#define FOLD_LO8 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define FOLD_HI8 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define FOLD_LO4 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27
#define FOLD_HI4 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31
#define FOLD_LO2 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29
#define FOLD_HI2 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31
#define FOLD_LO1 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30
#define FOLD_HI1 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31
#else
#define VW 8
#define MR 2 /* 16 registers (AVX2): 8 accumulators + 5 */
#define FOLD_LO4 0, 1, 2, 3, 8, 9, 10, 11
#define FOLD_HI4 4, 5, 6, 7, 12, 13, 14, 15
#define FOLD_LO2 0, 1, 4, 5, 8, 9, 12, 13
#define FOLD_HI2 2, 3, 6, 7, 10, 11, 14, 15
#define FOLD_LO1 0, 2, 4, 6, 8, 10, 12, 14
#define FOLD_HI1 1, 3, 5, 7, 9, 11, 13, 15
#endif
#define NR 4 /* weight rows per tile */
_Static_assert(MR * NR == VW, "one tile's sums fill one vector");
#define PARALLEL_WORK 262144 /* N * K below this (1 MB of weight): one thread */

typedef float vf __attribute__((vector_size(VW * sizeof(float))));

/* c + a * b, rounded once where the CPU has FMA; the same everywhere in this file */
static inline vf madd(vf a, vf b, vf c) {
#if VW == 16
    return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__)
    return (vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
    return c + a * b; /* no FMA instruction: the compiler cannot fuse this either */
#endif
}

static inline vf load(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v); /* unaligned */
    return v;
}

static inline vf load_tail(const float *p, int64_t n) {
    vf v = {0};
    memcpy(&v, p, (size_t)n * sizeof(float));
    return v;
}

/* Sums of VW vectors' lanes, output t in lane t: each vector's lanes folded in halves (lane l
 * plus lane l + VW/2, ..., then pairs of neighbours), pairs of vectors at once: level h
 * keeps, of each group of 2h lanes of (a, b), the first h plus the last h. */
#define FOLD(LO, HI)                                                                           \
    for (int t = 0; t < count / 2; t++)                                                        \
        v[t] = __builtin_shufflevector(v[2 * t], v[2 * t + 1], LO) +                            \
               __builtin_shufflevector(v[2 * t], v[2 * t + 1], HI);                            \
    count /= 2;

static inline __attribute__((always_inline)) vf fold(vf v[VW]) {
    int count = VW;
#if VW == 16
    FOLD(FOLD_LO8, FOLD_HI8)
#endif
    FOLD(FOLD_LO4, FOLD_HI4)
    FOLD(FOLD_LO2, FOLD_HI2)
    FOLD(FOLD_LO1, FOLD_HI1)
    return v[0];
}

/* y[i][j] = x_i . w_j (+ bias[j]) for i < mr, j < nr (constants once inlined), meanwhile
 * prefetching rows [pf, pf + pf_rows * K) into L2 (the next weight rows: memory streams them
 * while this tile computes). */
static inline __attribute__((always_inline)) void tile(const float *x, int64_t ldx,
                                                       const float *w, int64_t K,
                                                       const float *bias, float *y, int64_t ldy,
                                                       const int mr, const int nr,
                                                       const float *pf, int pf_rows) {
    vf acc[VW]; /* acc[i * NR + j]; the unused ones stay 0 */
    for (int t = 0; t < VW; t++) acc[t] = (vf){0};
    const int64_t body = K - K % VW;
    for (int64_t k = 0; k < body; k += VW) {
        vf wv[NR];
        for (int j = 0; j < nr; j++) wv[j] = load(w + j * K + k);
        for (int j = 0; j < pf_rows; j++) __builtin_prefetch(pf + j * K + k, 0, 2);
        for (int i = 0; i < mr; i++) {
            const vf xv = load(x + i * ldx + k);
            for (int j = 0; j < nr; j++) acc[i * NR + j] = madd(xv, wv[j], acc[i * NR + j]);
        }
    }
    if (body < K) {
        for (int i = 0; i < mr; i++) {
            const vf xv = load_tail(x + i * ldx + body, K - body);
            for (int j = 0; j < nr; j++)
                acc[i * NR + j] = madd(xv, load_tail(w + j * K + body, K - body), acc[i * NR + j]);
        }
    }
    float sums[VW];
    const vf total = fold(acc);
    memcpy(sums, &total, sizeof sums);
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            const float s = sums[i * NR + j];
            y[i * ldy + j] = bias ? s + bias[j] : s;
        }
}

/* Weight rows [n, n + NRC) against every x row; tile t of T prefetches its share of the next
 * NR weight rows (pf_rows: how many follow in W, 0 at its end). */
#define TILE(MRC, NRC) \
    tile(x + m * ldx, ldx, w, K, b, yn + m * N, N, MRC, NRC, pf + (t * pf_rows / T) * K, \
         (t + 1) * pf_rows / T - t * pf_rows / T)
#define ROWS(NRC)                                                                              \
    do {                                                                                       \
        const int64_t T = (M + MR - 1) / MR;                                                   \
        const float *pf = w + NRC * K;                                                         \
        int64_t m = 0, t = 0;                                                                  \
        for (; m + MR <= M; m += MR, t++) TILE(MR, NRC);                                       \
        switch (M - m) {                                                                       \
        case 1: TILE(1, NRC); break;                                                           \
        case 2: if (MR > 2) TILE(2, NRC); break;                                               \
        case 3: if (MR > 3) TILE(3, NRC); break;                                               \
        default: break;                                                                        \
        }                                                                                      \
    } while (0)

/* x: rows of K floats at x + m * ldx; W: [N][K] contiguous; bias: [N] or NULL; y: [M][N]
 * contiguous. threads: the OpenMP team size (the step's pool, torch.get_num_threads()). */
void hk_skinny_gemm(const float *x, int64_t M, int64_t ldx, const float *W, int64_t N,
                    int64_t K, const float *bias, float *y, int threads) {
    const int64_t blocks = (N + NR - 1) / NR;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && N * K >= PARALLEL_WORK)
    for (int64_t blk = 0; blk < blocks; blk++) {
        const int64_t n = blk * NR;
        const float *w = W + n * K;
        const float *b = bias ? bias + n : NULL;
        float *yn = y + n;
        const int64_t ahead = N - n - NR;
        const int pf_rows = ahead <= 0 ? 0 : ahead < NR ? (int)ahead : NR;
        if (n + NR <= N) {
            ROWS(NR);
        } else {
            for (int64_t r = n; r < N; r++, w += K, b = b ? b + 1 : NULL, yn++) ROWS(1);
        }
    }
}
