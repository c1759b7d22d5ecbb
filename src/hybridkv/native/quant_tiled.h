/* The tiled int8 GEMM of quant_int8.h for steps with many x rows (prefill), AVX2 / AVX-VNNI.
 *
 * The per-row kernel (i8_rows) decodes every weight block again for each group of I8_MR x
 * rows: scale bytes, nibbles, fp16 scales, the scale splats. Here each thread unpacks a panel
 * of TN weight rows once per chunk of x rows into blocks the inner loop reads as they are
 * (UBlock: 8 x 32 unsigned values in x's order, 8 int16 scale vectors, the weights of x's
 * 16-value sums, d and the min / offset factor c), then multiplies every x row of the chunk
 * against it in register tiles of TM x rows x TN weight rows: each x vector is loaded once
 * for TN weight rows, each unpacked vector once for TM x rows. The x chunk (TC rows) stays in
 * L2 while the thread walks its panels; the next chunk unpacks the panels again.
 *
 * Same integers as i8_q4_k / i8_q6_k in the same int32 lanes (dot_scaled: vpmaddubsw +
 * vpmaddwd, vpdpwssd with AVX-VNNI), the same float multiply-adds in the same block order,
 * the same lane sums: bitwise the per-row kernel's result, so a row alone and in any batch
 * still give the same bits. AVX-512 builds (other lanes, quant_vnni512.h) keep the per-row
 * kernel; a 512-bit tile would unpack to 64-byte vectors and replace dot_scaled by
 * dot_scaled64 / vpdpbusd the same way. Included by quant_int8.h only. */

#if I8_SIMD && !defined(__AVX512BW__)
#define I8_TILED 1
#ifndef TM
#define TM 2 /* x rows per register tile */
#define TN 4 /* weight rows per register tile and per unpacked panel */
#endif
#ifndef I8_TILE_ROWS
#define I8_TILE_ROWS 4 /* x rows from which hk_quant_gemm_i8 takes this kernel (4-12 rows: \
                          1.15-1.45x the per-row kernel, L3-resident 2048 x 2048 weights) */
#endif
#define TC_BYTES 196608 /* quantized x bytes per chunk (TC rows x K): in L2 with the panel */

typedef struct { /* one K-quant weight block, unpacked for x's values 32 t .. 32 t + 31 */
    __m256i u[8]; /* unsigned values */
    __m256i s[8]; /* int16 scale of each vpmaddubsw pair */
    __m256i a;    /* Q6_K: int16 scales of x's 16-value sums (lanes as i8_q6_k's offs) */
    __m256 d, m;  /* d splatted; Q4_K: -dmin m[s] in lane s (q4_k_fmins) */
} UBlock;

static void unpack_q4_k(const uint8_t *blk, UBlock *o) {
    uint64_t sc8, mn8;
    q4_k_scale_bytes(blk + 4, &sc8, &mn8);
    const __m256i nib = _mm256_set1_epi8(15);
    const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc8)));
    for (int j = 0; j < 4; j++) { /* bytes 32 j..: sub-block 2j low nibbles, 2j + 1 high */
        const __m256i q = load32(blk + 16 + 32 * j);
        o->u[2 * j] = _mm256_and_si256(q, nib);
        o->u[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), nib);
        o->s[2 * j] = word_splat(sc16, 2 * j, 2 * j);
        o->s[2 * j + 1] = word_splat(sc16, 2 * j + 1, 2 * j + 1);
    }
    o->a = _mm256_setzero_si256();
    o->d = _mm256_set1_ps(half_to_float(blk)), o->m = q4_k_fmins(blk);
}

static void unpack_q6_k(const uint8_t *blk, UBlock *o) {
    const int8_t *sc = (const int8_t *)(blk + 192);
    const __m128i sc8x16 = _mm_loadu_si128((const __m128i *)sc);
    const __m256i sc_lo = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(sc8x16)); /* 0-7 twice */
    const __m256i sc_hi = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_srli_si128(sc8x16, 8)));
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(0x30);
    for (int h = 0; h < 2; h++) { /* values 128 h + 32 r + l, r < 4: sub-blocks 8h + 2r (+1) */
        const __m256i l0 = load32(blk + 64 * h), l1 = load32(blk + 64 * h + 32);
        const __m256i hb = load32(blk + 128 + 32 * h);
        o->u[4 * h] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m2));
        o->u[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m2));
        o->u[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hb, m2));
        o->u[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                          _mm256_and_si256(_mm256_srli_epi16(hb, 2), m2));
        for (int r = 0; r < 4; r++) {
            const int t = 8 * h + 2 * r;
            o->s[4 * h + r] = word_splat(t < 8 ? sc_lo : sc_hi, t % 8, t % 8 + 1);
        }
    }
    o->a = _mm256_cvtepi8_epi16(sc8x16);
    o->d = _mm256_set1_ps(half_to_float(blk + 208)), o->m = _mm256_setzero_ps();
}

/* acc[j * mi + i] = weight row j . x row i, for i < mi, j < nj (ub: the panel's blocks,
 * ub[b * TN + j] block b of weight row j): per block the integer lanes, then kq_tail */
