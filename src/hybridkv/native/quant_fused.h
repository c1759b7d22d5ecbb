/* The decode tile of quant.c (M <= MR x rows against a panel of NR weight rows) with Q8_0 or
 * Q4_K weights dequantized in registers instead of through the panel scratch: no store and
 * reload, the x rows' accumulators held across the whole of K. Every weight value comes from
 * the arithmetic deq_q8_0 / deq_q4_k use and every output sums its products in the same order
 * along K (VW lanes, k increasing), so results are bitwise the panel path's: a row alone (here)
 * equals the same row in a larger batch (the panel path). Included by quant.c only. */

/* Q8_0: 32 values per block, d * q. */
static inline __attribute__((always_inline)) void fused_q8_0(
    const float *x, int64_t ldx, const uint8_t *w, int64_t row_bytes, int64_t K,
    const float *bias, float *y, int64_t ldy, const int mr, const uint8_t *pf) {
    vf acc[MR * NR];
    for (int t = 0; t < MR * NR; t++) acc[t] = (vf){0};
    for (int64_t k = 0, o = 0; k < K; k += 32, o += 34) {
        vf d[NR];
        for (int j = 0; j < NR; j++) {
            d[j] = splat(half_to_float(w + j * row_bytes + o));
            if (pf) __builtin_prefetch(pf + j * row_bytes + o, 0, 2);
        }
        for (int c = 0; c < 32; c += VW) {
            vf wv[NR];
            for (int j = 0; j < NR; j++) {
                vb q;
                memcpy(&q, w + j * row_bytes + o + 2 + c, sizeof q);
                wv[j] = tof_signed(q) * d[j];
            }
            for (int i = 0; i < mr; i++) {
                const vf xv = loadf(x + i * ldx + k + c);
                for (int j = 0; j < NR; j++) acc[i * NR + j] = madd(xv, wv[j], acc[i * NR + j]);
            }
        }
    }
    store_sums(acc, bias, y, ldy, mr, NR);
}

/* Q4_K: 256 values per block; value 64 p + 32 h + l is nibble h of byte 16 + 32 p + l. */
static inline __attribute__((always_inline)) void fused_q4_k(
    const float *x, int64_t ldx, const uint8_t *w, int64_t row_bytes, int64_t K,
    const float *bias, float *y, int64_t ldy, const int mr, const uint8_t *pf) {
    vf acc[MR * NR];
    for (int t = 0; t < MR * NR; t++) acc[t] = (vf){0};
    for (int64_t k = 0, o = 0; k < K; k += 256, o += 144) {
        float ds[NR][8], dm[NR][8];
        for (int j = 0; j < NR; j++) {
            q4_k_scales(w + j * row_bytes + o, ds[j], dm[j]);
            if (pf)
                for (int l = 0; l < 144; l += 64) __builtin_prefetch(pf + j * row_bytes + o + l, 0, 2);
        }
        for (int s = 0; s < 8; s++) /* sub-block s: byte 16 + 32 (s / 2) + l, nibble s % 2 */
            for (int c = 0; c < 32; c += VW) {
                vf wv[NR];
                for (int j = 0; j < NR; j++) {
                    const vu q = loadu(w + j * row_bytes + o + 16 + 32 * (s / 2) + c);
                    wv[j] = madd(tof(s % 2 ? q >> 4 : q & 15), splat(ds[j][s]), splat(dm[j][s]));
                }
                for (int i = 0; i < mr; i++) {
                    const vf xv = loadf(x + i * ldx + k + 32 * s + c);
                    for (int j = 0; j < NR; j++) acc[i * NR + j] = madd(xv, wv[j], acc[i * NR + j]);
                }
            }
    }
    store_sums(acc, bias, y, ldy, mr, NR);
}

#define FUSED_ROWS(MRC)                                                                        \
    case MRC:                                                                                  \
        if (fmt == Q8_0) fused_q8_0(x, ldx, w, row_bytes, K, bias, y, ldy, MRC, pf);          \
        else fused_q4_k(x, ldx, w, row_bytes, K, bias, y, ldy, MRC, pf);                       \
        return 1;

/* The whole panel (nr == NR rows at w) against M <= MR x rows in registers: 1; else 0 (the
 * caller takes the panel path). pf: the panel PF_ROWS rows on, prefetched meanwhile. */
static int fused(int fmt, const float *x, int64_t M, int64_t ldx, const uint8_t *w,
                 int64_t row_bytes, int64_t K, const float *bias, float *y, int64_t ldy,
                 int64_t nr, const uint8_t *pf) {
    if (nr != NR || M > MR || M < 1 || (fmt != Q8_0 && fmt != Q4_K)) return 0;
    switch (M) {
        FUSED_ROWS(1)
        FUSED_ROWS(2)
#if MR > 2
        FUSED_ROWS(3)
        FUSED_ROWS(4)
#endif
    default: return 0;
    }
}
