/* The 16-bit wire of global iterations (wa.h, wa_set_global_precision): the loops that encode a
 * member's pseudo-gradient, sum decoded pieces, round the mean once and apply it to the base.
 * The precision is tested once per call, outside the loops, so each loop is a plain one over
 * integer and float32 operations that the compiler can vectorise; no float arithmetic is
 * reordered (-ffp-contract=off), so every member computes the same bits. */
#include "wa_internal.h"

/* Guard bit 15 of (h & 0x7fff) + step is set iff the 16-bit value is NaN or inf (its exponent
 * field all ones): the 16-bit twin of wai_nonfinite_bits. */
static inline uint32_t nonfinite16(uint16_t h, uint32_t step) {
  return (((uint32_t)h & 0x7fffu) + step) & 0x8000u;
}

/* IEEE half conversions in hardware (x86 F16C, with AVX2 for the guard's integer lanes), chosen
 * at run time: vcvtps2ph with an explicit round-to-nearest-even, so every number converts to the
 * same bits as wai_fp16_of (NaN stays NaN; only its payload bits may differ, and a NaN is refused
 * whatever its bits). The scalar helpers finish each loop's tail and serve other CPUs. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define WAI_F16C 1

static int f16c_ok(void) {
  static int ok = -1; /* a benign race: every thread computes the same value */
  if (ok < 0) {
    __builtin_cpu_init();
    ok = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx2");
  }
  return ok;
}

__attribute__((target("avx2,f16c"))) static int encode_fp16_hw(uint16_t *dst, const float *x,
                                                                const float *base, size_t n) {
  const __m128i abs16 = _mm_set1_epi16(0x7fff), step16 = _mm_set1_epi16(0x0400);
  __m128i seen = _mm_setzero_si128();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(base + i));
    __m128i h = _mm256_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128((__m128i *)(dst + i), h);
    seen = _mm_or_si128(seen, _mm_add_epi16(_mm_and_si128(h, abs16), step16));
  }
  int bad = !_mm_testz_si128(seen, _mm_set1_epi16((short)0x8000));
  for (; i < n; i++) {
    dst[i] = wai_fp16_of(x[i] - base[i]);
    bad |= (dst[i] & 0x7c00u) == 0x7c00u;
  }
  return bad;
}

__attribute__((target("avx2,f16c"))) static void sum_fp16_hw(float *acc, const uint16_t *src,
                                                             size_t n, int first) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i)));
    _mm256_storeu_ps(acc + i, first ? v : _mm256_add_ps(_mm256_loadu_ps(acc + i), v));
  }
  for (; i < n; i++) acc[i] = first ? wai_fp16_to(src[i]) : acc[i] + wai_fp16_to(src[i]);
}

__attribute__((target("avx2,f16c"))) static void mean_fp16_hw(uint16_t *dst, const float *acc,
                                                              size_t n, float div) {
  const __m256 vd = _mm256_set1_ps(div);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 m = _mm256_div_ps(_mm256_loadu_ps(acc + i), vd);
    _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(m, _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; i++) dst[i] = wai_fp16_of(acc[i] / div);
}

__attribute__((target("avx2,f16c"))) static int apply_fp16_hw(float *dst, const float *base,
                                                              const uint16_t *mean, size_t n) {
  const __m256i abs32 = _mm256_set1_epi32(0x7fffffff), step32 = _mm256_set1_epi32(0x00800000);
  __m256i seen = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_add_ps(_mm256_loadu_ps(base + i),
                             _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(mean + i))));
    _mm256_storeu_ps(dst + i, v);
    seen = _mm256_or_si256(seen, _mm256_add_epi32(_mm256_and_si256(_mm256_castps_si256(v), abs32),
                                                  step32));
  }
  uint32_t tail = 0;
  for (; i < n; i++) {
    dst[i] = base[i] + wai_fp16_to(mean[i]);
    tail |= wai_nonfinite_bits(dst[i]);
  }
  return _mm256_movemask_ps(_mm256_castsi256_ps(seen)) != 0 || wai_nonfinite_seen(tail);
}
#endif

