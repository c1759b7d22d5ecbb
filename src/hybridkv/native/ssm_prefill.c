/* Mamba2 prefill in native code: the causal depthwise conv (+ SiLU) over each request's tokens
 * and the SSM recurrence run token by token, both reading and writing the state slots in place.
 *
 * The torch version (model/layers/ssd.py ssd_chunk_scan) is the chunked "SSD" form: l x l
 * score matrices per chunk and head, built from exp of segment sums; on a CPU its einsums and
 * temporaries cost far more than the recurrence itself. Here each (request, head) runs
 *     S_t = exp(dt_t a) S_{t-1} + (dt_t x_t) b_t^T;   y_t = S_t c_t + D x_t
 * directly: 3 vector ops per 16 state values per token, no l x l work. The state is held
 * transposed ([n][p], p in vector lanes) so y needs no horizontal sums; a tile of NT n-rows by
 * one vector of p stays in registers over a block of TB tokens. Every output is computed by
 * one thread in a fixed order: results do not depend on the thread count.
 * Callers (hybridkv/native/ssm_prefill.py) check shapes, strides, dtypes and bounds.
 *
 * This file: the conv (hk_conv_chunk), the scan's entry point (hk_ssd_scan) and the gated
 * norm (hk_gated_rms_norm); the scan's working set and kernels are in ssm_scan.h. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ssm_act.h"
#include "ssm_scan.h"

#define CB 256  /* channels per conv work item */

/* Conv input i of row r: i < k - 1 from the slot's saved inputs (copied to head), else token
 * i - (k - 1) of the row. */
static inline const float *conv_input(const float *head, const float *x, int64_t x_stride,
                                      int64_t i, int64_t k) {
    return i < k - 1 ? head + i * CB : x + (i - (k - 1)) * x_stride;
}

/* Rows r = 0..R-1: tokens starts[r] .. starts[r] + lens[r] - 1 of x ([T][C], row stride
 * x_stride) continue from states[slots[r]] ([S][C][k - 1], the last k - 1 inputs);
 * out[tok][ch] = silu(bias[ch] + sum_j wt[j][ch] * input(t + j)) (out: row stride out_stride,
 * may be x itself; bias may be NULL; wt: [k][C]). Tap q (tap_rows/tap_lens/tap_slots, n_taps)
 * gets the k - 1 inputs before token tap_lens[q] of its row; then each row's slot gets its last
 * k - 1 inputs. The last k - 1 raw inputs ride in a ring, so writing out over x is safe. */
void hk_conv_chunk(float *states, const int64_t *slots, const int64_t *starts,
                   const int64_t *lens, int64_t rows, const float *x, int64_t x_stride,
                   const float *wt, const float *bias, float *out, int64_t out_stride,
                   int64_t channels, int64_t k, const int64_t *tap_rows,
                   const int64_t *tap_lens, const int64_t *tap_slots, int64_t n_taps) {
    const int64_t blocks = (channels + CB - 1) / CB, keep = k - 1;
#pragma omp parallel for schedule(dynamic, 1) if (rows * blocks > 1)
    for (int64_t item = 0; item < rows * blocks; item++) {
        const int64_t r = item / blocks, c0 = item % blocks * CB;
        const int64_t width = channels - c0 < CB ? channels - c0 : CB, len = lens[r];
        float ring[CB * 8], acc[CB]; /* k - 1 <= 8 saved inputs, checked by the caller */
        float *st = states + slots[r] * channels * keep;
        const float *xr = x + starts[r] * x_stride + c0;
        for (int64_t j = 0; j < keep; j++)
            for (int64_t ch = 0; ch < width; ch++) ring[j * CB + ch] = st[(c0 + ch) * keep + j];
        for (int64_t q = 0; q < n_taps; q++) { /* before any output overwrites an input */
            if (tap_rows[q] != r) continue;
            float *dst = states + tap_slots[q] * channels * keep;
            for (int64_t j = 0; j < keep; j++) {
                const float *in = conv_input(ring, xr, x_stride, tap_lens[q] + j, k);
                for (int64_t ch = 0; ch < width; ch++) dst[(c0 + ch) * keep + j] = in[ch];
            }
        }
        int64_t oldest = 0; /* ring slot of the oldest saved input */
        for (int64_t t = 0; t < len; t++) {
            const float *now = xr + t * x_stride, *w_now = wt + keep * channels + c0;
#pragma omp simd
            for (int64_t ch = 0; ch < width; ch++)
                acc[ch] = (bias ? bias[c0 + ch] : 0.0f) + w_now[ch] * now[ch];
            for (int64_t j = 0; j < keep; j++) {
                const float *in = ring + (oldest + j) % keep * CB, *w = wt + j * channels + c0;
#pragma omp simd
                for (int64_t ch = 0; ch < width; ch++) acc[ch] += w[ch] * in[ch];
            }
            float *o = out + (starts[r] + t) * out_stride + c0, *slot = ring + oldest * CB;
#pragma omp simd
            for (int64_t ch = 0; ch < width; ch++) {
                slot[ch] = now[ch];
                o[ch] = silu(acc[ch]);
            }
            oldest = (oldest + 1) % keep;
        }
        for (int64_t j = 0; j < keep; j++) {
            const float *in = ring + (oldest + j) % keep * CB;
            for (int64_t ch = 0; ch < width; ch++) st[(c0 + ch) * keep + j] = in[ch];
        }
    }
}

