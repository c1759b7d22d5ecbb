/* The int8-activation path of quant.c (hk_quant_gemm_i8): y = x W^T with x quantized per row.
 *
 * Each x row is cut in blocks of QB values (Q8_0 weights: 32, Q4_K / Q6_K: 256, as llama.cpp's
 * Q8_0 / Q8_K activations), each block quantized on its own: dx = max|x| / 127,
 * xq = rint(x * (127 / max|x|)) in [-127, 127], and the sum of every 16 xq kept. A weight
 * block's product with xq is then exact int32s, the same integers on every ISA variant:
 *   AVX2:           vpmaddubsw (u8 x s8 -> s16 pairs) + vpmaddwd (x the sub-block scale);
 *   AVX-VNNI / AVX-512 VNNI: vpmaddubsw + vpdpwssd (K-quants), vpdpbusd (Q8_0);
 *   scalar:         plain C loops.
 * and becomes float once per weight block, with one rounding per multiply-add:
 *   Q8_0:  y += (d dx) * sum q xq            (as 8 lane sums of 4 values: quant_q8_0.h)
 *   Q4_K:  y += [(d dx) * sum_s sc[s] sum q xq  -  (dmin dx) * sum_s m[s] sum xq]  (s: 8 x 32)
 *   Q6_K:  y += (d dx) * sum_t sc[t] (sum q xq - 32 sum xq)                      (t: 16 x 16)
 * in block order: a row's result does not depend on the other rows or on the thread count.
 * With AVX-512 BW + VNNI the K-quants take quant_vnni512.h instead (the same integers).
 * int16 bounds of vpmaddubsw's pair sums: Q4_K 2*15*127, Q6_K 2*63*127, Q8_0 (|q| with x's sign
 * moved to it) 2*128*127 -- all < 32767, so nothing saturates. Included by quant.c only. */

#include <float.h>
#include <math.h>

#if defined(__AVX2__)
#define I8_SIMD 1
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define I8_VNNI 1
#define DPWSSD _mm256_dpwssd_epi32
#define DPBUSD _mm256_dpbusd_epi32
#elif defined(__AVXVNNI__)
#define I8_VNNI 1
#define DPWSSD _mm256_dpwssd_avx_epi32
#define DPBUSD _mm256_dpbusd_avx_epi32
#endif
#endif
#define I8_MR 4 /* x rows per weight row pass: each weight block is unpacked once for them */
#ifndef I8_PF_BYTES
#define I8_PF_BYTES 16384 /* weight bytes prefetched ahead into L2 (rows are contiguous) */
#endif

typedef struct { /* quantized x rows, from a tile's first row */
    const int8_t *q;   /* [rows][K] */
    const float *d;    /* [rows][K / QB] */
    const int16_t *s;  /* [rows][K / 16]: sums of 16 q */
    int64_t K, nd, ns; /* row strides of q, d, s */
} XRows;

static inline float fmadd1(float a, float b, float c) { /* c + a b, one rounding where FMA */
#if defined(__FMA__)
    return __builtin_fmaf(a, b, c);
#else
    return c + a * b;
#endif
}

/* x rows [M][K] (row stride ldx) into xq / dx / xs (xs: only for qb 256, the K-quants); a
 * block holding NaN or inf gets dx = NaN (its outputs are NaN, as the float path's would be)
 * and xq = 0. The AVX2 build does the same arithmetic 8 values at a time (max is exact; one
 * multiply and one round-to-nearest-even per value): the same bytes. */
static inline void quantize_block(const float *v, int64_t qb, int8_t *q, float *dx) {
    float amax = 0.0f;
    int finite = 1;
    for (int64_t l = 0; l < qb; l++) {
        const float a = fabsf(v[l]);
        amax = a > amax ? a : amax;
        finite &= a <= FLT_MAX;
    }
    const float inv = finite && amax >= 1e-30f ? 127.0f / amax : 0.0f;
    *dx = finite ? amax / 127.0f : NAN;
    for (int64_t l = 0; l < qb; l++) q[l] = finite ? (int8_t)rintf(v[l] * inv) : 0;
}

