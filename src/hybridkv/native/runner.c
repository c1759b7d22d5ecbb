/* A decode program: a model's decode step as a flat array of op records, run in one call.
 *
 * The program (built once per model by hybridkv/model/compiled/, packed by
 * hybridkv/native/runner.py) names pre-allocated float32 buffers, the weights and the
 * kernels' arguments that never change; the values of one step (its token count, positions,
 * each attention group's block table, each state group's slots) come in hk_step. Every op
 * calls one of the existing kernels (rownorm.c, gemm.c, quant.c, attention.c, ssm.c) through
 * the function pointers of hk_kernels, with the same arguments the Python step passes them:
 * the same code, the same numbers. The runner's own ops only copy bytes (no arithmetic).
 *
 * Op arguments by kind (p: pointers, n: integers, f: floats; rows are the step's T tokens):
 *   NORM       hk_rms_norm(p0 x, T, n0 heads, n1 dim, n2 stride, p1 residual, p2 scale,
 *              n3 scale rows, p3 out, f0 eps, f1 x_scale)
 *   NORM_ROPE  hk_rms_norm_rope(p0 x, T, n0, n1, n2, p2 scale, n3, f0, p4 cos, p5 sin,
 *              n4 rot, positions)
 *   ROPE       hk_rope(p0 x, T, n0, n1, n2, p4 cos, p5 sin, n4 rot, positions)
 *   GEMM       p0 x (row stride n0) by p1 weight [n1 N][n2 K] (+ p2 bias) -> p3 out [T][N];
 *              n3 < 0: float32 (hk_skinny_gemm), else GGML type n3 (hk_quant_gemm, or with
 *              n4 = 1 hk_quant_gemm_i8)
 *   ATTN       hk_attn over attention group n9 of the step: q p0, k p1, v p2 -> out p3,
 *              pages p4, sinks p5; n0 heads, n1 kv heads, n2 head dim, n3 block size,
 *              n4 block stride, n5 bf16, n6..n8 q/k/v token strides; f0 scale, f1 softcap
 *   ACT_MUL    hk_act_mul(p0 gate|up, T, n0 inner, n1 stride, n2 act, p1 out)
 *   MAMBA      hk_mamba_step over state group n12 of the step (see mamba_op)
 *   COPY       T rows of n0 floats: p0 (row stride n1) -> p1 (row stride n2)
 *   EMBED      each token's row of the table p0 ([n1 rows] of n0 values: float32, or GGML
 *              type n2 >= 0 in rows of n3 bytes, dequantized by hk_quant_dequantize) -> p1
 *              (row stride n4), times f0 when n5 (runner_rows.h)
 *   DIV        T rows of n0 floats at p0 (row stride n1) divided by f0 in place
 *   ARGMAX     each of T rows of n0 floats at p0 (row stride n1): the first index of its
 *              maximum -> p1 (int64 [T]), the maximum -> p2 (float [T]); NaN if the row has one
 */

#include <stdint.h>
#include <string.h>

#include "runner_rows.h"

enum {
    OP_NORM = 1, OP_NORM_ROPE, OP_ROPE, OP_GEMM, OP_ATTN, OP_ACT_MUL, OP_MAMBA, OP_COPY,
    OP_EMBED, OP_DIV, OP_ARGMAX
};

/* Mirrors hybridkv/native/runner.py Op. */
typedef struct {
    int64_t kind;
    int64_t n[14];
    void *p[12];
    float f[4];
} hk_op;

typedef struct {
    const int64_t *table; /* [R][table_stride] */
    int64_t table_stride, window;
    const int64_t *rows, *positions; /* [T] */
} hk_attn_group;

typedef struct {
    const int64_t *slots, *tokens; /* [rows] */
    int64_t rows;
} hk_state_group;

typedef struct {
    int64_t num_tokens, threads;
    const int64_t *positions; /* [T] */
    const hk_attn_group *attn;
    const hk_state_group *states;
    const int64_t *ids; /* [T] token ids (EMBED) */
} hk_step;

/* Mirrors attention_common.h hk_attn_shape. */
typedef struct {
    int64_t num_tokens, num_heads, num_kv_heads, head_dim, block_size, block_stride;
    int64_t table_stride, window, bf16, q_stride, k_stride, v_stride;
    float scale, softcap;
} attn_shape;

