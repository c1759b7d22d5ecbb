/* The Mamba2 prefill scan's pieces (included by ssm_prefill.c only: one translation unit, and
 * the library's cache key covers this directory's headers, hybridkv/native/__init__.py).
 *
 * Vector width and tile sizes, one (request, head)'s working set (ScanBuf: the state
 * transposed and padded, a staged block of tokens in the scaled form below), the register-tile
 * kernel (scan_tile), the staging of a block (stage_block) and the walk of a row's heads block
 * by block (scan_heads), taps included. hk_ssd_scan in ssm_prefill.c hands out the work items;
 * nothing here checks bounds (hybridkv/native/ssm_prefill.py does). */

#ifndef HK_SSM_SCAN_H
#define HK_SSM_SCAN_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vecmath.h"

#if defined(__AVX512F__)
#define VL 16 /* floats per vector */
#define NT 16 /* state n-rows per register tile */
#else
#define VL 8
#define NT 8
#endif
#define TB 128  /* tokens staged per block */
#define PREFETCH 6 /* tokens ahead the scan's staging prefetches */
#define ALIGN 64

typedef float vf __attribute__((vector_size(VL * sizeof(float))));

static inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

/* One (request, head)'s scan working set: the state transposed and padded ([np][pp]), and a
 * block of TB tokens staged padded: b and c ([TB][np]), y ([TB][pp]), and the scaled form of
 * the recurrence below: xs ([TB][pp]), rescale and dk ([TB]).
 *
 * Scaled form: inside a segment of tokens the tile keeps u = S / D, D the product of the
 * segment's decays so far, so a token costs u += (dt x / D) b^T (one multiply-add per state
 * value, no decay multiply) and y = D (u c). A segment ends before D would drop below
 * MIN_DECAY (1/D stays <= 2^20: the rounding of u, scaled back by D, is that of the direct
 * recurrence); its first token then applies the whole decay, u *= rescale, and starts D = 1. */
#define MIN_DECAY 9.5367431640625e-07f /* 2^-20 */

typedef struct {
    int64_t pp, np;
    float *st, *xs, *b, *c, *rescale, *dk, *y;
} ScanBuf;

#define SCAN_BUFS 7

static int scan_buf_init(ScanBuf *w, int64_t p_dim, int64_t n_dim, int64_t span) {
    w->pp = round_up(p_dim, VL);
    w->np = round_up(n_dim, NT);
    const int64_t sizes[SCAN_BUFS] = {span * w->np * w->pp, TB * w->pp, TB * w->np, TB * w->np,
                                      TB,            TB,         TB * w->pp};
    float **bufs[SCAN_BUFS] = {&w->st, &w->xs, &w->b, &w->c, &w->rescale, &w->dk, &w->y};
    int ok = 1;
    for (int i = 0; i < SCAN_BUFS; i++) {
        *bufs[i] = aligned_alloc(ALIGN, (size_t)round_up(sizes[i] * 4, ALIGN));
        if (*bufs[i]) memset(*bufs[i], 0, (size_t)sizes[i] * 4);
        ok = ok && *bufs[i];
    }
    return ok;
}

static void scan_buf_free(ScanBuf *w) {
    float *bufs[SCAN_BUFS] = {w->st, w->xs, w->b, w->c, w->rescale, w->dk, w->y};
    for (int i = 0; i < SCAN_BUFS; i++) free(bufs[i]);
}

static inline vf load_v(const float *src) {
    vf v;
    memcpy(&v, src, sizeof v);
    return v;
}

static inline void store_v(float *dst, vf v) { memcpy(dst, &v, sizeof v); }

/* A tile (n-rows n0 .. n0 + NT - 1, p lanes p0 .. p0 + VL - 1) written into a state [P][N]
 * (only the real p and n). Not inlined: the tile loop's registers must not get an address. */
__attribute__((noinline)) static void store_tile(const vf *s, float *dst, int64_t p0,
                                                 int64_t n0, int64_t p_dim, int64_t n_dim) {
    for (int64_t j = 0; j < NT && n0 + j < n_dim; j++)
        for (int64_t l = 0; l < VL && p0 + l < p_dim; l++) dst[(p0 + l) * n_dim + n0 + j] = s[j][l];
}

typedef struct {
    const int64_t *lens, *slots; /* this row's taps, ascending lens */
    int64_t count;
    float *states;
    int64_t head_off, p_dim, n_dim; /* a tap's state: states + slot * slot_size + head_off */
    int64_t slot_size;
} RowTaps;