#if I8_SIMD
static void quantize_block_simd(const float *v, int64_t qb, int8_t *q, float *dx) {
    const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(FLT_MAX);
    __m256 amax = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    for (int64_t l = 0; l < qb; l += 8) {
        const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(v + l));
        amax = _mm256_max_ps(amax, a); /* a NaN lane is caught by bad */
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, big, _CMP_NLE_UQ));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    const float top = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
    if (_mm256_movemask_ps(bad)) {
        *dx = NAN;
        memset(q, 0, (size_t)qb);
        return;
    }
    const __m256 inv = _mm256_set1_ps(top >= 1e-30f ? 127.0f / top : 0.0f);
    *dx = top / 127.0f;
    for (int64_t l = 0; l < qb; l += 32) {
        __m256i r[4];
        for (int u = 0; u < 4; u++) {
            const __m256 p = _mm256_mul_ps(_mm256_loadu_ps(v + l + 8 * u), inv);
            r[u] = _mm256_cvtps_epi32(_mm256_round_ps(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        }
        const __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
        const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* undo the lane interleave */
        _mm256_storeu_si256((__m256i *)(q + l), _mm256_permutevar8x32_epi32(w, order));
    }
}
#endif

static void quantize_rows(const float *x, int64_t M, int64_t ldx, int64_t K, int64_t qb,
                          int8_t *xq, float *dx, int16_t *xs) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t k = 0; k < K; k += qb) {
            int8_t *q = xq + i * K + k;
#if I8_SIMD
            quantize_block_simd(x + i * ldx + k, qb, q, dx + i * (K / qb) + k / qb);
#else
            quantize_block(x + i * ldx + k, qb, q, dx + i * (K / qb) + k / qb);
#endif
            for (int64_t l = 0; qb == 256 && l < qb; l += 16) {
                int s = 0;
                for (int u = 0; u < 16; u++) s += q[l + u];
                xs[i * (K / 16) + (k + l) / 16] = (int16_t)s;
            }
        }
}

/* A Q4_K block's 6-bit scales and mins, byte s of sc8 / mn8 for sub-block s (layout:
 * quant_blocks.py). NOTE: kept in registers: bytes stored as two 32-bit halves and reloaded as
 * one 64-bit vector would stall on store forwarding. */
static inline void q4_k_scale_bytes(const uint8_t *s, uint64_t *sc8, uint64_t *mn8) {
    uint32_t a[3];
    memcpy(a, s, sizeof a);
    const uint32_t sc_lo = a[0] & 0x3f3f3f3fu, mn_lo = a[1] & 0x3f3f3f3fu;
    const uint32_t sc_hi = (a[2] & 0x0f0f0f0fu) | (a[0] >> 6 & 0x03030303u) << 4;
    const uint32_t mn_hi = (a[2] >> 4 & 0x0f0f0f0fu) | (a[1] >> 6 & 0x03030303u) << 4;
    *sc8 = (uint64_t)sc_hi << 32 | sc_lo;
    *mn8 = (uint64_t)mn_hi << 32 | mn_lo;
}

static inline int byte_of(uint64_t v, int s) { return (int)(v >> 8 * s & 0xff); }

#if I8_SIMD
static inline __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* int16 lanes of the low 128 bits = word a of v's 128-bit lanes, of the high = word b (v: the
 * same 8 words in both halves): one vpshufb, where _mm256_set1_epi16 of a scalar costs a
 * transfer from a general register and a broadcast */
static inline __m256i word_splat(__m256i v, int a, int b) {
    const __m256i idx = _mm256_setr_m128i(_mm_set1_epi16((short)(0x0100 + 0x0202 * a)),
                                          _mm_set1_epi16((short)(0x0100 + 0x0202 * b)));
    return _mm256_shuffle_epi8(v, idx);
}