/* Mirrors ssm.c MambaStep. */
typedef struct {
    float *conv_states, *ssm_states;
    const int64_t *slots, *tokens;
    const float *proj, *conv_w, *conv_b, *dt_bias, *a, *d;
    float *act, *dts, *ys, *y;
    const float *norm_w;
    int64_t proj_stride, xbc_at, dt_at, y_stride;
    int64_t rows, num_slots, num_tokens, heads, groups, p_dim, n_dim, k;
    int64_t norm_groups, gate_first;
    float dt_lo, dt_hi, eps;
} mamba_args;

typedef void (*norm_fn)(const float *, int64_t, int64_t, int64_t, int64_t, float *,
                        const float *, int64_t, float *, float, float);
typedef void (*norm_rope_fn)(float *, int64_t, int64_t, int64_t, int64_t, const float *,
                             int64_t, float, const float *, const float *, int64_t,
                             const int64_t *);
typedef void (*rope_fn)(float *, int64_t, int64_t, int64_t, int64_t, const float *,
                        const float *, int64_t, const int64_t *);
typedef void (*act_mul_fn)(const float *, int64_t, int64_t, int64_t, int64_t, float *);
typedef void (*gemm_fn)(const float *, int64_t, int64_t, const float *, int64_t, int64_t,
                        const float *, float *, int);
typedef int (*qgemm_fn)(int, const float *, int64_t, int64_t, const uint8_t *, int64_t, int64_t,
                        const float *, float *, int);
typedef int (*attn_fn)(const attn_shape *, const float *, const float *, const float *, float *,
                       void *, const int64_t *, const int64_t *, const int64_t *, const float *);
typedef int (*mamba_fn)(const mamba_args *);
typedef void (*dequant_fn)(int, const uint8_t *, int64_t, int64_t, float *, int);

/* Mirrors hybridkv/native/runner.py Kernels: the kernels' entry points. */
typedef struct {
    norm_fn norm;
    norm_rope_fn norm_rope;
    rope_fn rope;
    act_mul_fn act_mul;
    gemm_fn gemm;
    qgemm_fn qgemm, qgemm_i8;
    attn_fn attn;
    mamba_fn mamba;
    dequant_fn dequant;
} hk_kernels;

static int gemm_op(const hk_kernels *k, const hk_op *o, const hk_step *s) {
    const int64_t T = s->num_tokens, ldx = o->n[0], N = o->n[1], K = o->n[2];
    const int threads = (int)s->threads;
    if (o->n[3] < 0) {
        k->gemm(o->p[0], T, ldx, o->p[1], N, K, o->p[2], o->p[3], threads);
        return 0;
    }
    qgemm_fn fn = o->n[4] ? k->qgemm_i8 : k->qgemm;
    return fn((int)o->n[3], o->p[0], T, ldx, o->p[1], N, K, o->p[2], o->p[3], threads);
}

static int attn_op(const hk_kernels *k, const hk_op *o, const hk_step *s) {
    const hk_attn_group *g = &s->attn[o->n[9]];
    const attn_shape shape = {s->num_tokens, o->n[0], o->n[1], o->n[2], o->n[3], o->n[4],
                              g->table_stride, g->window, o->n[5], o->n[6], o->n[7], o->n[8],
                              o->f[0], o->f[1]};
    return k->attn(&shape, o->p[0], o->p[1], o->p[2], o->p[3], o->p[4], g->table, g->rows,
                   g->positions, o->p[5]);
}

/* p0 conv states, p1 ssm states, p2 proj, p3 conv_w, p4 conv_b, p5 dt_bias, p6 a, p7 d,
 * p8 scratch ([rows][C + H + inner]), p9 y, p10 norm weight; n0 proj stride, n1 xbc at,
 * n2 dt at, n3 y stride, n4 slots, n5 heads, n6 groups, n7 p, n8 n, n9 conv k,
 * n10 norm groups, n11 gate first, n12 state group; f0 dt lo, f1 dt hi, f2 eps. */