static inline __attribute__((always_inline)) void tiled_tile(const int fmt, const UBlock *ub,
                                                             int64_t nb, const XRows *xr,
                                                             const int mi, const int nj,
                                                             float *acc) {
    __m256 av[TM * TN];
    for (int t = 0; t < mi * nj; t++) av[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const UBlock *u = ub + b * TN;
        __m256i s[TM * TN];
        for (int t = 0; t < mi * nj; t++) s[t] = _mm256_setzero_si256();
        for (int c = 0; c < 8; c++) {
            __m256i xv[TM];
            for (int i = 0; i < mi; i++) {
                xv[i] = load32(xr->q + i * xr->K + 256 * b + 32 * c);
                __asm__("" : "+x"(xv[i])); /* in a register, not a memory operand per use */
            }
            for (int j = 0; j < nj; j++) {
                __m256i uj = u[j].u[c], sj = u[j].s[c];
                __asm__("" : "+x"(uj), "+x"(sj)); /* loaded once for the mi x rows */
                for (int i = 0; i < mi; i++) s[j * mi + i] = dot_scaled(s[j * mi + i], uj, xv[i], sj);
            }
            /* NOTE: keeps each sum in its register: without it gcc reassociates the unrolled
             * integer adds into trees and spills the products (1.3x slower) */
            for (int t = 0; t < mi * nj; t++) __asm__("" : "+x"(s[t]));
        }
        for (int i = 0; i < mi; i++) {
            const __m256 dx = _mm256_broadcast_ss(xr->d + i * xr->nd + b);
            const int16_t *xs = xr->s + i * xr->ns + 16 * b;
            const __m256 fx = fmt == Q4_K ? x_fsums(xs, dx) : dx;
            for (int j = 0; j < nj; j++) {
                const __m256i aux = fmt == Q6_K ? _mm256_madd_epi16(u[j].a, load32(xs)) : s[j * mi + i];
                av[j * mi + i] = kq_tail(fmt, s[j * mi + i], aux, _mm256_mul_ps(u[j].d, dx), fx,
                                         u[j].m, av[j * mi + i]);
            }
        }
    }
    for (int t = 0; t < mi * nj; t++) acc[t] = sum8(av[t]);
}

#define TILED_CASE(MI, NJ)                                                                      \
    case (MI) * 8 + (NJ):                                                                       \
        if ((MI) <= TM && (NJ) <= TN) {                                                         \
            if (fmt == Q4_K) tiled_tile(Q4_K, ub, nb, xr, MI, NJ, acc);                         \
            else tiled_tile(Q6_K, ub, nb, xr, MI, NJ, acc);                                     \
        }                                                                                       \
        break;
#define TILED_CASES(MI) TILED_CASE(MI, 1) TILED_CASE(MI, 2) TILED_CASE(MI, 3) TILED_CASE(MI, 4)

static void tiled_dispatch(int fmt, const UBlock *ub, int64_t nb, const XRows *xr, int64_t mi,
                           int64_t nj, float *acc) {
    _Static_assert(TM <= 4 && TN <= 4, "the cases below cover TM x TN");
    switch (mi * 8 + nj) {
        TILED_CASES(1)
        TILED_CASES(2)
        TILED_CASES(3)
        TILED_CASES(4)
    default: break;
    }
}

/* Weight rows [n, n + nj) against x rows [m0, m1) (xq / dx / xs: all rows), into y. */
static void tiled_panel(int fmt, const UBlock *ub, int64_t nb, const int8_t *xq, const float *dx,
                        const int16_t *xs, int64_t K, int64_t m0, int64_t m1, int64_t n,
                        int64_t nj, const float *bias, float *y, int64_t N) {
    for (int64_t m = m0; m < m1; m += TM) {
        const int64_t mi = m1 - m < TM ? m1 - m : TM;
        const XRows xr = {xq + m * K, dx + m * nb, xs + m * (K / 16), K, nb, K / 16};
        float acc[TM * TN];
        tiled_dispatch(fmt, ub, nb, &xr, mi, nj, acc);
        for (int64_t j = 0; j < nj; j++)
            for (int64_t i = 0; i < mi; i++) {
                const float v = acc[j * mi + i];
                y[(m + i) * N + n + j] = bias ? v + bias[n + j] : v;
            }
    }
}

/* hk_quant_gemm_i8's product for Q4_K / Q6_K once x is quantized (xq, dx, xs as quantize_rows
 * leaves them). Returns 0, or -1 without memory for a thread's panel. */
static int i8_tiled(int fmt, const int8_t *xq, const float *dx, const int16_t *xs, int64_t M,
                    const uint8_t *W, int64_t N, int64_t K, const float *bias, float *y,
                    int threads) {
    const int64_t nb = K / 256, bytes = block_bytes(fmt), row_bytes = nb * bytes;
    const int64_t panels = (N + TN - 1) / TN, tc = K >= TC_BYTES / TM ? TM : TC_BYTES / K / TM * TM;
    int failed = 0;
#pragma omp parallel num_threads(threads) if (threads > 1 && N * K >= PARALLEL_WORK)
    {
        UBlock *ub = aligned_alloc(32, (size_t)(TN * nb) * sizeof(UBlock));
        if (!ub) {
#pragma omp atomic write
            failed = 1;
        }
        for (int64_t m0 = 0; m0 < M; m0 += tc) {
#pragma omp for schedule(static)
            for (int64_t p = 0; p < panels; p++) {
                const int64_t n = p * TN, nj = N - n < TN ? N - n : TN;
                if (!ub) continue;
                for (int64_t j = 0; j < nj; j++)
                    for (int64_t b = 0; b < nb; b++) {
                        const uint8_t *blk = W + (n + j) * row_bytes + b * bytes;
                        if (fmt == Q4_K) unpack_q4_k(blk, ub + b * TN + j);
                        else unpack_q6_k(blk, ub + b * TN + j);
                    }
                tiled_panel(fmt, ub, nb, xq, dx, xs, K, m0, M - m0 < tc ? M : m0 + tc, n, nj, bias, y, N);
            }
        }
        free(ub);
    }
    return failed ? -1 : 0;
}
#endif
