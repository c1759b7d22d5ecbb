/* A tile's vector accumulators to floats, shared by quant.c and mxfp4.c (included after their
 * `vf`, `VW` and `NR`): lanes are added in one fixed tree, so a row's result does not depend on
 * the batch or the thread that computed it. */

static float lanes_sum(vf v) { /* lanes added pairwise: (0+1)+(2+3), ...: one fixed tree */
    float a[VW];
    memcpy(a, &v, sizeof a);
    for (int width = VW / 2; width >= 1; width /= 2)
        for (int l = 0; l < width; l++) a[l] = a[2 * l] + a[2 * l + 1];
    return a[0];
}

/* y[i][j] = the sum of acc[i * NR + j]'s lanes (+ bias[j]) */
static inline __attribute__((always_inline)) void store_sums(const vf *acc, const float *bias,
                                                             float *y, int64_t ldy, int mr,
                                                             int nr) {
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            const float s = lanes_sum(acc[i * NR + j]);
            y[i * ldy + j] = bias ? s + bias[j] : s;
        }
}
