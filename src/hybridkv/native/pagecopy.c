/* Copy KV-cache pages between the device cache and a host buffer, checksumming the host
 * buffer's bytes in the same pass (each 32-byte stripe is loaded once, stored, and absorbed).
 *
 * The checksum ("hk64") is for corruption detection, not for adversaries. Per 32-byte stripe
 * d (four 64-bit lanes) and a key that advances every stripe:
 *     v    = d ^ key
 *     mix += lo32(v) * hi32(v)     -- spreads every bit over the lane
 *     sum += d                     -- any single changed bit changes it
 *     key += STEP                  -- the same bytes at another offset hash differently
 * A final partial stripe is zero-padded; the length is folded into the result, and the
 * lanes are folded into 64 bits through a multiply-xorshift finalizer. The value depends
 * only on the bytes and their order, never on how a copy splits them into pages.
 *
 * Host buffers are laid out [rows][groups][page]; device page (row r, group g) lives at
 * bases[g] + blocks[r] * page (backing tensors are [num_blocks, page], contiguous).
 * Callers (hybridkv/native/__init__.py) check shapes and block bounds; page % 32 == 0. */

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif

typedef uint64_t lanes __attribute__((vector_size(32)));

typedef struct {
    lanes mix, sum, key;
} state;

static const lanes KEY0 = {0x243f6a8885a308d3ULL, 0x13198a2e03707344ULL,
                           0xa4093822299f31d0ULL, 0x082efa98ec4e6c89ULL};
static const lanes STEP = {0x9e3779b97f4a7c15ULL, 0xbf58476d1ce4e5b9ULL,
                           0x94d049bb133111ebULL, 0xd6e8feb86659fd93ULL};

static inline lanes load32(const uint8_t *p) {
    lanes x;
    memcpy(&x, p, sizeof x);
    return x;
}

static inline void store32(uint8_t *p, lanes x) { memcpy(p, &x, sizeof x); }

/* lo32(v) * hi32(v) per lane, as a full 64-bit product. */
static inline lanes mul_halves(lanes v) {
#if defined(__AVX2__)
    return (lanes)_mm256_mul_epu32((__m256i)v, (__m256i)(v >> 32));
#else
    return (v & 0xffffffffULL) * (v >> 32);
#endif
}

static inline void absorb(state *s, lanes d) {
    lanes v = d ^ s->key;
    s->mix += mul_halves(v);
    s->sum += d;
    s->key += STEP;
}

static void absorb_run(state *s, const uint8_t *src, size_t n) {
    state t = *s;
    for (size_t i = 0; i + 32 <= n; i += 32) absorb(&t, load32(src + i));
    *s = t;
}

/* Stores bypass the cache when they can (AVX, 32-byte aligned destination): a copy then
 * writes each destination line once instead of reading it first, and does not evict the
 * cache for bytes nobody reads soon. */
static inline void store_stream(uint8_t *p, lanes x) {
#if defined(__AVX__) && !defined(HK_NO_STREAM)
    _mm256_stream_si256((__m256i *)p, (__m256i)x);
#else
    store32(p, x);
#endif
}

static void copy_run(state *s, uint8_t *dst, const uint8_t *src, size_t n) {
    state t = *s;
    if (((uintptr_t)dst & 31) == 0) {
        for (size_t i = 0; i + 32 <= n; i += 32) {
            lanes d = load32(src + i);
            store_stream(dst + i, d);
            absorb(&t, d);
        }
    } else {
        for (size_t i = 0; i + 32 <= n; i += 32) {
            lanes d = load32(src + i);
            store32(dst + i, d);
            absorb(&t, d);
        }
    }
    *s = t;
}

/* Streaming stores are weakly ordered: make them visible before a copy call returns. */
static inline void store_fence(void) {
#if defined(__AVX__)
    _mm_sfence();
#endif
}

static uint64_t fmix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static uint64_t finish(const state *s, uint64_t nbytes) {
    uint64_t h = fmix(nbytes ^ 0x6a09e667f3bcc908ULL);
    for (int i = 0; i < 4; i++) {
        h = fmix(h ^ s->mix[i]);
        h = fmix(h + s->sum[i]);
    }
    return h;
}

static state start(void) {
    state s;
    memset(&s, 0, sizeof s);
    s.key = KEY0;
    return s;
}

/* The checksum of src[0:nbytes]. */
uint64_t hk_hash(const uint8_t *src, size_t nbytes) {
    state s = start();
    size_t whole = nbytes & ~(size_t)31;
    absorb_run(&s, src, whole);
    if (whole < nbytes) {
        uint8_t tail[32] = {0};
        memcpy(tail, src + whole, nbytes - whole);
        absorb(&s, load32(tail));
    }
    return finish(&s, nbytes);
}

/* out[r][g] = device page (blocks[r], g) for every row; returns the checksum of out. */
uint64_t hk_gather(uint8_t *out, uint8_t *const *bases, size_t groups, size_t page,
                   const int64_t *blocks, size_t rows) {
    state s = start();
    for (size_t r = 0; r < rows; r++) {
        size_t offset = (size_t)blocks[r] * page;
        for (size_t g = 0; g < groups; g++, out += page) copy_run(&s, out, bases[g] + offset, page);
    }
    store_fence();
    return finish(&s, (uint64_t)rows * groups * page);
}

/* Device page (blocks[r], g) = in[r][g] for every row with blocks[r] >= 0 (rows with a
 * negative block are only checksummed); returns the checksum of all of in. */
uint64_t hk_scatter(const uint8_t *in, uint8_t *const *bases, size_t groups, size_t page,
                    const int64_t *blocks, size_t rows) {
    state s = start();
    for (size_t r = 0; r < rows; r++) {
        if (blocks[r] < 0) {
            absorb_run(&s, in, groups * page);
            in += groups * page;
            continue;
        }
        size_t offset = (size_t)blocks[r] * page;
        for (size_t g = 0; g < groups; g++, in += page) copy_run(&s, bases[g] + offset, in, page);
    }
    store_fence();
    return finish(&s, (uint64_t)rows * groups * page);
}

/* Many gathers in one call, spread over OpenMP threads (built with -fopenmp; torch loads
 * libgomp first, so this shares its runtime). sums[i] is copy i's checksum. */
void hk_gather_many(uint8_t *const *outs, const int64_t *const *blocks, const size_t *rows,
                    size_t n, uint8_t *const *bases, size_t groups, size_t page, uint64_t *sums) {
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = 0; i < n; i++)
        sums[i] = hk_gather(outs[i], bases, groups, page, blocks[i], rows[i]);
}

/* Many scatters in one call, spread over OpenMP threads; sums[i] is copy i's checksum. */
void hk_scatter_many(const uint8_t *const *ins, const int64_t *const *blocks, const size_t *rows,
                     size_t n, uint8_t *const *bases, size_t groups, size_t page, uint64_t *sums) {
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = 0; i < n; i++)
        sums[i] = hk_scatter(ins[i], bases, groups, page, blocks[i], rows[i]);
}