/* acc + (pairs of u * x) * s: u unsigned bytes, x signed bytes, s int16 scales */
static inline __m256i dot_scaled(__m256i acc, __m256i u, __m256i x, __m256i s) {
#if defined(I8_VNNI)
    return DPWSSD(acc, _mm256_maddubs_epi16(u, x), s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), s));
#endif
}
#endif

#if defined(__AVX512BW__)
/* 64-byte forms for the K-quants: one vector holds a Q4_K byte run's two sub-blocks (low
 * nibbles | high nibbles, x's values in order) or four Q6_K sub-blocks of 16. */
static inline __m512i join(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

static inline __m512i dot_scaled64(__m512i acc, __m512i u, __m512i x, __m512i s) {
#if defined(__AVX512VNNI__)
    return _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(u, x), s);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, x), s));
#endif
}

/* int16 lane l of the result = s16[first + l / width] (s16: the block's scales as int16) */
static inline __m512i spread(__m512i s16, int first, int width) {
    int16_t idx[32];
    for (int l = 0; l < 32; l++) idx[l] = (int16_t)(first + l / width);
    __m512i v;
    memcpy(&v, idx, sizeof v);
    return _mm512_permutexvar_epi16(v, s16);
}
#endif

/* A K-quant block's integer results for one x row, kept as vectors (lanes summed at the end of
 * the row, not per block): tot (lanes: parts of sum sc sum q xq) and aux (8 lanes: Q4_K's
 * m[s] sum xq, Q6_K's sc[t] sum xq), in float y += (d dx) sum tot + (c dx) sum aux with
 * c = -dmin (Q4_K), -32 d (Q6_K). Scalar build: plain int32. */
#if defined(__AVX512BW__)
typedef __m512i I8T;
typedef __m512 I8F;
static inline I8F i8f_madd(I8T t, float s, I8F a) {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_set1_ps(s), a);
}
static inline float i8f_sum(I8F a) { return _mm512_reduce_add_ps(a); }
#define I8F_ZERO _mm512_setzero_ps()
#elif I8_SIMD
typedef __m256i I8T;
typedef __m256 I8F;
static inline I8F i8f_madd(I8T t, float s, I8F a) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_set1_ps(s), a);
}
#define I8F_ZERO _mm256_setzero_ps()
#else
typedef int32_t I8T;
#endif
#if I8_SIMD
typedef __m256i I8A;
static inline float sum8(__m256 a) { /* fixed tree */
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#if !defined(__AVX512BW__)
static inline float i8f_sum(I8F a) { return sum8(a); }
#endif
#else
typedef int32_t I8A;
#endif

/* tot[i] / mins[i] = sum_s sc[s] sum q xq / sum_s m[s] sum xq of a Q4_K block b, x row i */
static inline __attribute__((always_inline)) void i8_q4_k(const uint8_t *blk, const XRows *xr,
                                                          int64_t b, const int mi,
                                                          I8T *tot, I8A *mins) {
    uint64_t sc8, mn8;
    q4_k_scale_bytes(blk + 4, &sc8, &mn8);
#if defined(__AVX512BW__)
    const __m256i nib = _mm256_set1_epi8(15);
    const __m512i sc16 = _mm512_cvtepu8_epi16(_mm256_castsi128_si256(_mm_cvtsi64_si128((long long)sc8)));
    __m512i s[I8_MR];
    for (int i = 0; i < mi; i++) s[i] = _mm512_setzero_si512();
    for (int j = 0; j < 4; j++) { /* bytes 32 j..: sub-block 2j low nibbles, 2j + 1 high */
        const __m256i q = load32(blk + 16 + 32 * j);
        const __m512i u = join(_mm256_and_si256(q, nib), _mm256_and_si256(_mm256_srli_epi16(q, 4), nib));
        const __m512i sv = spread(sc16, 2 * j, 16);
        for (int i = 0; i < mi; i++)
            s[i] = dot_scaled64(s[i], u, _mm512_loadu_si512(xr->q + i * xr->K + 256 * b + 64 * j), sv);
    }
#elif I8_SIMD
    const __m256i nib = _mm256_set1_epi8(15);
    __m256i s[I8_MR];
    for (int i = 0; i < mi; i++) s[i] = _mm256_setzero_si256();
    const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc8)));
    for (int j = 0; j < 4; j++) { /* bytes 32 j..: sub-block 2j low nibbles, 2j + 1 high */
        const __m256i q = load32(blk + 16 + 32 * j), lo = _mm256_and_si256(q, nib);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), nib);
        const __m256i slo = word_splat(sc16, 2 * j, 2 * j), shi = word_splat(sc16, 2 * j + 1, 2 * j + 1);
        for (int i = 0; i < mi; i++) {
            const int8_t *x = xr->q + i * xr->K + 256 * b + 64 * j;
            s[i] = dot_scaled(s[i], lo, load32(x), slo);
            s[i] = dot_scaled(s[i], hi, load32(x + 32), shi);
        }
    }
