/* Paged attention reading K/V in place from the KV pages through each request's block table.
 *
 * Pages of one layer: page b starts at pages + b * block_stride elements and holds
 * [2][B][kv_heads][d] (K then V), float32 or bfloat16. Token t of the step belongs to table
 * row rows[t] and sits at position pos[t]; key position j of that row lives in block
 * table[rows[t] * table_stride + j / B] at offset j % B.
 *
 * hk_attn writes the step's K/V (float32 [T][kv_heads][d]) into their page slots, rounded to
 * bfloat16 (to nearest even, NaN kept quiet) when the pages are bfloat16; then, for every
 * token t and query head h (GQA: kv head h / (H / kv_heads)), over the key positions
 * [lo, pos[t]] with lo = max(0, pos[t] - window + 1) (window 0: lo = 0):
 *     s_j = scale * q.k_j;  s_j = softcap * tanh(s_j / softcap) if softcap > 0
 *     out = sum_j exp(s_j - m) v_j / (sum_j exp(s_j - m) + exp(sink_h - m))
 * (the sink term only with sinks; m = max over the s_j and the sink). Slots outside
 * [lo, pos[t]] are never read, whatever bytes they hold. Consecutive tokens of one request are
 * attended in tiles of up to TILE queries, so each key row is read once per tile.
 * Callers (hybridkv/native/attention.py) check shapes, dtypes and table bounds. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vecmath.h"

typedef struct {
    int64_t num_tokens, num_heads, num_kv_heads, head_dim, block_size;
    int64_t block_stride; /* elements from one block's page to the next */
    int64_t table_stride; /* entries per block-table row */
    int64_t window;       /* 0: no window */
    int64_t bf16;         /* pages are bfloat16 (else float32) */
    int64_t q_stride, k_stride, v_stride; /* elements from one token's q / k / v to the next */
    float scale, softcap; /* softcap 0: none */
} hk_attn_shape;

static inline float bf16_to_f32(uint16_t x) {
    uint32_t bits = (uint32_t)x << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u); /* NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

/* Walks key positions of one table row, one kv head, in order: no division per key. */
typedef struct {
    const int64_t *blocks; /* the row's table entries */
    int64_t index, offset; /* table entry and offset inside its block of the current key */
} cursor;

static inline cursor cursor_at(const hk_attn_shape *s, const int64_t *table, int64_t r,
                               int64_t j) {
    return (cursor){table + r * s->table_stride, j / s->block_size, j % s->block_size};
}

/* Element offset of the cursor's key (half 0: K, 1: V, kv head g); then advance it. */
static inline int64_t next_slot(const hk_attn_shape *s, cursor *c, int64_t half, int64_t g) {
    int64_t in_page = (half * s->block_size + c->offset) * s->num_kv_heads + g;
    int64_t at = c->blocks[c->index] * s->block_stride + in_page * s->head_dim;
    if (++c->offset == s->block_size) {
        c->offset = 0;
        c->index++;
    }
    return at;
}

/* Element offset of (K or V, key position j, kv head g) of table row r. */
static inline int64_t slot(const hk_attn_shape *s, const int64_t *table, int64_t r, int64_t j,
                           int64_t half, int64_t g) {
    int64_t block = table[r * s->table_stride + j / s->block_size];
    int64_t in_page = ((half * s->block_size + j % s->block_size) * s->num_kv_heads + g);
    return block * s->block_stride + in_page * s->head_dim;
}

static void write_kv(const hk_attn_shape *s, const float *k, const float *v, void *pages,
                     const int64_t *table, const int64_t *rows, const int64_t *pos) {
    const int64_t n = s->num_tokens * s->num_kv_heads, d = s->head_dim;
#pragma omp parallel for schedule(static) if (n * d > 65536)
    for (int64_t i = 0; i < n; i++) {
        int64_t t = i / s->num_kv_heads, g = i % s->num_kv_heads;
        for (int64_t half = 0; half < 2; half++) {
            const float *src = (half ? v + t * s->v_stride : k + t * s->k_stride) + g * d;
            int64_t at = slot(s, table, rows[t], pos[t], half, g);
            if (s->bf16) {
                uint16_t *dst = (uint16_t *)pages + at;
                for (int64_t x = 0; x < d; x++) dst[x] = f32_to_bf16(src[x]);
            } else {
                memcpy((float *)pages + at, src, (size_t)d * sizeof(float));
            }
        }
    }
}

