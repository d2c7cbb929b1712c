/* CRC-32 (zlib's: the IEEE polynomial, reflected) by carry-less multiplication.
 *
 * cdc_crc32(crc, buf, len) returns exactly what zlib's crc32(crc, buf, len) does. Runs of 64
 * bytes or more are folded 4 x 128 bits at a time with PCLMULQDQ (when the CPU has it), the
 * rest goes to zlib. The method is the one of Intel's "Fast CRC Computation for Generic
 * Polynomials Using PCLMULQDQ Instruction" (2009): fold the running remainder forward by a
 * fixed distance with one multiplication per 64-bit half, reduce 128 -> 64 -> 32 bits, and
 * finish with a Barrett reduction. The constants are x^k mod P(x) for the reflected
 * polynomial P = 0x104C11DB7 at the distances the folds use:
 *   fold by 512 bits: x^(4*128+32), x^(4*128-32);  by 128 bits: x^(128+32), x^(128-32);
 *   64 -> 32 bits: x^64;  Barrett: floor(x^64 / P) and P itself.
 * tests/test_log_speedups.py compares it with zlib on every length up to a few kB, at every
 * alignment and with arbitrary starting values.
 */
#ifndef CDC_CRC32_FOLD_H
#define CDC_CRC32_FOLD_H

#include <stddef.h>
#include <stdint.h>
#include <zlib.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CDC_CRC32_FOLD 1

#define CDC_FOLD(x, k, next) _mm_xor_si128(_mm_xor_si128( \
    _mm_clmulepi64_si128((x), (k), 0x00), _mm_clmulepi64_si128((x), (k), 0x11)), (next))

/* the raw (not inverted) remainder ``crc`` carried over ``len`` bytes (len >= 64, a multiple
 * of 16) */
__attribute__((target("pclmul,sse4.1")))
static uint32_t cdc_crc32_fold(uint32_t crc, const unsigned char *p, size_t len)
{
    const __m128i k1k2 = _mm_set_epi64x(0x1c6e41596LL, 0x154442bd4LL);
    const __m128i k3k4 = _mm_set_epi64x(0x0ccaa009eLL, 0x1751997d0LL);
    const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124LL);
    const __m128i poly = _mm_set_epi64x(0x1f7011641LL, 0x1db710641LL);
    const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
    __m128i x1 = _mm_loadu_si128((const __m128i *)p);
    __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i x4 = _mm_loadu_si128((const __m128i *)(p + 48));
    __m128i t;

    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    p += 64;
    len -= 64;
    while (len >= 64) {
        x1 = CDC_FOLD(x1, k1k2, _mm_loadu_si128((const __m128i *)p));
        x2 = CDC_FOLD(x2, k1k2, _mm_loadu_si128((const __m128i *)(p + 16)));
        x3 = CDC_FOLD(x3, k1k2, _mm_loadu_si128((const __m128i *)(p + 32)));
        x4 = CDC_FOLD(x4, k1k2, _mm_loadu_si128((const __m128i *)(p + 48)));
        p += 64;
        len -= 64;
    }
    x1 = CDC_FOLD(x1, k3k4, x2);
    x1 = CDC_FOLD(x1, k3k4, x3);
    x1 = CDC_FOLD(x1, k3k4, x4);
    while (len >= 16) {
        x1 = CDC_FOLD(x1, k3k4, _mm_loadu_si128((const __m128i *)p));
        p += 16;
        len -= 16;
    }
    /* 128 -> 64 bits (appending 32 zero bits) */
    t = _mm_clmulepi64_si128(k3k4, x1, 0x01);
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), t);
    /* 64 -> 32 bits */
    t = _mm_srli_si128(x1, 4);
    x1 = _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), k5, 0x00);
    x1 = _mm_xor_si128(x1, t);
    /* Barrett reduction */
    t = x1;
    x1 = _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), poly, 0x10);
    x1 = _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), poly, 0x00);
    x1 = _mm_xor_si128(x1, t);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}

static int cdc_crc32_usable = -1;

static int cdc_crc32_folds(void)
{
    if (cdc_crc32_usable < 0) {
        __builtin_cpu_init();
        cdc_crc32_usable = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    }
    return cdc_crc32_usable;
}
#else
#define CDC_CRC32_FOLD 0
static int cdc_crc32_folds(void) { return 0; }
#endif

/* zlib's crc32(crc, buf, len), faster on long runs */
static inline uint32_t cdc_crc32(uint32_t crc, const unsigned char *buf, size_t len)
{
#if CDC_CRC32_FOLD
    if (len >= 64 && cdc_crc32_folds()) {
        size_t whole = len & ~(size_t)15;
        crc = ~cdc_crc32_fold(~crc, buf, whole);
        buf += whole;
        len -= whole;
    }
#endif
    return (uint32_t)crc32_z(crc, buf, len);
}

/* whether cdc_crc32 folds on this machine (for tests and diagnostics) */
static inline int cdc_crc32_accelerated(void) { return cdc_crc32_folds(); }

#endif