#endif
#if I8_SIMD
    const __m128i m8 = _mm_cvtsi64_si128((long long)mn8);
    const __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8)); /* m[s] twice: per 16 */
    for (int i = 0; i < mi; i++) {
        tot[i] = s[i];
        mins[i] = _mm256_madd_epi16(m16, load32(xr->s + i * xr->ns + 16 * b));
    }
#else
    for (int i = 0; i < mi; i++) {
        const int8_t *x = xr->q + i * xr->K + 256 * b;
        const int16_t *xs = xr->s + i * xr->ns + 16 * b;
        int32_t t = 0, m = 0;
        for (int u = 0; u < 8; u++) {
            int32_t p = 0;
            for (int l = 0; l < 32; l++)
                p += (blk[16 + 32 * (u / 2) + l] >> 4 * (u % 2) & 15) * x[32 * u + l];
            t += byte_of(sc8, u) * p;
            m += byte_of(mn8, u) * (xs[2 * u] + xs[2 * u + 1]);
        }
        tot[i] = t;
        mins[i] = m;
    }
#endif
}

/* tot[i] / offs[i] = sum_t sc[t] sum q xq / sum_t sc[t] sum xq of a Q6_K block b, x row i */
static inline __attribute__((always_inline)) void i8_q6_k(const uint8_t *blk, const XRows *xr,
                                                          int64_t b, const int mi,
                                                          I8T *tot, I8A *offs) {
    const int8_t *sc = (const int8_t *)(blk + 192);
#if I8_SIMD && !defined(__AVX512BW__)
    const __m128i sc8x16 = _mm_loadu_si128((const __m128i *)sc);
    const __m256i sc_lo = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(sc8x16)); /* 0-7 twice */
    const __m256i sc_hi = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_srli_si128(sc8x16, 8)));
#endif
#if I8_SIMD
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(0x30);
#if defined(__AVX512BW__)
    const __m512i sc512 = _mm512_cvtepi8_epi16(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)sc)));
    __m512i s[I8_MR];
    for (int i = 0; i < mi; i++) s[i] = _mm512_setzero_si512();
#else
    __m256i s[I8_MR];
    for (int i = 0; i < mi; i++) s[i] = _mm256_setzero_si256();
#endif
    for (int h = 0; h < 2; h++) { /* values 128 h + 32 r + l, r < 4: sub-blocks 8h + 2r (+1) */
        const __m256i l0 = load32(blk + 64 * h), l1 = load32(blk + 64 * h + 32);
        const __m256i hb = load32(blk + 128 + 32 * h);
        const __m256i q[4] = {
            _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m2)),
            _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m2)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hb, m2)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                            _mm256_and_si256(_mm256_srli_epi16(hb, 2), m2))};
#if defined(__AVX512BW__)
        for (int r = 0; r < 4; r += 2) {
            const __m512i u = join(q[r], q[r + 1]), sv = spread(sc512, 8 * h + 2 * r, 8);
            for (int i = 0; i < mi; i++)
                s[i] = dot_scaled64(s[i], u, _mm512_loadu_si512(xr->q + i * xr->K + 256 * b + 128 * h + 32 * r), sv);
        }