static int mamba_op(const hk_kernels *k, const hk_op *o, const hk_step *s) {
    const hk_state_group *g = &s->states[o->n[12]];
    const int64_t inner = o->n[5] * o->n[7];
    const int64_t channels = inner + 2 * o->n[6] * o->n[8];
    float *scratch = o->p[8];
    const mamba_args a = {
        o->p[0], o->p[1], g->slots, g->tokens, o->p[2], o->p[3], o->p[4], o->p[5], o->p[6],
        o->p[7], scratch, scratch + g->rows * channels,
        scratch + g->rows * (channels + o->n[5]), o->p[9], o->p[10],
        o->n[0], o->n[1], o->n[2], o->n[3], g->rows, o->n[4], s->num_tokens, o->n[5], o->n[6],
        o->n[7], o->n[8], o->n[9], o->n[10], o->n[11], o->f[0], o->f[1], o->f[2]};
    return k->mamba(&a);
}

static void copy_op(const hk_op *o, const hk_step *s) {
    const float *src = o->p[0];
    float *dst = o->p[1];
    for (int64_t t = 0; t < s->num_tokens; t++)
        memcpy(dst + t * o->n[2], src + t * o->n[1], (size_t)o->n[0] * sizeof(float));
}

/* p0 table, p1 out; n0 K, n1 rows, n2 GGML type (< 0: float32), n3 row bytes, n4 out
 * stride, n5 scaled; f0 scale. Returns 1 for a token id outside the table. */
static int embed_op(const hk_kernels *k, const hk_op *o, const hk_step *s) {
    const int64_t K = o->n[0];
    for (int64_t t = 0; t < s->num_tokens; t++) {
        const int64_t id = s->ids[t];
        float *out = (float *)o->p[1] + t * o->n[4];
        if (id < 0 || id >= o->n[1]) return 1;
        if (o->n[2] < 0)
            memcpy(out, (const float *)o->p[0] + id * K, (size_t)K * sizeof(float));
        else
            k->dequant((int)o->n[2], (const uint8_t *)o->p[0] + id * o->n[3], 1, K, out, 1);
        if (o->n[5]) scale_row(out, K, o->f[0]);
    }
    return 0;
}

static int run_op(const hk_kernels *k, const hk_op *o, const hk_step *s) {
    const int64_t T = s->num_tokens;
    switch (o->kind) {
    case OP_NORM:
        k->norm(o->p[0], T, o->n[0], o->n[1], o->n[2], o->p[1], o->p[2], o->n[3], o->p[3],
                o->f[0], o->f[1]);
        return 0;
    case OP_NORM_ROPE:
        k->norm_rope(o->p[0], T, o->n[0], o->n[1], o->n[2], o->p[2], o->n[3], o->f[0], o->p[4],
                     o->p[5], o->n[4], s->positions);
        return 0;
    case OP_ROPE:
        k->rope(o->p[0], T, o->n[0], o->n[1], o->n[2], o->p[4], o->p[5], o->n[4], s->positions);
        return 0;
    case OP_GEMM:
        return gemm_op(k, o, s);
    case OP_ATTN:
        return attn_op(k, o, s);
    case OP_ACT_MUL:
        k->act_mul(o->p[0], T, o->n[0], o->n[1], o->n[2], o->p[1]);
        return 0;
    case OP_MAMBA:
        return mamba_op(k, o, s);
    case OP_COPY:
        copy_op(o, s);
        return 0;
    case OP_EMBED:
        return embed_op(k, o, s);
    case OP_DIV:
        for (int64_t t = 0; t < T; t++) div_row((float *)o->p[0] + t * o->n[1], o->n[0], o->f[0]);
        return 0;
    case OP_ARGMAX:
        for (int64_t t = 0; t < T; t++)
            argmax_row((const float *)o->p[0] + t * o->n[1], o->n[0], (int64_t *)o->p[1] + t,
                       (float *)o->p[2] + t);
        return 0;
    default:
        return -1;
    }
}

/* Runs ops[0 .. num_ops) in order. Returns 0, or 1 + the index of the op that failed (an
 * unknown kind, a kernel out of scratch memory, a state slot out of range). */
int64_t hk_run(const hk_kernels *k, const hk_op *ops, int64_t num_ops, const hk_step *s) {
    for (int64_t i = 0; i < num_ops; i++)
        if (run_op(k, &ops[i], s) != 0) return i + 1;
    return 0;
}
