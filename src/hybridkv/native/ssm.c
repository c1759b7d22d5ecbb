/* One Mamba2 decode step in one pass over the state: per row r and head h,
 *     S = exp(dt a_h) S + (dt x) b^T;   y = S c + D_h x
 * where S is [p][n], x [p], b and c [n] (the head's group's). The torch version
 * (model/layers/ssd.py ssd_step_) reads and writes the state twice and reads it a third time
 * for y; decode of a Mamba2 layer is bound by that traffic. Callers (hybridkv/native/ssm.py)
 * check shapes, strides and dtypes. */

#include <math.h>
#include <stdint.h>

/* states: [slots][H][P][N] contiguous, row r's state is slot slots[r]; x: [R][H][P];
 * dt: [R][H]; a, d: [H] (d may be NULL); b, c: [R][G][N] with H / G heads per group;
 * y: [R][H][P]. All float32, contiguous. */
void hk_ssd_step(float *states, const int64_t *slots, const float *x, const float *dt,
                 const float *a, const float *d, const float *b, const float *c, float *y,
                 int64_t rows, int64_t heads, int64_t groups, int64_t p_dim, int64_t n_dim) {
    const int64_t per_group = heads / groups;
#pragma omp parallel for schedule(static) if (rows * heads * p_dim * n_dim > 262144)
    for (int64_t rh = 0; rh < rows * heads; rh++) {
        const int64_t r = rh / heads, h = rh % heads, g = h / per_group;
        const float step = dt[rh], decay = expf(step * a[h]), skip = d ? d[h] : 0.0f;
        const float *bv = b + (r * groups + g) * n_dim, *cv = c + (r * groups + g) * n_dim;
        const float *xv = x + rh * p_dim;
        float *s = states + (slots[r] * heads + h) * p_dim * n_dim, *yv = y + rh * p_dim;
        for (int64_t p = 0; p < p_dim; p++) {
            const float xp = step * xv[p];
            float *row = s + p * n_dim, acc = 0.0f;
#pragma omp simd reduction(+ : acc)
            for (int64_t n = 0; n < n_dim; n++) {
                const float v = row[n] * decay + xp * bv[n];
                row[n] = v;
                acc += v * cv[n];
            }
            yv[p] = acc + xv[p] * skip;
        }
    }
}

/* One causal depthwise conv step per row, in place on the slots: row r's window is
 * states[slots[r]][ch][0 .. k-2] then x[r][ch]; out[r][ch] = sum(window * w[ch]) + bias[ch]
 * (bias may be NULL), then the window minus its oldest input is written back.
 * states: [S][C][k - 1]; x: [R][C] (row stride x_stride); w: [C][k]; out: [R][C]. */
void hk_conv_step(float *states, const int64_t *slots, const float *x, int64_t x_stride,
                  const float *w, const float *bias, float *out, int64_t rows,
                  int64_t channels, int64_t k) {
#pragma omp parallel for schedule(static) if (rows * channels * k > 262144)
    for (int64_t r = 0; r < rows; r++) {
        float *st = states + slots[r] * channels * (k - 1);
        const float *xr = x + r * x_stride;
        float *o = out + r * channels;
        for (int64_t ch = 0; ch < channels; ch++) {
            float *s = st + ch * (k - 1);
            const float *wc = w + ch * k;
            float acc = 0.0f;
            for (int64_t j = 0; j < k - 1; j++) acc += s[j] * wc[j];
            acc += xr[ch] * wc[k - 1];
            o[ch] = bias ? acc + bias[ch] : acc;
            for (int64_t j = 0; j + 1 < k - 1; j++) s[j] = s[j + 1];
            if (k > 1) s[k - 2] = xr[ch];
        }
    }
}