/* Row r's tokens starts[r] .. starts[r] + lens[r] - 1: x, b, c of token tok are act[tok][h * P
 * + p], act[tok][b_off + g * N + n], act[tok][c_off + g * N + n] (row stride act_stride, head h
 * in group h / (H / G)); dt: [T][H] (softplus and limits applied); a, d: [H] (d may be NULL);
 * states: [S][H][P][N], row r starting from and ending in slot slots[r]; y[tok][h * P + p]
 * (row stride y_stride). Row r's taps are tap_ptr[r] .. tap_ptr[r + 1] - 1 (ascending
 * tap_lens): the state after tap_lens[q] tokens goes to slot tap_slots[q]. A work item is
 * `span` heads of one row (each head's arithmetic is the same whatever the span). Returns 0, or
 * -1 when out of memory (outputs then incomplete). */
int hk_ssd_scan(float *states, const int64_t *slots, const int64_t *starts, const int64_t *lens,
                int64_t rows, const float *act, int64_t act_stride, int64_t b_off, int64_t c_off,
                const float *dt, const float *a, const float *d, float *y, int64_t y_stride,
                int64_t heads, int64_t groups, int64_t p_dim, int64_t n_dim,
                const int64_t *tap_ptr, const int64_t *tap_lens, const int64_t *tap_slots,
                int64_t span) {
    const ScanArgs g = {states, slots,  starts,  lens,  act,   dt,    a,     d,
                        act_stride, b_off, c_off, y,   y_stride, heads, groups, p_dim,
                        n_dim,  tap_ptr, tap_lens, tap_slots};
    const int64_t per_row = (heads + span - 1) / span; /* work items: span heads of a row */
    int failed = 0;
#pragma omp parallel reduction(| : failed) if (rows * per_row > 1)
    {
        ScanBuf w;
        if (!scan_buf_init(&w, p_dim, n_dim, span)) failed = 1;
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < rows * per_row; item++) {
            const int64_t r = item / per_row, h0 = item % per_row * span;
            if (!failed) scan_heads(&g, &w, r, h0, h0 + span < heads ? h0 + span : heads);
        }
        scan_buf_free(&w);
    }
    return failed ? -1 : 0;
}

/* The Mamba2 output norm (model/layers/norm.py GatedRMSNorm), one pass per token: with
 * gate_first, v = y * silu(gate) RMS-normalised per group of dim / groups channels, times
 * weight; else y normalised per group, times weight, times silu(gate). y: [T][dim] (row stride
 * y_stride), gate: row stride gate_stride, weight: [dim], out: [T][dim] contiguous. */
void hk_gated_rms_norm(const float *y, int64_t y_stride, const float *gate, int64_t gate_stride,
                       const float *weight, float *out, int64_t tokens, int64_t dim,
                       int64_t groups, float eps, int gate_first) {
#pragma omp parallel for schedule(static) if (tokens * dim > 65536)
    for (int64_t t = 0; t < tokens; t++)
        gated_norm_row(y + t * y_stride, gate + t * gate_stride, weight, out + t * dim, dim,
                       groups, eps, gate_first);
}