#else
        for (int r = 0; r < 4; r++) {
            const int t = 8 * h + 2 * r;
            const __m256i sv = word_splat(t < 8 ? sc_lo : sc_hi, t % 8, t % 8 + 1);
            for (int i = 0; i < mi; i++)
                s[i] = dot_scaled(s[i], q[r], load32(xr->q + i * xr->K + 256 * b + 128 * h + 32 * r), sv);
        }
#endif
    }
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
    for (int i = 0; i < mi; i++) {
        tot[i] = s[i];
        offs[i] = _mm256_madd_epi16(sc16, load32(xr->s + i * xr->ns + 16 * b));
    }
#else
    for (int i = 0; i < mi; i++) {
        const int8_t *x = xr->q + i * xr->K + 256 * b;
        const int16_t *xs = xr->s + i * xr->ns + 16 * b;
        int32_t t = 0, o = 0;
        for (int u = 0; u < 16; u++) {
            int32_t p = 0;
            for (int l = 0; l < 16; l++) {
                const int v = 16 * u + l, h = v / 128, w = v % 128;
                const int lo = blk[64 * h + w % 64] >> 4 * (w / 64) & 15;
                const int hi = blk[128 + 32 * h + w % 32] >> 2 * (w / 32) & 3;
                p += (lo | hi << 4) * x[v];
            }
            t += sc[u] * p;
            o += sc[u] * xs[u];
        }
        tot[i] = t;
        offs[i] = o;
    }
#endif
}

#define I8_NJ 2 /* weight rows interleaved when x has at most I8_NJ rows: independent chains */
#if I8_SIMD && !defined(__AVX512BW__)
/* AVX2's float step of a K-quant block (the per-row kernel's and quant_tiled.h's: one order,
 * so a row's bits do not depend on the batch), into 8 float lanes summed once at the row's end:
 *   Q6_K: av += (d dx) * (tot - 32 aux)              (the offset folded in the integers: exact)
 *   Q4_K: av += (d dx) * tot;  av += fx * fm         (fm lane s = -dmin m[s], exact in float;
 *         fx lane s = dx * the sum of x's 32 quantized values of sub-block s: x_fsums) */
static inline __m256 q4_k_fmins(const uint8_t *blk) {
    uint64_t sc8, mn8;
    q4_k_scale_bytes(blk + 4, &sc8, &mn8);
    const __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn8)));
    return _mm256_mul_ps(m, _mm256_set1_ps(-half_to_float(blk + 2)));
}

static inline __m256 x_fsums(const int16_t *xs, __m256 dx) { /* xs: a block's 16 sums of 16 */
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(load32(xs), _mm256_set1_epi16(1))), dx);
}

static inline __attribute__((always_inline)) __m256 kq_tail(const int fmt, __m256i tot, __m256i aux,
                                                            __m256 ddx, __m256 fx, __m256 fm,
                                                            __m256 av) {
    if (fmt == Q6_K)
        return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(tot, _mm256_slli_epi32(aux, 5))), ddx, av);
    av = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot), ddx, av);
    return _mm256_fmadd_ps(fx, fm, av);
}
#define KQ_ACC I8F av[I8_NJ * I8_MR]
#define KQ_ZERO(t) (av[t] = I8F_ZERO)
#define KQ_BLOCK const __m256 fm = fmt == Q4_K ? q4_k_fmins(blk) : _mm256_setzero_ps()
#define KQ_ADD(t, i, st, sa)                                                                     \
    (av[t] = kq_tail(fmt, tot[i], aux[i], _mm256_set1_ps(st),                                   \
                     fmt == Q4_K ? x_fsums(xr->s + i * xr->ns + 16 * b, _mm256_set1_ps(dx)) : fm, \
                     fm, av[t]))
