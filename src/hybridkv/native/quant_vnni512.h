/* K-quants x int8 activations on AVX-512 VNNI: quant_int8.h's i8_row_k for Q4_K and Q6_K with
 * the same integers per block and about half the instructions. Per 256-value weight block:
 *   weights: 4 vectors of 64 unsigned bytes in x's order, from 64-byte loads (Q4_K: low and
 *            high nibbles of 64 bytes, x's quantized bytes interleaved to match, see
 *            q4k_interleave_x; Q6_K: 4 + 2 bits of two 32-value runs, variable shifts, vpternlog);
 *   dots:    vpdpbusd (weight u8 x x s8, 4 products a lane) into 4 vectors of 16 int32, each
 *            |lane| <= 4 * 63 * 127 = 32004 (Q4_K: 4 * 15 * 127);
 *   scales:  two vpackssdw (exact: every lane fits int16) then vpmaddwd / vpdpwssd with the
 *            block's sub-block scales spread to the packed lanes (two vpermw per block, shared
 *            by the x rows): tot = sum_s sc[s] sum q xq, 16 int32 lanes;
 *   aux:     Q4_K's m[s] / Q6_K's sc[t] times x's sums of 16 (one vpmaddwd), as before;
 *   float:   y += (d dx) tot - (c dx) aux, c = dmin (Q4_K) or 32 d (Q6_K), lane-wise, the lanes
 *            reduced once at the end of the row.
 * Several weight rows share a pass (independent chains; x loaded once for them). Each (weight
 * row, x row) pair runs the same operations whatever the others: batch and thread invariant.
 * Included by quant_int8.h when the CPU has AVX-512 BW + VNNI. */

#ifndef KQ_NJ
#define KQ_NJ 4 /* weight rows per pass when x has 1-2 rows */
#endif

/* x's quantized bytes in the order Q4_K's nibbles come: in every 128 values, 32-63 and 64-95
 * swapped, so 64 weight bytes' low nibbles (values 0-31 | 64-95 of the 128) meet x's first 64
 * bytes and their high nibbles (32-63 | 96-127) the next 64. In place; xs keeps x's order. */
static void q4k_interleave_x(int8_t *xq, int64_t num_values) {
    for (int64_t o = 0; o < num_values; o += 128) {
        int8_t tmp[32];
        memcpy(tmp, xq + o + 32, 32);
        memcpy(xq + o + 32, xq + o + 64, 32);
        memcpy(xq + o + 64, tmp, 32);
    }
}

/* int16 lane l of vpackssdw(P0, P1) (128-bit lane k = l / 8, word w = l % 8) -> its sub-block.
 * Q4_K (P0, P1: a 128-value half's low / high nibbles; lanes 0-7 of P0 sub-block 0, 8-15: 2;
 * of P1: 1, 3): 2 (l / 16) + w / 4. Q6_K (P0, P1: 64 values each, 4 lanes per 16-value
 * sub-block): k + 4 (w / 4). first: the sub-block of the vector's first lane. */
static inline __m512i kq_spread_index(int fmt, int first) {
    int16_t idx[32];
    for (int l = 0; l < 32; l++)
        idx[l] = (int16_t)(first + (fmt == Q4_K ? 2 * (l / 16) + l % 8 / 4 : l / 8 + 4 * (l % 8 / 4)));
    __m512i v;
    memcpy(&v, idx, sizeof v);
    return v;
}

typedef struct { /* one weight block, ready for every x row */
    __m512i u[4];   /* weight values as u8, in (interleaved) x's order */
    __m512i s0, s1; /* sub-block scales spread to the packed lanes of the first / second half */
    __m256i aux;    /* per sum of 16 x values: Q4_K m[s], Q6_K sc[t] */
    __m128 dc;      /* d | c */
} KqBlock;

static inline __attribute__((always_inline)) void q4k_block(const uint8_t *blk, __m512i idx0,
                                                            __m512i idx1, KqBlock *kb) {
    uint64_t sc8, mn8;
    q4_k_scale_bytes(blk + 4, &sc8, &mn8);
    const __m512i sc16 = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc8)));
    kb->s0 = _mm512_permutexvar_epi16(idx0, sc16);
    kb->s1 = _mm512_permutexvar_epi16(idx1, sc16);
    const __m128i m8 = _mm_cvtsi64_si128((long long)mn8);
    kb->aux = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8)); /* m[s] for both sums of 16 */
    const __m512i nib = _mm512_set1_epi8(15);
    const __m512i q0 = _mm512_loadu_si512(blk + 16), q1 = _mm512_loadu_si512(blk + 80);
    kb->u[0] = _mm512_and_si512(q0, nib);
    kb->u[1] = _mm512_and_si512(_mm512_srli_epi16(q0, 4), nib);
    kb->u[2] = _mm512_and_si512(q1, nib);
    kb->u[3] = _mm512_and_si512(_mm512_srli_epi16(q1, 4), nib);
    int32_t dm; /* d | dmin, fp16 */
    memcpy(&dm, blk, sizeof dm);
    kb->dc = _mm_cvtph_ps(_mm_cvtsi32_si128(dm));
}