#define PARALLEL_WORK 200000 /* ~20 us of one core: less is not worth waking threads */
#define TILE 16 /* query tokens of one request attended together: each key row read once */
#define CHUNK_QUERIES 6 /* query vectors per tile from which transposing keys pays */

/* One K or V row as float32: in place for float32 pages, converted into `buf` for bfloat16. */
static inline const float *key_row(const void *pages, int64_t at, int bf16, int64_t d,
                                   float *buf) {
    if (!bf16) return (const float *)pages + at;
    const uint16_t *src = (const uint16_t *)pages + at;
#pragma omp simd
    for (int64_t x = 0; x < d; x++) buf[x] = bf16_to_f32(src[x]);
    return buf;
}

/* 16-float vectors (GCC/Clang vector extensions: one AVX-512 register, two AVX2 ones). */
typedef float v16 __attribute__((vector_size(64)));

static inline v16 load16(const float *p) {
    v16 x;
    memcpy(&x, p, sizeof x);
    return x;
}

static inline float hsum16(v16 v) {
    typedef float v8 __attribute__((vector_size(32)));
    typedef float v4 __attribute__((vector_size(16)));
    v8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
    v8 b = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    v8 c = a + b;
    v4 e = __builtin_shufflevector(c, c, 0, 1, 2, 3) + __builtin_shufflevector(c, c, 4, 5, 6, 7);
    return (e[0] + e[2]) + (e[1] + e[3]);
}

static inline float dot(const float *a, const float *b, int64_t d) {
    if (d % 16 == 0) {
        v16 acc = {0};
        for (int64_t x = 0; x < d; x += 16) acc += load16(a + x) * load16(b + x);
        return hsum16(acc);
    }
    float acc = 0.0f;
    for (int64_t x = 0; x < d; x++) acc += a[x] * b[x];
    return acc;
}

static inline void axpy(float *restrict y, float w, const float *restrict x, int64_t d) {
    if (d % 16 == 0) {
        for (int64_t i = 0; i < d; i += 16) {
            v16 r = load16(y + i) + w * load16(x + i);
            memcpy(y + i, &r, sizeof r);
        }
        return;
    }
    for (int64_t i = 0; i < d; i++) y[i] += w * x[i];
}

/* A tile: `nq` consecutive tokens from `t0` of one table row, at consecutive positions. */
typedef struct {
    int64_t t0, nq;
} tile;

typedef struct {
    float *scores; /* [TILE * group][longest] */
    float *row;    /* [17 d]: one K or V row as float32, then 16 keys transposed [d][16] */
    float *vals;   /* [longest][d]: a tile's V rows converted from bfloat16 */
    const float **rows; /* [longest]: where each V row of a tile is, as float32 */
} scratch;

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

/* The first m of 16 scores to dst (a whole vector store when m == 16). */
static inline void store_scores(float *dst, v16 x, int64_t m) {
    if (m == 16)
        memcpy(dst, &x, sizeof x);
    else
        for (int64_t i = 0; i < m; i++) dst[i] = x[i];
}

/* Scores of query vectors [qi, qi + count) (count 4 or 8; vector i: query i / group, head
 * i % group) against 16 keys transposed in kt[d][16]: dst[i * n + jj] for jj < m. */