#define KQ_SUM(t) sum8(av[t])
#elif I8_SIMD
#define KQ_ACC I8F av[I8_NJ * I8_MR]; __m256 am[I8_NJ * I8_MR]
#define KQ_ZERO(t) (av[t] = I8F_ZERO, am[t] = _mm256_setzero_ps())
#define KQ_ADD(t, i, st, sa) \
    (av[t] = i8f_madd(tot[i], st, av[t]), am[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(aux[i]), _mm256_set1_ps(sa), am[t]))
#define KQ_SUM(t) (i8f_sum(av[t]) + sum8(am[t]))
#define KQ_BLOCK
#else
#define KQ_ACC float av[I8_NJ * I8_MR]
#define KQ_ZERO(t) (av[t] = 0.0f)
#define KQ_ADD(t, i, st, sa) (av[t] += fmadd1(st, (float)tot[i], (sa) * (float)aux[i]))
#define KQ_SUM(t) av[t]
#define KQ_BLOCK
#endif

/* acc[j * mi + i] = weight row j (at w + j * row_bytes; K values of Q4_K / Q6_K) . x row i,
 * for j < nj, i < mi: the block results' lanes accumulate in float vectors, summed once at the
 * end (no reduction per block); each (j, i) the same operations whatever nj and mi. */
static inline __attribute__((always_inline)) void i8_row_k(int fmt, const uint8_t *w,
                                                           int64_t row_bytes, const XRows *xr,
                                                           const int mi, const int nj,
                                                           float *acc) {
    const int64_t bytes = block_bytes(fmt);
    I8T tot[I8_MR];
    I8A aux[I8_MR];
    KQ_ACC;
    for (int t = 0; t < nj * mi; t++) KQ_ZERO(t);
    for (int64_t b = 0; b < xr->nd; b++)
        for (int j = 0; j < nj; j++) {
            const uint8_t *blk = w + j * row_bytes + bytes * b;
            /* NOTE: may reach past W's end: a prefetch does not fault */
            for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(blk + I8_PF_BYTES + o, 0, 2);
            float d, c;
            if (fmt == Q4_K) {
                d = half_to_float(blk), c = -half_to_float(blk + 2);
                i8_q4_k(blk, xr, b, mi, tot, aux);
            } else {
                d = half_to_float(blk + 208), c = -32.0f * d;
                i8_q6_k(blk, xr, b, mi, tot, aux);
            }
            KQ_BLOCK;
            for (int i = 0; i < mi; i++) {
                const float dx = xr->d[i * xr->nd + b];
                KQ_ADD(j * mi + i, i, d * dx, c * dx);
            }
        }
    for (int t = 0; t < nj * mi; t++) acc[t] = KQ_SUM(t);
}

#include "quant_q8_0.h"

#define I8_ROWS(MI)                                                                             \
    case MI:                                                                                    \
        if (fmt == Q8_0) q8_row(w, xr, MI, acc);                                               \
        else if (MI <= I8_NJ && nj == I8_NJ) i8_row_k(fmt, w, row_bytes, xr, MI, I8_NJ, acc);  \
        else i8_row_k(fmt, w, row_bytes, xr, MI, 1, acc);                                       \
        break;

#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include "quant_vnni512.h"
#define KQ_ROWS(MI)                                                                             \
    case MI:                                                                                    \
        if (nj == KQ_NJ && fmt == Q4_K) kq_rows(Q4_K, w, row_bytes, xr, MI, KQ_NJ, acc);       \
        else if (nj == KQ_NJ) kq_rows(Q6_K, w, row_bytes, xr, MI, KQ_NJ, acc);                 \
        else                                                                                    \
            for (int64_t j = 0; j < nj; j++) {                                                  \
                const uint8_t *wj = w + j * row_bytes;                                          \
                if (fmt == Q4_K) kq_rows(Q4_K, wj, row_bytes, xr, MI, 1, acc + j * MI);         \
                else kq_rows(Q6_K, wj, row_bytes, xr, MI, 1, acc + j * MI);                     \
            }                                                                                   \
        break;

