"""Corpus BLEU-4 (Papineni et al. 2002) with the brevity penalty, on token lists."""
from __future__ import annotations

import math
from collections import Counter
from typing import Sequence

__all__ = ["corpus_bleu", "bleu_counts", "bleu_from_counts"]


def _ngrams(tokens: Sequence[str], n: int) -> Counter:
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def bleu_counts(hyp: Sequence[str], ref: Sequence[str], max_n: int = 4) -> list[float]:
    """[matches_1..n, totals_1..n, hyp_len, ref_len] of one sentence (summable over a corpus)."""
    matches, totals = [], []
    for n in range(1, max_n + 1):
        h, r = _ngrams(hyp, n), _ngrams(ref, n)
        matches.append(sum(min(c, r[g]) for g, c in h.items()))
        totals.append(max(0, len(hyp) - n + 1))
    return [*matches, *totals, len(hyp), len(ref)]


def bleu_from_counts(counts: Sequence[float], max_n: int = 4) -> float:
    """BLEU in [0, 100] from summed :func:`bleu_counts`."""
    matches, totals = counts[:max_n], counts[max_n:2 * max_n]
    hyp_len, ref_len = counts[2 * max_n], counts[2 * max_n + 1]
    if hyp_len == 0 or min(matches) == 0:
        return 0.0
    log_p = sum(math.log(m / t) for m, t in zip(matches, totals)) / max_n
    bp = 1.0 if hyp_len > ref_len else math.exp(1 - ref_len / hyp_len)
    return 100.0 * bp * math.exp(log_p)


def corpus_bleu(hyps: Sequence[Sequence[str]], refs: Sequence[Sequence[str]], max_n: int = 4) -> float:
    """Corpus BLEU of hypotheses against one reference each, in [0, 100]."""
    total = [0.0] * (2 * max_n + 2)
    for h, r in zip(hyps, refs):
        total = [a + b for a, b in zip(total, bleu_counts(h, r, max_n))]
    return bleu_from_counts(total, max_n)
