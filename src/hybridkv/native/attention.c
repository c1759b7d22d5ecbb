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
 * Callers (hybridkv/native/attention.py) check shapes, dtypes and table bounds.
 *
 * One translation unit in four files: attention_common.h (shape, slots, rows, vectors,
 * softmax), attention_tile.h (a tile of queries and one kv head), attention_decode.h (a lone
 * query, all heads); this file splits the step into tiles and work items and runs them. */

#include <stdint.h>
#include <stdlib.h>

#include "attention_common.h"
#include "attention_tile.h"
#include "attention_decode.h"

#define PARALLEL_WORK 200000 /* ~20 us of one core: less is not worth waking threads */

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
