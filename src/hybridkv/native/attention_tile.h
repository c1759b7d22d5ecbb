/* Paged attention of a tile: up to TILE consecutive query tokens of one request and one kv
 * head (its query heads), each key row read once per tile (included by attention.c only).
 *
 * attend_tile: scores key by key (dots_by_key) or, from CHUNK_QUERIES query vectors on, 16
 * keys transposed at a time (dots_by_chunk); softmax per query and head over the keys it sees
 * ([lo_i, p_i]); values key by key (values_by_key) or query by query in registers
 * (values_by_query, d % 16 == 0). Scores of keys a query does not see are never used. */

#ifndef HK_ATTENTION_TILE_H
#define HK_ATTENTION_TILE_H

#include "attention_common.h"

#define CHUNK_QUERIES 6 /* query vectors per tile from which transposing keys pays */
/* Query vectors scored together against 16 transposed keys: their 16 / VL accumulators each,
 * the keys' vectors and a broadcast fit the 32 (AVX-512) or 16 registers. */
#define QUERY_BLOCK (VL == 16 ? 8 : VL == 8 ? 6 : 2)
/* Vectors of one V row summed per pass (head_values): up to 4 heads x VALUE_WIDTH sums
 * (AVX2, d = 64, 12 heads over 4: widths 2, 3, 4 within 5 % of one another, 1 is 20 % slower). */
#define VALUE_WIDTH 4

/* Whether query position p sees key position `key`. */
static inline int sees(int64_t p, int64_t key, int64_t win) {
    return key <= p && (win <= 0 || key > p - win);
}

/* Four keys' scores for one query vector, four independent sums (d % 16 == 0). */
static inline void dot4(const float *qv, const float *const *k, int64_t d, float *out) {
    v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    for (int64_t x = 0; x < d; x += 16) {
        v16 qx = load16(qv + x);
        a0 += qx * load16(k[0] + x);
        a1 += qx * load16(k[1] + x);
        a2 += qx * load16(k[2] + x);
        a3 += qx * load16(k[3] + x);
    }
    out[0] = hsum16(a0), out[1] = hsum16(a1), out[2] = hsum16(a2), out[3] = hsum16(a3);
}

/* Raw scores q.k, key by key: sc[(i * group + h) * n + j] for the keys query i sees. Float32
 * pages with d % 16 == 0: four keys at a time over query 0's keys (their sums are
 * independent, so they overlap instead of waiting on one another); later queries get scores
 * of the keys their window dropped too, real keys of the tile, left unused. */
static void dots_by_key(const hk_attn_shape *s, const float *q, const void *pages, cursor keys,
                        int64_t lo, int64_t n, int64_t p0, int64_t nq, int64_t g, scratch *w) {
    const int64_t group = s->num_heads / s->num_kv_heads, d = s->head_dim, hd = s->q_stride;
    int64_t j = 0;
    if (!s->bf16 && d % 16 == 0) { /* keys [0, p0 - lo]: query 0's, real keys of the tile */
        for (; j + 4 <= p0 - lo + 1; j += 4) {
            const float *k[4];
            for (int u = 0; u < 4; u++) k[u] = (const float *)pages + next_slot(s, &keys, 0, g);
            for (int64_t i = 0; i < nq; i++)
                for (int64_t h = 0; h < group; h++) {
                    float *dst = w->scores + (i * group + h) * n + j;
                    dot4(q + i * hd + h * d, k, d, dst);
                }
        }
    }
    for (; j < n; j++) {
        const float *kr = key_row(pages, next_slot(s, &keys, 0, g), (int)s->bf16, d, w->row);
        for (int64_t i = 0; i < nq; i++) {
            if (!sees(p0 + i, lo + j, s->window)) continue;
            for (int64_t h = 0; h < group; h++)
                w->scores[(i * group + h) * n + j] = dot(q + i * hd + h * d, kr, d);
        }
    }
}

/* The first m of 16 scores, in 16 / VL vectors, to dst (whole vector stores when m == 16). */
static inline void store_scores(float *dst, const vf *x, int64_t m) {
    if (m == 16) {
        memcpy(dst, x, 16 * sizeof(float));
        return;
    }
    float all[16];
    memcpy(all, x, sizeof all);
    for (int64_t i = 0; i < m; i++) dst[i] = all[i];
}

/* Scores of query vectors [qi, qi + count) (count <= QUERY_BLOCK; vector i: query i / group,
 * head i % group) against 16 keys transposed in kt[d][16]: dst[i * n + jj] for jj < m. */
