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

int wai_encode_delta16(int prec, uint16_t *restrict dst, const float *restrict x,
                       const float *restrict base, size_t n) {
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
  if (prec == WA_PRECISION_BF16)
    for (size_t i = 0; i < n; i++) dst[i] = wai_bf16_of(acc[i] / div);
  else
    for (size_t i = 0; i < n; i++) dst[i] = wai_fp16_of(acc[i] / div);
}

int wai_apply16(int prec, float *restrict dst, const float *restrict base,
                const uint16_t *restrict mean, size_t n) {
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
  uint32_t seen = 0;
  for (size_t i = 0; i < n; i++) {
    x[i] = precision == WA_PRECISION_BF16 ? wai_bf16_to(wai_bf16_of(x[i]))
                                          : wai_fp16_to(wai_fp16_of(x[i]));
    seen |= wai_nonfinite_bits(x[i]);
  }
  return wai_nonfinite_seen(seen);
}
