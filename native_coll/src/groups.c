/* Which ranks average together at iteration t (the rule is documented in wa.h). */
#include "wa_internal.h"

static int is_pow2(int x) { return x > 0 && (x & (x - 1)) == 0; }

static int log2i(int x) {
  int l = 0;
  while ((1 << l) < x) l++;
  return l;
}

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static int butterfly(int P, int S, int64_t t, int rank, int *out) {
  int L = log2i(P), b = log2i(S);
  int phases = (L + b - 1) / b;
  int k = (int)(t % phases);
  int lo = k * b;
  if (lo > L - b) lo = L - b; /* keep the last field S wide so every group has S members */
  int mask = (S - 1) << lo;
  int base = rank & ~mask;
  for (int i = 0; i < S; i++) out[i] = base | (i << lo);
  return S; /* increasing i gives increasing ranks */
}

/* out doubles as the permutation buffer: it has room for P entries. */
static int shuffled_blocks(int P, int S, int64_t t, int rank, int *out) {
  int m = P / S;
  for (int i = 0; i < P; i++) out[i] = i;
  uint64_t state = (uint64_t)t * 0xD1B54A32D192ED03ull + 0x5851F42D4C957F2Dull;
  for (int i = P - 1; i > 0; i--) {
    int j = (int)(splitmix64(&state) % (uint64_t)(i + 1));
    int tmp = out[i];
    out[i] = out[j];
    out[j] = tmp;
  }
  int pos = 0;
  while (out[pos] != rank) pos++;
  /* Blocks: the first P % m have P / m + 1 members, the rest P / m. */
  int small = P / m, big_blocks = P % m;
  int block_start, block_len;
  if (pos < big_blocks * (small + 1)) {
    block_start = (pos / (small + 1)) * (small + 1);
    block_len = small + 1;
  } else {
    int rest = pos - big_blocks * (small + 1);
    block_start = big_blocks * (small + 1) + (rest / small) * small;
    block_len = small;
  }
  for (int i = 0; i < block_len; i++) out[i] = out[block_start + i];
  /* insertion sort: groups are small */
  for (int i = 1; i < block_len; i++) {
    int v = out[i], j = i - 1;
    while (j >= 0 && out[j] > v) {
      out[j + 1] = out[j];
      j--;
    }
    out[j + 1] = v;
  }
  return block_len;
}

int wa_group_of(int P, int S, int64_t t, int rank, int *out) {
  if (P <= 0 || rank < 0 || rank >= P || t < 0) return 0;
  if (S <= 1) {
    out[0] = rank;
    return 1;
  }
  if (S >= P) {
    for (int i = 0; i < P; i++) out[i] = i;
    return P;
  }
  if (is_pow2(P) && is_pow2(S)) return butterfly(P, S, t, rank, out);
  return shuffled_blocks(P, S, t, rank, out);
}
