"""A synthetic translation task with a grammar: learnable, not trivial, nothing downloaded.

Source: English-like SVO sentences, ``[det|number] adj* noun verb [det|number] adj* noun
[prep det adj* noun]``. Target: a made-up language with its own words (a fixed dictionary), SOV
order, adjectives after the noun and agreeing in gender with it, determiners agreeing in gender,
a plural marker after plural nouns, and verbs agreeing with the subject's number. A model has to
learn the dictionary, the reordering and the agreements.
"""
from __future__ import annotations

import numpy as np

__all__ = ["GrammarTask", "generate_pairs"]

_NOUNS = ("cat dog bird fish horse tree house river car book king queen child farmer teacher "
          "robot garden city road ship").split()
_VERBS = "sees likes finds follows pushes paints builds carries watches helps".split()
_ADJS = "big small red blue old young happy quiet fast green".split()
_PREPS = "near behind under with".split()
_NUMBERS = "two three four".split()
_SYLL = "ka ri mo te lu pa zi no ve sa".split()
_CHUNK = 64


class GrammarTask:
    """The fixed dictionary and rules of the synthetic language (the same for every seed)."""

    def __init__(self):
        rng = np.random.default_rng(12345)
        words = _NOUNS + _VERBS + _ADJS + _PREPS + _NUMBERS + ["the", "a"]
        used, self.lex = set(), {}
        for w in words:
            while True:
                t = "".join(rng.choice(_SYLL, size=2))
                if t not in used:
                    used.add(t)
                    self.lex[w] = t
                    break
        self.gender = {n: ("m" if rng.uniform() < 0.5 else "f") for n in _NOUNS}
        self.det = {("the", "m"): "el", ("the", "f"): "la", ("a", "m"): "un", ("a", "f"): "una"}

    def vocabularies(self) -> tuple[list[str], list[str]]:
        """Every source token and every target token the grammar can produce (fixed order)."""
        src = _NOUNS + _VERBS + _ADJS + _PREPS + _NUMBERS + ["the", "a"]
        tgt = [self.lex[w] for w in _NOUNS + _PREPS + _NUMBERS] + sorted(set(self.det.values())) + ["pl"]
        tgt += [self.lex[a] + g for a in _ADJS for g in "mf"]
        tgt += [self.lex[v] + n for v in _VERBS for n in ("", "n")]
        return src, tgt

    def _np(self, rng) -> tuple[list[str], list[str], bool]:
        noun = _NOUNS[rng.integers(len(_NOUNS))]
        adjs = [_ADJS[i] for i in rng.choice(len(_ADJS), size=rng.integers(0, 3), replace=False)]
        plural = rng.uniform() < 0.3
        g = self.gender[noun]
        if plural:
            num = _NUMBERS[rng.integers(len(_NUMBERS))]
            src = [num] + adjs + [noun]
            tgt = [self.lex[num], self.lex[noun], "pl"] + [self.lex[a] + g for a in adjs]
        else:
            det = "the" if rng.uniform() < 0.6 else "a"
            src = [det] + adjs + [noun]
            tgt = [self.det[(det, g)], self.lex[noun]] + [self.lex[a] + g for a in adjs]
        return src, tgt, plural

    def sentence(self, rng) -> tuple[list[str], list[str]]:
        """One (source, target) token pair."""
        s_src, s_tgt, s_pl = self._np(rng)
        verb = _VERBS[rng.integers(len(_VERBS))]
        o_src, o_tgt, _ = self._np(rng)
        src, tgt = s_src + [verb] + o_src, s_tgt + o_tgt
        if rng.uniform() < 0.4:
            prep = _PREPS[rng.integers(len(_PREPS))]
            p_src, p_tgt, _ = self._np(rng)
            src += [prep] + p_src
            tgt += p_tgt + [self.lex[prep]]
        tgt += [self.lex[verb] + ("n" if s_pl else "")]
        return src, tgt


def generate_pairs(n: int, *, seed: int = 0, rank: int = 0, world_size: int = 1
                   ) -> list[tuple[list[str], list[str]]]:
    """Rank ``rank``'s shard of ``n`` sentence pairs (chunks of 512 dealt round robin)."""
    task = GrammarTask()
    chunks = list(range(rank, -(-n // _CHUNK), world_size))
    if not chunks:
        raise ValueError(f"{n} generated sentences are too few for {world_size} ranks "
                         f"(each rank needs at least one chunk of {_CHUNK})")
    out = []
    for c in chunks:
        rng = np.random.default_rng([seed, c])
        out.extend(task.sentence(rng) for _ in range(_CHUNK))
    return out