/* weight rows per pass of i8_rows for M x rows */
static int64_t pass_rows(int fmt, int64_t M) {
    if (fmt == Q8_0) return 1;
    return M <= 2 ? KQ_NJ : 1;
}
#else
static int64_t pass_rows(int fmt, int64_t M) { return fmt != Q8_0 && M <= I8_NJ ? I8_NJ : 1; }
#endif

/* acc[j * mi + i] for weight rows j < nj (nj <= pass_rows(fmt, M)) */
static void i8_rows(int fmt, const uint8_t *w, int64_t row_bytes, const XRows *xr, int64_t mi,
                    int64_t nj, float *acc) {
#if defined(KQ_NJ)
    if (fmt != Q8_0) {
        switch (mi) {
            KQ_ROWS(1)
            KQ_ROWS(2)
            KQ_ROWS(3)
            KQ_ROWS(4)
        default: break;
        }
        return;
    }
#endif
    switch (mi) {
        I8_ROWS(1)
        I8_ROWS(2)
        I8_ROWS(3)
        I8_ROWS(4)
    default: break;
    }
}

#include "quant_tiled.h"

/* hk_quant_gemm with x quantized to int8 per row (above); from I8_TILE_ROWS rows of the
 * K-quants the tiled kernel (quant_tiled.h), bitwise the same. Returns 0, or -1 without
 * memory. */
int hk_quant_gemm_i8(int fmt, const float *x, int64_t M, int64_t ldx, const uint8_t *W,
                     int64_t N, int64_t K, const float *bias, float *y, int threads) {
    const int64_t qb = fmt == Q8_0 ? 32 : 256, row_bytes = K / block_values(fmt) * block_bytes(fmt);
    int8_t *xq = malloc((size_t)(M * K));
    float *dx = malloc((size_t)(M * (K / qb)) * sizeof(float));
    int16_t *xs = malloc((size_t)(M * (K / 16)) * sizeof(int16_t));
    if (!xq || !dx || !xs) {
        free(xq), free(dx), free(xs);
        return -1;
    }
    quantize_rows(x, M, ldx, K, qb, xq, dx, xs);
#if defined(I8_TILED)
    if (fmt != Q8_0 && M >= I8_TILE_ROWS) {
        const int status = i8_tiled(fmt, xq, dx, xs, M, W, N, K, bias, y, threads);
        free(xq), free(dx), free(xs);
        return status;
    }
#endif
#if defined(KQ_NJ)
    if (fmt == Q4_K) q4k_interleave_x(xq, M * K);
#endif
    const int64_t pair = pass_rows(fmt, M); /* weight rows per pass */
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && N * K >= PARALLEL_WORK)
    for (int64_t p = 0; p < (N + pair - 1) / pair; p++) {
        const int64_t n = p * pair, nj = N - n < pair ? N - n : pair;
        for (int64_t m = 0; m < M; m += I8_MR) {
            const int64_t mi = M - m < I8_MR ? M - m : I8_MR;
            const XRows xr = {xq + m * K, dx + m * (K / qb), xs + m * (K / 16), K, K / qb, K / 16};
            float acc[I8_MR * 4]; /* pass_rows <= 4 */
            i8_rows(fmt, W + n * row_bytes, row_bytes, &xr, mi, nj, acc);
            for (int64_t j = 0; j < nj; j++)
                for (int64_t i = 0; i < mi; i++) {
                    const float v = acc[j * mi + i];
                    y[(m + i) * N + n + j] = bias ? v + bias[n + j] : v;
                }
        }
    }
    free(xq), free(dx), free(xs);
    return 0;
}

/* The x rows from which hk_quant_gemm_i8 takes the tiled kernel for Q4_K / Q6_K; 0: never
 * (scalar and AVX-512 builds). */
int hk_quant_i8_tile_rows(void) {
#if defined(I8_TILED)
    return I8_TILE_ROWS;
#else
    return 0;
#endif
}