static inline __attribute__((always_inline)) void dots_of_keys(const float *q, const float *kt,
                                                               float *dst, int64_t n, int64_t m,
                                                               int64_t qi, const int count,
                                                               int64_t group, int64_t hd,
                                                               int64_t d) {
    enum { NV = 16 / VL };
    const float *qv[QUERY_BLOCK];
    for (int u = 0; u < count; u++) qv[u] = q + ((qi + u) / group) * hd + ((qi + u) % group) * d;
    vf acc[QUERY_BLOCK][NV];
    memset(acc, 0, sizeof acc);
    for (int64_t x = 0; x < d; x++) {
        vf kx[NV];
        for (int c = 0; c < NV; c++) kx[c] = loadv(kt + x * 16 + c * VL);
        for (int u = 0; u < count; u++)
            for (int c = 0; c < NV; c++) acc[u][c] += qv[u][x] * kx[c];
    }
    for (int u = 0; u < count; u++) store_scores(dst + u * n, acc[u], m);
}

/* The same scores, 16 keys at a time: the keys transposed into kt[d][16] once, then one
 * vector of 16 scores per query head (no horizontal sums). Scores of keys a query does not
 * see are computed too (they are real keys of the tile) and left unused. */
static void dots_by_chunk(const hk_attn_shape *s, const float *q, const void *pages,
                          cursor keys, int64_t n, int64_t nq, int64_t g, scratch *w) {
    const int64_t group = s->num_heads / s->num_kv_heads, d = s->head_dim, hd = s->q_stride;
    float *kt = w->row + d;
    for (int64_t j0 = 0; j0 < n; j0 += 16) {
        const int64_t m = n - j0 < 16 ? n - j0 : 16;
        for (int64_t jj = 0; jj < 16; jj++) {
            if (jj < m) {
                const float *kr =
                    key_row(pages, next_slot(s, &keys, 0, g), (int)s->bf16, d, w->row);
                for (int64_t x = 0; x < d; x++) kt[x * 16 + jj] = kr[x];
            } else {
                for (int64_t x = 0; x < d; x++) kt[x * 16 + jj] = 0.0f;
            }
        }
        int64_t qi = 0;
        for (; qi + QUERY_BLOCK <= nq * group; qi += QUERY_BLOCK) /* sums sharing each load */
            dots_of_keys(q, kt, w->scores + qi * n + j0, n, m, qi, QUERY_BLOCK, group, hd, d);
        for (; qi + 2 <= nq * group; qi += 2)
            dots_of_keys(q, kt, w->scores + qi * n + j0, n, m, qi, 2, group, hd, d);
        for (; qi < nq * group; qi++)
            dots_of_keys(q, kt, w->scores + qi * n + j0, n, m, qi, 1, group, hd, d);
    }
}

/* out[i][h] = sum_j p[i][h][j] v_j, key by key: each V row read once for every query. */
static void values_by_key(const hk_attn_shape *s, float *out, const void *pages, cursor values,
                          int64_t lo, int64_t n, int64_t p0, int64_t nq, int64_t g, scratch *w) {
    const int64_t group = s->num_heads / s->num_kv_heads, d = s->head_dim, hd = s->num_heads * d;
    for (int64_t i = 0; i < nq * group; i++)
        memset(out + (i / group) * hd + (i % group) * d, 0, (size_t)d * sizeof(float));
    for (int64_t j = 0; j < n; j++) {
        const float *vr = key_row(pages, next_slot(s, &values, 1, g), (int)s->bf16, d, w->row);
        for (int64_t i = 0; i < nq; i++) {
            if (!sees(p0 + i, lo + j, s->window)) continue;
            for (int64_t h = 0; h < group; h++)
                axpy(out + i * hd + h * d, w->scores[(i * group + h) * n + j], vr, d);
        }
    }
}

/* o[u][x0, x0 + VL * width) = sum_{j in [a, b)} pr[u][j] rows[j][x0, ...) for `count` heads
 * of one query (they see the same keys): each V load shared by the heads, count * width
 * independent sums in registers. */
static inline __attribute__((always_inline)) void head_values(const float *const *rows,
                                                              const float *const *pr,
                                                              float *const *o, int64_t a,
                                                              int64_t b, int64_t x0,
                                                              const int count, const int width) {
    vf acc[4][4];
    memset(acc, 0, sizeof acc);
    for (int64_t j = a; j < b; j++) {
        const float *vr = rows[j] + x0;
        vf vx[4];
        for (int c = 0; c < width; c++) vx[c] = loadv(vr + VL * c);
        for (int u = 0; u < count; u++)
            for (int c = 0; c < width; c++) acc[u][c] += pr[u][j] * vx[c];
    }
    for (int u = 0; u < count; u++)
        for (int c = 0; c < width; c++) memcpy(o[u] + x0 + VL * c, &acc[u][c], sizeof(vf));
}