/* Q6_K: values 128 h + 32 r + l: low 4 bits from ql[64 h + 32 (r % 2) + l] >> 4 (r / 2), high
 * 2 bits from qh[32 h + l] >> 2 r. One 64-byte vector = runs r, r + 1 (x's order). */
static inline __attribute__((always_inline)) void q6k_block(const uint8_t *blk, __m512i idx0,
                                                            __m512i idx1, KqBlock *kb) {
    const __m512i lo4 = _mm512_set1_epi8(15), hi2 = _mm512_set1_epi8(0x30);
    const __m512i up01 = _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2); /* qh << 4 | qh << 2 */
    const __m512i dn23 = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2); /* qh | qh >> 2 */
    for (int h = 0; h < 2; h++) {
        const __m512i l = _mm512_loadu_si512(blk + 64 * h);
        const __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h)));
        const __m512i h01 = _mm512_and_si512(_mm512_sllv_epi64(hb, up01), hi2);
        const __m512i h23 = _mm512_and_si512(_mm512_srlv_epi64(hb, dn23), hi2);
        kb->u[2 * h] = _mm512_ternarylogic_epi64(l, lo4, h01, 0xEA);                       /* l & 15 | h */
        kb->u[2 * h + 1] = _mm512_ternarylogic_epi64(_mm512_srli_epi16(l, 4), lo4, h23, 0xEA);
    }
    const __m512i sc16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192))));
    kb->s0 = _mm512_permutexvar_epi16(idx0, sc16);
    kb->s1 = _mm512_permutexvar_epi16(idx1, sc16);
    kb->aux = _mm512_castsi512_si256(sc16);
    const float d = half_to_float(blk + 208);
    kb->dc = _mm_setr_ps(d, 32.0f * d, 0.0f, 0.0f);
}

/* tot: sum_s sc[s] sum q xq of block kb with one x row (x: its 256 quantized values) */
static inline __m512i kq_dot(const KqBlock *kb, const int8_t *x) {
    __m512i p[4];
    for (int j = 0; j < 4; j++)
        p[j] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), kb->u[j], _mm512_loadu_si512(x + 64 * j));
    const __m512i t = _mm512_madd_epi16(_mm512_packs_epi32(p[0], p[1]), kb->s0);
    return _mm512_dpwssd_epi32(t, _mm512_packs_epi32(p[2], p[3]), kb->s1);
}

/* acc[j * mi + i] = weight row j (at w + j * row_bytes; Q4_K or Q6_K) . x row i, j < nj,
 * i < mi */
static inline __attribute__((always_inline)) void kq_rows(const int fmt, const uint8_t *w,
                                                          int64_t row_bytes, const XRows *xr,
                                                          const int mi, const int nj,
                                                          float *acc) {
    const int64_t bytes = block_bytes(fmt);
    const __m512i idx0 = kq_spread_index(fmt, 0), idx1 = kq_spread_index(fmt, fmt == Q4_K ? 4 : 8);
    __m512 av[KQ_NJ * I8_MR];
    __m256 am[KQ_NJ * I8_MR];
    for (int t = 0; t < nj * mi; t++) av[t] = _mm512_setzero_ps(), am[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < xr->nd; b++)
#pragma GCC unroll 4
        for (int j = 0; j < nj; j++) {
            const uint8_t *blk = w + j * row_bytes + bytes * b;
            /* NOTE: may reach past W's end: a prefetch does not fault */
            for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(blk + I8_PF_BYTES + o, 0, 2);
            KqBlock kb;
            if (fmt == Q4_K) q4k_block(blk, idx0, idx1, &kb);
            else q6k_block(blk, idx0, idx1, &kb);
#pragma GCC unroll 4
            for (int i = 0; i < mi; i++) {
                const __m512i tot = kq_dot(&kb, xr->q + i * xr->K + 256 * b);
                const __m256i aux = _mm256_madd_epi16(kb.aux, load32(xr->s + i * xr->ns + 16 * b));
                const __m128 f = _mm_mul_ps(kb.dc, _mm_set1_ps(xr->d[i * xr->nd + b])); /* d dx | c dx */
                const int t = j * mi + i;
                av[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot), _mm512_broadcastss_ps(f), av[t]);
                am[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(aux), _mm256_broadcastss_ps(_mm_movehdup_ps(f)), am[t]);
            }
        }
    for (int t = 0; t < nj * mi; t++) acc[t] = _mm512_reduce_add_ps(av[t]) + sum8(am[t]);
}