/* Tokens t0 .. t0 + tb - 1 of the staged block through one register tile. */
static void scan_tile(const ScanBuf *w, float *st, int64_t tb, int64_t p0, int64_t n0,
                      int64_t t0, const RowTaps *taps) {
    vf u[NT];
    for (int j = 0; j < NT; j++) u[j] = load_v(st + (n0 + j) * w->pp + p0);
    int64_t q = 0;
    while (q < taps->count && taps->lens[q] <= t0) q++;
    for (int64_t i = 0; i < tb; i++) {
        const float *b = w->b + i * w->np + n0, *c = w->c + i * w->np + n0;
        if (w->rescale[i] >= 0.0f) {
            const float r = w->rescale[i];
#pragma GCC unroll 16
            for (int j = 0; j < NT; j++) u[j] *= r;
        }
        const vf xv = load_v(w->xs + i * w->pp + p0);
        vf acc[4] = {0};
#pragma GCC unroll 16
        for (int j = 0; j < NT; j++) {
            u[j] += xv * b[j];
            acc[j % 4] += u[j] * c[j];
        }
        vf *yv = (vf *)(w->y + i * w->pp + p0);
        *yv += ((acc[0] + acc[1]) + (acc[2] + acc[3])) * w->dk[i];
        for (; q < taps->count && taps->lens[q] == t0 + i + 1; q++) {
            float *dst = taps->states + taps->slots[q] * taps->slot_size + taps->head_off;
            vf s[NT];
            for (int j = 0; j < NT; j++) s[j] = u[j] * w->dk[i];
            store_tile(s, dst, p0, n0, taps->p_dim, taps->n_dim);
        }
    }
    const float last = w->dk[tb - 1];
    for (int j = 0; j < NT; j++) store_v(st + (n0 + j) * w->pp + p0, u[j] * last);
}

/* Everything the scan of one call shares. */
typedef struct {
    float *states;
    const int64_t *slots, *starts, *lens;
    const float *act, *dt, *a, *d;
    int64_t act_stride, b_off, c_off;
    float *y;
    int64_t y_stride, heads, groups, p_dim, n_dim;
    const int64_t *tap_ptr, *tap_lens, *tap_slots;
} ScanArgs;

/* Stage tokens t0 .. t0 + tb - 1 of row r, head h, with the segments of the scaled form (a
 * block starts a segment: the tile holds the state itself there). */
static void stage_block(const ScanArgs *g, ScanBuf *w, int64_t r, int64_t h, int64_t t0,
                        int64_t tb) {
    const int64_t grp = h / (g->heads / g->groups), P = g->p_dim, N = g->n_dim;
    float dk = 1.0f;
    for (int64_t i = 0; i < tb; i++) {
        const int64_t tok = g->starts[r] + t0 + i;
        const float *row = g->act + tok * g->act_stride, step = g->dt[tok * g->heads + h];
        const float *xv = row + h * P, *bv = row + g->b_off + grp * N, *cv = row + g->c_off + grp * N;
        if (i + PREFETCH < tb) { /* rows are far apart: ask for a later token's slices now */
            const float *later = row + PREFETCH * g->act_stride;
            for (int64_t off = 0; off < P; off += 16) __builtin_prefetch(later + h * P + off);
            for (int64_t off = 0; off < N; off += 16) {
                __builtin_prefetch(later + g->b_off + grp * N + off);
                __builtin_prefetch(later + g->c_off + grp * N + off);
            }
        }
        const float dec = expf(step * g->a[h]), next = dk * dec;
        w->rescale[i] = next < MIN_DECAY ? next : -1.0f;
        dk = next < MIN_DECAY ? 1.0f : next;
        w->dk[i] = dk;
        const float scale = step / dk;
        for (int64_t p = 0; p < P; p++) w->xs[i * w->pp + p] = scale * xv[p];
        memcpy(w->b + i * w->np, bv, (size_t)N * 4);
        memcpy(w->c + i * w->np, cv, (size_t)N * 4);
        memset(w->y + i * w->pp, 0, (size_t)w->pp * 4);
    }
}

/* Heads h0 .. h1 - 1 of row r, a block of tokens at a time through every head: the block's B
 * and C rows are shared by the heads of a group and stay in cache between them. */
static void scan_heads(const ScanArgs *g, ScanBuf *w, int64_t r, int64_t h0, int64_t h1) {
    const int64_t P = g->p_dim, N = g->n_dim, len = g->lens[r], tile = w->np * w->pp;
    const int64_t slot_size = g->heads * P * N, first = g->tap_ptr[r];
    float *row_state = g->states + g->slots[r] * slot_size;
    for (int64_t h = h0; h < h1; h++)
        for (int64_t n = 0; n < N; n++)
            for (int64_t p = 0; p < P; p++)
                w->st[(h - h0) * tile + n * w->pp + p] = row_state[h * P * N + p * N + n];
    for (int64_t t0 = 0; t0 < len; t0 += TB) {
        const int64_t tb = len - t0 < TB ? len - t0 : TB;
        for (int64_t h = h0; h < h1; h++) {
            RowTaps taps = {g->tap_lens + first, g->tap_slots + first, g->tap_ptr[r + 1] - first,
                            g->states,           h * P * N,           P,
                            N,                   slot_size};
            float *st = w->st + (h - h0) * tile;
            const float skip = g->d ? g->d[h] : 0.0f;
            stage_block(g, w, r, h, t0, tb);
            for (int64_t p0 = 0; p0 < w->pp; p0 += VL)
                for (int64_t n0 = 0; n0 < w->np; n0 += NT) scan_tile(w, st, tb, p0, n0, t0, &taps);
            for (int64_t i = 0; i < tb; i++) {
                const int64_t tok = g->starts[r] + t0 + i;
                const float *xv = g->act + tok * g->act_stride + h * P;
                float *yv = g->y + tok * g->y_stride + h * P;
                for (int64_t p = 0; p < P; p++) yv[p] = w->y[i * w->pp + p] + skip * xv[p];
            }
        }
    }
    for (int64_t h = h0; h < h1; h++)
        for (int64_t p = 0; p < P; p++)
            for (int64_t n = 0; n < N; n++)
                row_state[h * P * N + p * N + n] = w->st[(h - h0) * tile + n * w->pp + p];
}

#endif