static inline __attribute__((always_inline)) void dots_of_keys(const float *q, const float *kt,
                                                               float *dst, int64_t n, int64_t m,
                                                               int64_t qi, const int count,
                                                               int64_t group, int64_t hd,
                                                               int64_t d) {
    const float *qv[8];
    for (int u = 0; u < count; u++) qv[u] = q + ((qi + u) / group) * hd + ((qi + u) % group) * d;
    v16 acc[8] = {{0}, {0}, {0}, {0}, {0}, {0}, {0}, {0}};
    for (int64_t x = 0; x < d; x++) {
        v16 kx = load16(kt + x * 16);
        for (int u = 0; u < count; u++) acc[u] += qv[u][x] * kx;
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
        for (; qi + 8 <= nq * group; qi += 8) /* eight independent sums share each load */
            dots_of_keys(q, kt, w->scores + qi * n + j0, n, m, qi, 8, group, hd, d);
        for (; qi + 4 <= nq * group; qi += 4)
            dots_of_keys(q, kt, w->scores + qi * n + j0, n, m, qi, 4, group, hd, d);
        for (; qi < nq * group; qi++) {
            const float *qv = q + (qi / group) * hd + (qi % group) * d;
            v16 acc = {0};
            for (int64_t x = 0; x < d; x++) acc += qv[x] * load16(kt + x * 16);
            store_scores(w->scores + qi * n + j0, acc, m);
        }
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

/* o[u][x0, x0 + 16 * width) = sum_{j in [a, b)} pr[u][j] rows[j][x0, ...) for `count` heads
 * of one query (they see the same keys): each V load shared by the heads, count * width
 * independent sums in registers. */
static inline __attribute__((always_inline)) void head_values(const float *const *rows,
                                                              const float *const *pr,
                                                              float *const *o, int64_t a,
                                                              int64_t b, int64_t x0,
                                                              const int count, const int width) {
    v16 acc[4][4] = {{{0}}};
    for (int64_t j = a; j < b; j++) {
        const float *vr = rows[j] + x0;
        v16 vx[4];
        for (int c = 0; c < width; c++) vx[c] = load16(vr + 16 * c);
        for (int u = 0; u < count; u++)
            for (int c = 0; c < width; c++) acc[u][c] += pr[u][j] * vx[c];
    }
    for (int u = 0; u < count; u++)
        for (int c = 0; c < width; c++) memcpy(o[u] + x0 + 16 * c, &acc[u][c], sizeof(v16));
}

/* head_values with count and width as constants (count <= 4, width 4 or 1). */
static void head_values_of(const float *const *rows, const float *const *pr, float *const *o,
                           int64_t a, int64_t b, int64_t x0, int count, int width) {
    if (width == 4) {
        if (count == 4) head_values(rows, pr, o, a, b, x0, 4, 4);
        else if (count == 3) head_values(rows, pr, o, a, b, x0, 3, 4);
        else if (count == 2) head_values(rows, pr, o, a, b, x0, 2, 4);
        else head_values(rows, pr, o, a, b, x0, 1, 4);
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
            for (; x0 + 64 <= d; x0 += 64) head_values_of(rows, pr, o, a, b, x0, count, 4);
            for (; x0 < d; x0 += 16) head_values_of(rows, pr, o, a, b, x0, count, 1);
        }
    }
}

/* Scores x[0, n) -> probabilities, in place: scaled, soft-capped, normalised with the sink. */
static void softmax(const hk_attn_shape *s, float *x, int64_t n, const float *sink) {
    if (s->softcap > 0.0f) {
        const float cap = s->softcap, over = s->scale / s->softcap;
        for (int64_t j = 0; j < n; j++) x[j] = cap * tanhf(x[j] * over);
    } else {
        const float scale = s->scale;
#pragma omp simd
        for (int64_t j = 0; j < n; j++) x[j] *= scale;
    }
    float m = sink ? *sink : -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < n; j++) m = x[j] > m ? x[j] : m;
    float total = sink ? exp_le0(*sink - m) : 0.0f;
#pragma omp simd reduction(+ : total)
    for (int64_t j = 0; j < n; j++) {
        x[j] = exp_le0(x[j] - m);
        total += x[j];
    }
    const float inv = 1.0f / total;
#pragma omp simd
    for (int64_t j = 0; j < n; j++) x[j] *= inv;
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

#define AHEAD 16 /* key positions prefetched ahead of the one read */
#define SWEEP 8  /* key positions read together (a multiple of 4) */

/* A sweep over one half (K or V) of keys [lo, lo + n) of a table row: `next_rows` hands out
 * the rows of all heads of up to SWEEP key positions at a time, AHEAD positions prefetched. */
typedef struct {
    cursor at, ahead;
    int64_t left, ahead_left, half;
} sweep;

static inline sweep sweep_at(const hk_attn_shape *s, const void *pages, cursor c, int64_t n,
                             int64_t half) {
    sweep w = {c, c, n, n, half};
    for (int64_t i = 0; i < AHEAD; i++) prefetch_next(s, pages, &w.ahead, &w.ahead_left, half);
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

/* Split the step's tokens into tiles; returns how many (tiles has room for num_tokens). */
static int64_t make_tiles(const hk_attn_shape *s, const int64_t *rows, const int64_t *pos,
                          tile *tiles) {
    int64_t count = 0;
    for (int64_t t = 0; t < s->num_tokens; t++) {
        tile *last = count ? &tiles[count - 1] : NULL;
        int64_t end = last ? last->t0 + last->nq - 1 : -1;
        if (last && last->nq < TILE && rows[t] == rows[end] && pos[t] == pos[end] + 1)
            last->nq++;
        else
            tiles[count++] = (tile){t, 1};
    }
    return count;
}

/* A unit of work: one tile and one kv head (g >= 0), or a lone query token and all its heads
 * (g = -1, attend_one); cost: multiply-adds, roughly. */
typedef struct {
    int64_t tile, g, cost;
} item;

/* Costliest first (ties: in order), so the last items handed out are the small ones. */
static int by_cost(const void *a, const void *b) {
    const item *x = a, *y = b;
    if (x->cost != y->cost) return x->cost > y->cost ? -1 : 1;
    return x->tile != y->tile ? (x->tile < y->tile ? -1 : 1) : (x->g < y->g ? -1 : 1);
}

/* The step's items, costliest first; returns how many (items has room for tiles * kv). */
static int64_t make_items(const hk_attn_shape *s, const int64_t *pos, const tile *tiles,
                          int64_t num_tiles, item *items) {
    const int64_t kv = s->num_kv_heads, per_head = s->num_heads / kv * s->head_dim * 2;
    int64_t count = 0;
    for (int64_t i = 0; i < num_tiles; i++) {
        const int64_t nq = tiles[i].nq;
        int64_t keys = pos[tiles[i].t0] + nq;
        keys = s->window > 0 && s->window + nq < keys ? s->window + nq : keys;
        if (nq == 1 && s->head_dim % 16 == 0)
            items[count++] = (item){i, -1, keys * kv * per_head};
        else
            for (int64_t g = 0; g < kv; g++) items[count++] = (item){i, g, keys * nq * per_head};
    }
    qsort(items, (size_t)count, sizeof(item), by_cost);
    return count;
}

/* k, v: float32 [T][kv_heads][d] (token strides k_stride, v_stride), written first; q: float32
 * [T][H][d] (token stride q_stride); out: float32 contiguous [T][H][d]. Returns 0, or -1 when
 * scratch memory ran out. */
int hk_attn(const hk_attn_shape *s, const float *q, const float *k, const float *v, float *out,
            void *pages, const int64_t *table, const int64_t *rows, const int64_t *pos,
            const float *sinks) {
    write_kv(s, k, v, pages, table, rows, pos);
    const int64_t kv = s->num_kv_heads, group = s->num_heads / kv, d = s->head_dim;
    int64_t longest = 1;
    for (int64_t t = 0; t < s->num_tokens; t++)
        longest = pos[t] + 1 > longest ? pos[t] + 1 : longest;
    if (s->window > 0 && s->window + TILE < longest) longest = s->window + TILE;
    const size_t slots = (size_t)(s->num_tokens ? s->num_tokens : 1) * (size_t)kv;
    tile *tiles = malloc(slots * sizeof(tile));
    item *items = malloc(slots * sizeof(item));
    if (!tiles || !items) {
        free(tiles);
        free(items);
        return -1;
    }
    const int64_t n = make_items(s, pos, tiles, make_tiles(s, rows, pos, tiles), items);
    int64_t work = 0; /* multiply-adds, roughly: below PARALLEL_WORK threads cost more */
    for (int64_t i = 0; i < n; i++) work += items[i].cost;
    const int64_t score_rows = TILE * group > s->num_heads ? TILE * group : s->num_heads;
    const int64_t val_rows = longest > SWEEP * kv ? longest : SWEEP * kv;
    int failed = 0;
#pragma omp parallel reduction(| : failed) if (n > 1 && work > PARALLEL_WORK)
    {
        scratch w = {malloc((size_t)(score_rows * (longest + SWEEP)) * sizeof(float)),
                     malloc((size_t)(17 * d) * sizeof(float)),
                     malloc((size_t)(val_rows * d) * sizeof(float)),
                     malloc((size_t)longest * sizeof(float *))};
        if (!w.scores || !w.row || !w.vals || !w.rows) failed = 1;
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < n; i++) {
            if (failed) continue;
            const tile *tl = &tiles[items[i].tile];
            const int64_t g = items[i].g, row = rows[tl->t0], p0 = pos[tl->t0];
            if (g < 0) {
                attend_one(s, q + tl->t0 * s->q_stride, out + tl->t0 * s->num_heads * d, pages,
                           table, row, p0, sinks, &w);
                continue;
            }
            const int64_t head = tl->t0 * s->num_heads + g * group;
            attend_tile(s, q + tl->t0 * s->q_stride + g * group * d, out + head * d, pages, table,
                        row, p0, tl->nq, g, sinks, &w);
        }
        free(w.scores);
        free(w.row);
        free(w.vals);
        free((void *)w.rows);
    }
    free(tiles);
    free(items);
    return failed ? -1 : 0;
}
