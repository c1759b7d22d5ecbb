/* Paged attention of a lone query token (a decode), all heads at once (included by
 * attention.c only).
 *
 * attend_one sweeps the key positions of one table row in order, SWEEP at a time, each
 * position's rows of all kv heads read together and prefetched AHEAD_BYTES early; scores
 * of every query head (score_keys), softmax, then the values (add_values). Specialised for
 * head sizes 64 and 128 (attend_one_d with a constant d). */

#ifndef HK_ATTENTION_DECODE_H
#define HK_ATTENTION_DECODE_H

#include "attention_common.h"

/* One key position's rows of all kv heads (kv_heads * d contiguous elements from `at`) as
 * float32: in place, or converted into `buf` for bfloat16 pages. */
static inline const float *heads_row(const hk_attn_shape *s, const void *pages, int64_t at,
                                     float *buf) {
    return key_row(pages, at, (int)s->bf16, s->num_kv_heads * s->head_dim, buf);
}

/* Ask for key position `ahead`'s rows of all heads (half 0: K, 1: V), then advance it. */
static inline void prefetch_next(const hk_attn_shape *s, const void *pages, cursor *ahead,
                                 int64_t *left, int64_t half) {
    if (*left <= 0) return;
    (*left)--;
    const int64_t el = s->bf16 ? 2 : 4, bytes = s->num_kv_heads * s->head_dim * el;
    const char *row = (const char *)pages + next_slot(s, ahead, half, 0) * el;
    for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(row + off, 0, 3);
}

/* Bytes of K (or V) rows prefetched ahead of the ones read: a few positions. Farther (16
 * positions of 1 KB) measured 3-8% slower on one thread, probably from prefetches waiting for
 * the line fill buffers the demand loads need (docs/benchmarks.md, "Decode attention: where the
 * time goes"). */
#define AHEAD_BYTES 6144
#define AHEAD_MAX 16 /* positions */
#define SWEEP 8  /* key positions read together (a multiple of 4) */

/* A sweep over one half (K or V) of keys [lo, lo + n) of a table row: `next_rows` hands out
 * the rows of all heads of up to SWEEP key positions at a time, about AHEAD_BYTES ahead
 * prefetched (at least one position, at most AHEAD_MAX). */
typedef struct {
    cursor at, ahead;
    int64_t left, ahead_left, half;
} sweep;

static inline sweep sweep_at(const hk_attn_shape *s, const void *pages, cursor c, int64_t n,
                             int64_t half) {
    sweep w = {c, c, n, n, half};
    const int64_t row = s->num_kv_heads * s->head_dim * (s->bf16 ? 2 : 4);
    int64_t ahead = AHEAD_BYTES / row;
    ahead = ahead < 1 ? 1 : ahead > AHEAD_MAX ? AHEAD_MAX : ahead;
    for (int64_t i = 0; i < ahead; i++) prefetch_next(s, pages, &w.ahead, &w.ahead_left, half);
    return w;
}

/* rows[u] = the next key positions' rows (float32); positions past the end repeat the first
 * (callers give them weight 0 or drop their scores). Returns how many are real. */
static inline int64_t next_rows(const hk_attn_shape *s, const void *pages, sweep *w, float *buf,
                                const float **rows) {
    const int64_t m = w->left < SWEEP ? w->left : SWEEP, width = s->num_kv_heads * s->head_dim;
    for (int64_t u = 0; u < m; u++) {
        prefetch_next(s, pages, &w->ahead, &w->ahead_left, w->half);
        rows[u] = heads_row(s, pages, next_slot(s, &w->at, w->half, 0), buf + u * width);
    }
    for (int64_t u = m; u < SWEEP; u++) rows[u] = rows[0];
    w->left -= m;
    return m;
}

typedef float v4 __attribute__((vector_size(16)));

/* The four sums of a0..a3, as one vector (lane u: the sum of au's 16 lanes). */
static inline v4 sum4(v16 a0, v16 a1, v16 a2, v16 a3) {
    v16 b01 = __builtin_shufflevector(a0, a1, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21,
                                      22, 23) +
              __builtin_shufflevector(a0, a1, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28,
                                      29, 30, 31);
    v16 b23 = __builtin_shufflevector(a2, a3, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21,
                                      22, 23) +
              __builtin_shufflevector(a2, a3, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28,
                                      29, 30, 31);
    /* b01: a0's 8 partial sums, then a1's; b23 likewise: now 4 partial sums per vector */
    v16 c = __builtin_shufflevector(b01, b23, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25,
                                    26, 27) +
            __builtin_shufflevector(b01, b23, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28,
                                    29, 30, 31);
    v16 e = c + __builtin_shufflevector(c, c, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12,
                                        13);
    v16 f = e + __builtin_shufflevector(e, e, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15,
                                        14);
    return __builtin_shufflevector(f, f, 0, 4, 8, 12);
}

