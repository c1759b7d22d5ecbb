/* Paged attention, shared pieces (included by attention.c only: one translation unit, and the
 * library's cache key covers this directory's headers, hybridkv/native/__init__.py).
 *
 * The step's shape, bfloat16 <-> float32 conversions, cursors and slot offsets that find key
 * position j of a table row in the pages, write_kv (the step's K/V into their slots), one
 * K or V row as float32, 16-float vector helpers, the tile and scratch records, and softmax
 * with soft-capping and the sink. Nothing here checks bounds: the callers in attention.c are
 * handed checked shapes and tables (hybridkv/native/attention.py). */

#ifndef HK_ATTENTION_COMMON_H
#define HK_ATTENTION_COMMON_H

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

#define TILE 16 /* query tokens of one request attended together: each key row read once */

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

/* The build's float vector for sums whose lanes never mix (tile scores and values): one
 * register, 16 lanes with AVX-512, 8 with AVX, 4 without. GCC 12 lowers arrays of the 64-byte
 * v16 on AVX2 through general registers and the stack (~5x slower), so the tile kernels keep
 * their accumulators in register-sized vectors; a lane's sum is the same sequence of fused
 * multiply-adds whatever the width, so the results are bitwise those of v16 code. */
#if defined(__AVX512F__)
#define VL 16
#elif defined(__AVX__)
#define VL 8
#else
#define VL 4
#endif
typedef float vf __attribute__((vector_size(VL * sizeof(float))));

static inline vf loadv(const float *p) {
    vf x;
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

#endif