/* head_values with count and width as constants (count <= 4, width VALUE_WIDTH or 1). */
static void head_values_of(const float *const *rows, const float *const *pr, float *const *o,
                           int64_t a, int64_t b, int64_t x0, int count, int width) {
    if (width == VALUE_WIDTH) {
        if (count == 4) head_values(rows, pr, o, a, b, x0, 4, VALUE_WIDTH);
        else if (count == 3) head_values(rows, pr, o, a, b, x0, 3, VALUE_WIDTH);
        else if (count == 2) head_values(rows, pr, o, a, b, x0, 2, VALUE_WIDTH);
        else head_values(rows, pr, o, a, b, x0, 1, VALUE_WIDTH);
    } else {
        if (count == 4) head_values(rows, pr, o, a, b, x0, 4, 1);
        else if (count == 3) head_values(rows, pr, o, a, b, x0, 3, 1);
        else if (count == 2) head_values(rows, pr, o, a, b, x0, 2, 1);
        else head_values(rows, pr, o, a, b, x0, 1, 1);
    }
}

/* The same sums query by query, in registers (d % 16 == 0): rows[j] points at V row j, in
 * the pages (float32) or converted into w->vals (bfloat16). */
static void values_by_query(const hk_attn_shape *s, float *out, const void *pages,
                            cursor values, int64_t lo, int64_t n, int64_t p0, int64_t nq,
                            int64_t g, scratch *w) {
    const int64_t group = s->num_heads / s->num_kv_heads, d = s->head_dim, hd = s->num_heads * d;
    const float **rows = w->rows;
    for (int64_t j = 0; j < n; j++)
        rows[j] = key_row(pages, next_slot(s, &values, 1, g), (int)s->bf16, d, w->vals + j * d);
    for (int64_t i = 0; i < nq; i++) {
        const int64_t p = p0 + i;
        const int64_t a = (s->window > 0 && p - s->window + 1 > lo) ? p - s->window + 1 - lo : 0;
        const int64_t b = p - lo + 1;
        for (int64_t h0 = 0; h0 < group; h0 += 4) {
            const int count = group - h0 < 4 ? (int)(group - h0) : 4;
            const float *pr[4];
            float *o[4];
            for (int u = 0; u < count; u++) {
                pr[u] = w->scores + (i * group + h0 + u) * n;
                o[u] = out + i * hd + (h0 + u) * d;
            }
            int64_t x0 = 0;
            for (; x0 + VL * VALUE_WIDTH <= d; x0 += VL * VALUE_WIDTH)
                head_values_of(rows, pr, o, a, b, x0, count, VALUE_WIDTH);
            for (; x0 < d; x0 += VL) head_values_of(rows, pr, o, a, b, x0, count, 1);
        }
    }
}

/* Ask for the K (half 0) or V (half 1) rows of the tile's n keys ahead of their use: the rows
 * are strided (kv_heads * d apart) and scattered over blocks, so the hardware prefetchers
 * miss them; issued together, the loads overlap instead of waiting one by one. */
static void prefetch_rows(const hk_attn_shape *s, const void *pages, cursor c, int64_t n,
                          int64_t half, int64_t g) {
    const int64_t bytes = s->head_dim * (s->bf16 ? 2 : 4);
    for (int64_t j = 0; j < n; j++) {
        const char *row = (const char *)pages + next_slot(s, &c, half, g) * (s->bf16 ? 2 : 4);
        for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(row + off, 0, 3);
    }
}

/* Queries of one tile and one kv head (its `group` query heads): query i sees key positions
 * [lo_i, p0 + i]; scores of the keys it does not see are never used. */
static void attend_tile(const hk_attn_shape *s, const float *q, float *out, const void *pages,
                        const int64_t *table, int64_t row, int64_t p0, int64_t nq, int64_t g,
                        const float *sinks, scratch *w) {
    const int64_t group = s->num_heads / s->num_kv_heads, d = s->head_dim;
    const int64_t win = s->window;
    const int64_t lo = (win > 0 && p0 - win + 1 > 0) ? p0 - win + 1 : 0; /* first key of query 0 */
    const int64_t n = p0 + nq - lo;                                       /* keys of the tile */
    float *sc = w->scores;
    prefetch_rows(s, pages, cursor_at(s, table, row, lo), n, 0, g);
    prefetch_rows(s, pages, cursor_at(s, table, row, lo), n, 1, g);
    if (nq * group >= CHUNK_QUERIES)
        dots_by_chunk(s, q, pages, cursor_at(s, table, row, lo), n, nq, g, w);
    else
        dots_by_key(s, q, pages, cursor_at(s, table, row, lo), lo, n, p0, nq, g, w);
    for (int64_t i = 0; i < nq; i++) {
        int64_t p = p0 + i;
        int64_t a = (win > 0 && p - win + 1 > lo) ? p - win + 1 - lo : 0, b = p - lo + 1;
        for (int64_t h = 0; h < group; h++)
            softmax(s, sc + (i * group + h) * n + a, b - a, sinks ? sinks + g * group + h : NULL);
    }
    if (d % 16 == 0)
        values_by_query(s, out, pages, cursor_at(s, table, row, lo), lo, n, p0, nq, g, w);
    else
        values_by_key(s, out, pages, cursor_at(s, table, row, lo), lo, n, p0, nq, g, w);
}

#endif