/* Scores of query heads [h0, h0 + group) (kv head g) against SWEEP keys at rows[]:
 * sc[h * stride + u] for u < SWEEP. */
static inline __attribute__((always_inline)) void score_keys(const float *q, const float **rows,
                                                             int64_t g, int64_t h0,
                                                             int64_t group, int64_t d,
                                                             float *sc, int64_t stride) {
    for (int64_t h = h0; h < h0 + group; h++) {
        const float *qh = q + h * d;
        for (int64_t u0 = 0; u0 < SWEEP; u0 += 4) {
            v16 a[4] = {{0}, {0}, {0}, {0}};
            for (int64_t x = 0; x < d; x += 16) {
                const v16 qx = load16(qh + x);
                for (int u = 0; u < 4; u++) a[u] += qx * load16(rows[u0 + u] + g * d + x);
            }
            v4 r = sum4(a[0], a[1], a[2], a[3]);
            memcpy(sc + h * stride + u0, &r, sizeof r);
        }
    }
}

/* out[h] += sum_u p[h][u] v_u for query heads [h0, h0 + group) of kv head g. */
static inline __attribute__((always_inline)) void add_values(float *out, const float **rows,
                                                             const float *p, int64_t stride,
                                                             int64_t g, int64_t h0,
                                                             int64_t group, int64_t d) {
    for (int64_t h = h0; h < h0 + group; h++) {
        const float *ph = p + h * stride;
        float *o = out + h * d;
        for (int64_t x = 0; x < d; x += 16) {
            v16 acc = load16(o + x);
            for (int u = 0; u < SWEEP; u++) acc += ph[u] * load16(rows[u] + g * d + x);
            memcpy(o + x, &acc, sizeof acc);
        }
    }
}

/* A lone query token (a decode) at position p of table row `row`, all heads at once: each key
 * position's K rows of every kv head (contiguous in its page) are read in one sweep, then its
 * V rows in a second one (d % 16 == 0; d a constant where inlined with one). */
static inline __attribute__((always_inline)) void attend_one_d(
    const hk_attn_shape *s, const float *q, float *out, const void *pages, const int64_t *table,
    int64_t row, int64_t p, const float *sinks, scratch *w, const int64_t d) {
    const int64_t heads = s->num_heads, kv = s->num_kv_heads, group = heads / kv;
    const int64_t lo = (s->window > 0 && p - s->window + 1 > 0) ? p - s->window + 1 : 0;
    const int64_t n = p - lo + 1, stride = (n + SWEEP - 1) / SWEEP * SWEEP;
    float *sc = w->scores; /* [heads][stride] */
    const float *rows[SWEEP];
    sweep keys = sweep_at(s, pages, cursor_at(s, table, row, lo), n, 0);
    for (int64_t j = 0; j < n; j += SWEEP) {
        next_rows(s, pages, &keys, w->vals, rows);
        for (int64_t g = 0; g < kv; g++) score_keys(q, rows, g, g * group, group, d, sc + j, stride);
    }
    for (int64_t h = 0; h < heads; h++) {
        softmax(s, sc + h * stride, n, sinks ? sinks + h : NULL);
        for (int64_t j = n; j < stride; j++) sc[h * stride + j] = 0.0f; /* repeated rows */
    }
    memset(out, 0, (size_t)(heads * d) * sizeof(float));
    sweep values = sweep_at(s, pages, cursor_at(s, table, row, lo), n, 1);
    for (int64_t j = 0; j < n; j += SWEEP) {
        next_rows(s, pages, &values, w->vals, rows);
        for (int64_t g = 0; g < kv; g++) add_values(out, rows, sc + j, stride, g, g * group, group, d);
    }
}

static void attend_one(const hk_attn_shape *s, const float *q, float *out, const void *pages,
                       const int64_t *table, int64_t row, int64_t p, const float *sinks,
                       scratch *w) {
    if (s->head_dim == 64)
        attend_one_d(s, q, out, pages, table, row, p, sinks, w, 64);
    else if (s->head_dim == 128)
        attend_one_d(s, q, out, pages, table, row, p, sinks, w, 128);
    else
        attend_one_d(s, q, out, pages, table, row, p, sinks, w, s->head_dim);
}

#endif
