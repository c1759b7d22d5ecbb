/* Paged attention reading K/V in place from the KV pages through each request's block table.
 *
 * Pages of one layer: page b starts at pages + b * block_stride elements and holds
 * [2][B][kv_heads][d] (K then V), float32 or bfloat16. Token t of the step belongs to table
 * row rows[t] and sits at position pos[t]; key position j of that row lives in block
 * table[rows[t] * table_stride + j / B] at offset j % B.
 *
 * hk_attn_write: the step's K/V (float32 [T][kv_heads][d]) into their page slots, rounded to
 *                bfloat16 (to nearest even, NaN kept quiet) when the pages are bfloat16.
 * hk_attn:       for every token t and query head h (GQA: kv head h / (H / kv_heads)), over
 *                the key positions [lo, pos[t]] with lo = max(0, pos[t] - window + 1)
 *                (window 0: lo = 0):
 *                    s_j = scale * q.k_j;  s_j = softcap * tanh(s_j / softcap) if softcap > 0
 *                    out = sum_j exp(s_j - m) v_j / (sum_j exp(s_j - m) + exp(sink_h - m))
 *                (the sink term only with sinks; m = max over the s_j and the sink). Slots
 *                outside [lo, pos[t]] are never read, whatever bytes they hold.
 * Callers (hybridkv/native/attention.py) check shapes, dtypes and table bounds. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t num_tokens, num_heads, num_kv_heads, head_dim, block_size;
    int64_t block_stride; /* elements from one block's page to the next */
    int64_t table_stride; /* entries per block-table row */
    int64_t window;       /* 0: no window */
    int64_t bf16;         /* pages are bfloat16 (else float32) */
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

/* Element offset of (K or V, key position j, kv head g) of table row r. */
static inline int64_t slot(const hk_attn_shape *s, const int64_t *table, int64_t r, int64_t j,
                           int64_t half, int64_t g) {
    int64_t block = table[r * s->table_stride + j / s->block_size];
    int64_t in_page = ((half * s->block_size + j % s->block_size) * s->num_kv_heads + g);
    return block * s->block_stride + in_page * s->head_dim;
}

void hk_attn_write(const hk_attn_shape *s, const float *k, const float *v, void *pages,
                   const int64_t *table, const int64_t *rows, const int64_t *pos) {
    const int64_t n = s->num_tokens * s->num_kv_heads, d = s->head_dim;
#pragma omp parallel for schedule(static) if (n * d > 65536)
    for (int64_t i = 0; i < n; i++) {
        int64_t t = i / s->num_kv_heads, g = i % s->num_kv_heads;
        for (int64_t half = 0; half < 2; half++) {
            const float *src = (half ? v : k) + i * d;
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

static inline float dot_f32(const float *a, const float *b, int64_t d) {
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int64_t x = 0; x < d; x++) acc += a[x] * b[x];
    return acc;
}

static inline float dot_bf16(const float *a, const uint16_t *b, int64_t d) {
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int64_t x = 0; x < d; x++) acc += a[x] * bf16_to_f32(b[x]);
    return acc;
}

static inline void axpy_f32(float *y, float w, const float *x, int64_t d) {
#pragma omp simd
    for (int64_t i = 0; i < d; i++) y[i] += w * x[i];
}

static inline void axpy_bf16(float *y, float w, const uint16_t *x, int64_t d) {
#pragma omp simd
    for (int64_t i = 0; i < d; i++) y[i] += w * bf16_to_f32(x[i]);
}

/* One token, one kv head: its `group` query heads at once (each key is loaded once). */
static void attend(const hk_attn_shape *s, const float *q, float *out, const void *pages,
                   const int64_t *table, int64_t row, int64_t p, int64_t g, const float *sinks,
                   float *scores) {
    const int64_t group = s->num_heads / s->num_kv_heads, d = s->head_dim;
    const int64_t lo = (s->window > 0 && p - s->window + 1 > 0) ? p - s->window + 1 : 0;
    const int64_t n = p - lo + 1;
    for (int64_t h = 0; h < group; h++) {
        const float *qh = q + h * d;
        float *sh = scores + h * n;
        for (int64_t j = 0; j < n; j++) {
            int64_t at = slot(s, table, row, lo + j, 0, g);
            float x = s->bf16 ? dot_bf16(qh, (const uint16_t *)pages + at, d)
                              : dot_f32(qh, (const float *)pages + at, d);
            x *= s->scale;
            if (s->softcap > 0.0f) x = s->softcap * tanhf(x / s->softcap);
            sh[j] = x;
        }
        float m = sinks ? sinks[g * group + h] : -INFINITY;
        for (int64_t j = 0; j < n; j++) m = sh[j] > m ? sh[j] : m;
        float total = sinks ? expf(sinks[g * group + h] - m) : 0.0f;
        for (int64_t j = 0; j < n; j++) {
            sh[j] = expf(sh[j] - m);
            total += sh[j];
        }
        float *oh = out + h * d;
        memset(oh, 0, (size_t)d * sizeof(float));
        for (int64_t j = 0; j < n; j++) {
            int64_t at = slot(s, table, row, lo + j, 1, g);
            if (s->bf16)
                axpy_bf16(oh, sh[j], (const uint16_t *)pages + at, d);
            else
                axpy_f32(oh, sh[j], (const float *)pages + at, d);
        }
        float inv = 1.0f / total;
        for (int64_t x = 0; x < d; x++) oh[x] *= inv;
    }
}

/* q, out: float32 [T][H][d]. Returns 0, or -1 when scratch memory ran out. */
int hk_attn(const hk_attn_shape *s, const float *q, float *out, const void *pages,
            const int64_t *table, const int64_t *rows, const int64_t *pos, const float *sinks) {
    const int64_t group = s->num_heads / s->num_kv_heads, d = s->head_dim;
    const int64_t n = s->num_tokens * s->num_kv_heads;
    int64_t longest = 1;
    for (int64_t t = 0; t < s->num_tokens; t++) longest = pos[t] + 1 > longest ? pos[t] + 1 : longest;
    if (s->window > 0 && s->window < longest) longest = s->window;
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
        float *scores = malloc((size_t)(group * longest) * sizeof(float));
        if (!scores) failed = 1;
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < n; i++) {
            if (!scores) continue;
            int64_t t = i / s->num_kv_heads, g = i % s->num_kv_heads;
            int64_t head = t * s->num_heads + g * group;
            attend(s, q + head * d, out + head * d, pages, table, rows[t], pos[t], g, sinks,
                   scores);
        }
        free(scores);
    }
    return failed ? -1 : 0;
}
