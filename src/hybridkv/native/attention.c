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
        for (; qi + 4 <= nq * group; qi += 4) { /* four independent sums share each load */
            const float *qv[4];
            for (int u = 0; u < 4; u++)
                qv[u] = q + ((qi + u) / group) * hd + ((qi + u) % group) * d;
            v16 acc[4] = {{0}, {0}, {0}, {0}};
            for (int64_t x = 0; x < d; x++) {
                v16 kx = load16(kt + x * 16);
                for (int u = 0; u < 4; u++) acc[u] += qv[u][x] * kx;
            }
            for (int u = 0; u < 4; u++)
                memcpy(w->scores + (qi + u) * n + j0, &acc[u], (size_t)m * sizeof(float));
        }
        for (; qi < nq * group; qi++) {
            const float *qv = q + (qi / group) * hd + (qi % group) * d;
            v16 acc = {0};
            for (int64_t x = 0; x < d; x++) acc += qv[x] * load16(kt + x * 16);
            memcpy(w->scores + qi * n + j0, &acc, (size_t)m * sizeof(float));
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
        for (int64_t h = 0; h < group; h++) {
            const float *pr = w->scores + (i * group + h) * n;
            float *o = out + i * hd + h * d;
            int64_t x0 = 0;
            for (; x0 + 64 <= d; x0 += 64) { /* four independent sums, in registers */
                v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
                for (int64_t j = a; j < b; j++) {
                    const float *vr = rows[j] + x0;
                    a0 += pr[j] * load16(vr);
                    a1 += pr[j] * load16(vr + 16);
                    a2 += pr[j] * load16(vr + 32);
                    a3 += pr[j] * load16(vr + 48);
                }
                memcpy(o + x0, &a0, sizeof a0);
                memcpy(o + x0 + 16, &a1, sizeof a1);
                memcpy(o + x0 + 32, &a2, sizeof a2);
                memcpy(o + x0 + 48, &a3, sizeof a3);
            }
            for (; x0 < d; x0 += 16) {
                v16 acc = {0};
                for (int64_t j = a; j < b; j++) acc += pr[j] * load16(rows[j] + x0);
                memcpy(o + x0, &acc, sizeof acc);
            }
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

/* k, v: float32 [T][kv_heads][d] (token strides k_stride, v_stride), written first; q: float32
 * [T][H][d] (token stride q_stride); out: float32 contiguous [T][H][d]. Returns 0, or -1 when
 * scratch memory ran out. */
int hk_attn(const hk_attn_shape *s, const float *q, const float *k, const float *v, float *out,
            void *pages, const int64_t *table, const int64_t *rows, const int64_t *pos,
            const float *sinks) {
    write_kv(s, k, v, pages, table, rows, pos);
    const int64_t group = s->num_heads / s->num_kv_heads, d = s->head_dim;
    int64_t longest = 1;
    for (int64_t t = 0; t < s->num_tokens; t++)
        longest = pos[t] + 1 > longest ? pos[t] + 1 : longest;
    if (s->window > 0 && s->window + TILE < longest) longest = s->window + TILE;
    tile *tiles = malloc((size_t)(s->num_tokens ? s->num_tokens : 1) * sizeof(tile));
    if (!tiles) return -1;
    const int64_t num_tiles = make_tiles(s, rows, pos, tiles);
    const int64_t n = num_tiles * s->num_kv_heads;
    int64_t work = 0; /* multiply-adds, roughly: below PARALLEL_WORK threads cost more */
    for (int64_t i = 0; i < num_tiles; i++) {
        int64_t keys = pos[tiles[i].t0] + tiles[i].nq;
        keys = s->window > 0 && s->window + tiles[i].nq < keys ? s->window + tiles[i].nq : keys;
        work += keys * tiles[i].nq * s->num_heads * d * 2;
    }
    int failed = 0;
#pragma omp parallel reduction(| : failed) if (n > 1 && work > PARALLEL_WORK)
    {
        scratch w = {malloc((size_t)(TILE * group * longest) * sizeof(float)),
                     malloc((size_t)(17 * d) * sizeof(float)),
                     malloc((size_t)(longest * d) * sizeof(float)),
                     malloc((size_t)longest * sizeof(float *))};
        if (!w.scores || !w.row || !w.vals || !w.rows) failed = 1;
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < n; i++) {
            if (failed) continue;
            const tile *tl = &tiles[i / s->num_kv_heads];
            int64_t g = i % s->num_kv_heads, head = tl->t0 * s->num_heads + g * group;
            attend_tile(s, q + tl->t0 * s->q_stride + g * group * d, out + head * d, pages, table,
                        rows[tl->t0],
                        pos[tl->t0], tl->nq, g, sinks, &w);
        }
        free(w.scores);
        free(w.row);
        free(w.vals);
        free((void *)w.rows);
    }
    free(tiles);
    return failed ? -1 : 0;
}