int wai_encode_delta16(int prec, uint16_t *restrict dst, const float *restrict x,
                       const float *restrict base, size_t n) {
#ifdef WAI_F16C
  if (prec == WA_PRECISION_FP16 && f16c_ok()) return encode_fp16_hw(dst, x, base, n);
#endif
  uint32_t seen = 0;
  if (prec == WA_PRECISION_BF16) {
    for (size_t i = 0; i < n; i++) {
      dst[i] = wai_bf16_of(x[i] - base[i]);
      seen |= nonfinite16(dst[i], 0x0080u);
    }
  } else {
    for (size_t i = 0; i < n; i++) {
      dst[i] = wai_fp16_of(x[i] - base[i]);
      seen |= nonfinite16(dst[i], 0x0400u);
    }
  }
  return seen != 0;
}

void wai_sum16(int prec, float *restrict acc, const uint16_t *restrict src, size_t n, int first) {
#ifdef WAI_F16C
  if (prec == WA_PRECISION_FP16 && f16c_ok()) {
    sum_fp16_hw(acc, src, n, first);
    return;
  }
#endif
  if (prec == WA_PRECISION_BF16) {
    if (first)
      for (size_t i = 0; i < n; i++) acc[i] = wai_bf16_to(src[i]);
    else
      for (size_t i = 0; i < n; i++) acc[i] += wai_bf16_to(src[i]);
  } else {
    if (first)
      for (size_t i = 0; i < n; i++) acc[i] = wai_fp16_to(src[i]);
    else
      for (size_t i = 0; i < n; i++) acc[i] += wai_fp16_to(src[i]);
  }
}

void wai_mean16(int prec, uint16_t *restrict dst, const float *restrict acc, size_t n, float div) {
#ifdef WAI_F16C
  if (prec == WA_PRECISION_FP16 && f16c_ok()) {
    mean_fp16_hw(dst, acc, n, div);
    return;
  }
#endif
  if (prec == WA_PRECISION_BF16)
    for (size_t i = 0; i < n; i++) dst[i] = wai_bf16_of(acc[i] / div);
  else
    for (size_t i = 0; i < n; i++) dst[i] = wai_fp16_of(acc[i] / div);
}

int wai_apply16(int prec, float *restrict dst, const float *restrict base,
                const uint16_t *restrict mean, size_t n) {
#ifdef WAI_F16C
  if (prec == WA_PRECISION_FP16 && f16c_ok()) return apply_fp16_hw(dst, base, mean, n);
#endif
  uint32_t seen = 0;
  if (prec == WA_PRECISION_BF16)
    for (size_t i = 0; i < n; i++) {
      dst[i] = base[i] + wai_bf16_to(mean[i]);
      seen |= wai_nonfinite_bits(dst[i]);
    }
  else
    for (size_t i = 0; i < n; i++) {
      dst[i] = base[i] + wai_fp16_to(mean[i]);
      seen |= wai_nonfinite_bits(dst[i]);
    }
  return wai_nonfinite_seen(seen);
}

int wa_wire_round(int precision, float *x, size_t n) {
  if (precision != WA_PRECISION_BF16 && precision != WA_PRECISION_FP16) return -1;
  /* Through the loops the collective runs (the hardware path where there is one), in blocks. */
  uint16_t h[WAI_BLOCK];
  float zero[WAI_BLOCK], minus_zero[WAI_BLOCK]; /* x - 0 and -0 + y keep the sign of a zero */
  for (int i = 0; i < WAI_BLOCK; i++) zero[i] = 0.0f, minus_zero[i] = -0.0f;
  int bad = 0;
  for (size_t b = 0; b < n; b += WAI_BLOCK) {
    size_t m = n - b < WAI_BLOCK ? n - b : WAI_BLOCK;
    (void)wai_encode_delta16(precision, h, x + b, zero, m);
    bad |= wai_apply16(precision, x + b, minus_zero, h, m);
  }
  return bad;
}
