/* One Mamba2 decode step, fused: for each row r (one token of one request), from the token's
 * input projection [gate | xbc | dt] straight to the mixer's pre-norm output y, with the conv
 * and SSM states of the row's slot updated in place:
 *     xbc' = silu(conv(slot's last k - 1 inputs, xbc));  dt' = clamp(softplus(dt + dt_bias))
 *     S = exp(dt' a_h) S + (dt' x) b^T;   y = S c + D_h x
 * where x, b, c are xbc' split (x per head [p], b and c per group [n]) and S is [p][n];
 * with a norm weight, y then goes through the gated RMS norm with the token's gate
 * (gated_norm_row, the same code as hk_gated_rms_norm) before it is written.
 * The torch version (model/layers/mamba2.py Mamba2Mixer._decode) is ~20 tensor ops per layer
 * and reads and writes the state twice; here the state is read and written once and nothing
 * is gathered or scattered. Each output is computed by one thread in a fixed order: results
 * do not depend on the thread count. Callers (hybridkv/native/ssm.py) check shapes, strides
 * and dtypes; the slot and token indices are checked here before anything is written. */

#include <math.h>
#include <stdint.h>

#include "ssm_act.h"

/* state rows prefetched ahead: the state comes from memory (the weights stream through the
 * caches between two steps); ~12% faster at decode sizes */
#define PF_ROWS 16

/* Mirrors hybridkv/native/ssm.py MambaStep. */
typedef struct {
    float *conv_states;   /* [num_slots][C][k - 1] */
    float *ssm_states;    /* [num_slots][H][P][N] */
    const int64_t *slots; /* [rows] */
    const int64_t *tokens; /* [rows] the row's token in proj and y */
    const float *proj;    /* [num_tokens][proj_stride]: xbc at xbc_at, dt at dt_at */
    const float *conv_w;  /* [C][k] */
    const float *conv_b;  /* [C] or NULL */
    const float *dt_bias; /* [H] */
    const float *a;       /* [H] = -exp(A_log) */
    const float *d;       /* [H] or NULL */
    float *act;           /* [rows][C] scratch: silu(conv) */
    float *dts;           /* [rows][H] scratch: dt' */
    float *ys;            /* [rows][H * P] scratch: y before the norm (used with norm_w) */
    float *y;             /* [num_tokens][y_stride]: row r's y at tokens[r], [H][P] */
    const float *norm_w;  /* [H * P] gated norm weight, or NULL: y written unnormalised */
    int64_t proj_stride, xbc_at, dt_at, y_stride;
    int64_t rows, num_slots, num_tokens, heads, groups, p_dim, n_dim, k;
    int64_t norm_groups, gate_first; /* gate_first: norm(y * silu(gate)); else norm(y) * silu */
    float dt_lo, dt_hi, eps;
} MambaStep;

/* Conv step of one row over all C channels: window = slot's k - 1 inputs then x. */
static void conv_row(const MambaStep *g, int64_t r) {
    const int64_t channels = g->heads * g->p_dim + 2 * g->groups * g->n_dim, keep = g->k - 1;
    float *st = g->conv_states + g->slots[r] * channels * keep, *out = g->act + r * channels;
    const float *x = g->proj + g->tokens[r] * g->proj_stride + g->xbc_at;
    for (int64_t ch = 0; ch < channels; ch++) {
        float *s = st + ch * keep;
        const float *w = g->conv_w + ch * g->k;
        float acc = 0.0f;
        for (int64_t j = 0; j < keep; j++) acc += s[j] * w[j];
        acc += x[ch] * w[keep];
        if (g->conv_b) acc += g->conv_b[ch];
        for (int64_t j = 0; j + 1 < keep; j++) s[j] = s[j + 1];
        if (keep > 0) s[keep - 1] = x[ch];
        out[ch] = acc;
    }
#pragma omp simd
    for (int64_t ch = 0; ch < channels; ch++) out[ch] = silu(out[ch]);
    const float *dt = g->proj + g->tokens[r] * g->proj_stride + g->dt_at;
    for (int64_t h = 0; h < g->heads; h++)
        g->dts[r * g->heads + h] = softplus_clamp(dt[h] + g->dt_bias[h], g->dt_lo, g->dt_hi);
}

/* SSM step of row r, head h: one pass over the slot's [P][N] state. */
static void ssd_head(const MambaStep *g, int64_t r, int64_t h) {
    const int64_t inner = g->heads * g->p_dim, span = g->groups * g->n_dim;
    const int64_t grp = h / (g->heads / g->groups), n_dim = g->n_dim;
    const float step = g->dts[r * g->heads + h], decay = expf(step * g->a[h]);
    const float skip = g->d ? g->d[h] : 0.0f;
    const float *xv = g->act + r * (inner + 2 * span) + h * g->p_dim;
    const float *bv = g->act + r * (inner + 2 * span) + inner + grp * n_dim, *cv = bv + span;
    float *s = g->ssm_states + (g->slots[r] * g->heads + h) * g->p_dim * n_dim;
    float *yv = g->norm_w ? g->ys + r * inner : g->y + g->tokens[r] * g->y_stride;
    yv += h * g->p_dim;
    for (int64_t p = 0; p < g->p_dim; p++) {
        const float xp = step * xv[p];
        float *row = s + p * n_dim, acc = 0.0f;
        for (int64_t n = 0; n < n_dim; n += 16) /* 64-byte lines; past the slot is harmless */
            __builtin_prefetch(row + PF_ROWS * n_dim + n, 1, 3);
#pragma omp simd reduction(+ : acc)
        for (int64_t n = 0; n < n_dim; n++) {
            const float v = row[n] * decay + xp * bv[n];
            row[n] = v;
            acc += v * cv[n];
        }
        yv[p] = acc + xv[p] * skip;
    }
}

/* Returns 0, or -1 (nothing written) if a slot or token index is out of range. */
int hk_mamba_step(const MambaStep *g) {
    for (int64_t r = 0; r < g->rows; r++) {
        if (g->slots[r] < 0 || g->slots[r] >= g->num_slots) return -1;
        if (g->tokens[r] < 0 || g->tokens[r] >= g->num_tokens) return -1;
    }
    const int64_t work = g->rows * g->heads;
#pragma omp parallel if (work * g->p_dim * g->n_dim > 262144)
    {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < g->rows; r++) conv_row(g, r);
#pragma omp for schedule(static)
        for (int64_t rh = 0; rh < work; rh++) ssd_head(g, rh / g->heads, rh % g->heads);
        if (g->norm_w) {
            const int64_t dim = g->heads * g->p_dim;
#pragma omp for schedule(static)
            for (int64_t r = 0; r < g->rows; r++)
                gated_norm_row(g->ys + r * dim, g->proj + g->tokens[r] * g->proj_stride,
                               g->norm_w, g->y + g->tokens[r] * g->y_stride, dim,
                               g->norm_groups, g->eps, (int)g->gate_first);
        }
    }
    return 0;
}
