"""Token vocabularies for the translation task (ids 0-3 are PAD, BOS, EOS, UNK)."""
from __future__ import annotations

from collections import Counter
from typing import Iterable, Sequence

__all__ = ["PAD", "BOS", "EOS", "UNK", "Vocab"]

PAD, BOS, EOS, UNK = 0, 1, 2, 3
_SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")


class Vocab:
    """A fixed list of tokens; unknown tokens map to UNK."""

    def __init__(self, tokens: Iterable[str]):
        self.itos = list(_SPECIALS) + [t for t in tokens if t not in _SPECIALS]
        self.stoi = {t: i for i, t in enumerate(self.itos)}

    @classmethod
    def build(cls, sentences: Iterable[Sequence[str]], *, max_size: int = 32000) -> "Vocab":
        """The ``max_size`` most frequent tokens of ``sentences`` (ties broken alphabetically)."""
        counts = Counter(t for s in sentences for t in s)
        ranked = sorted(counts, key=lambda t: (-counts[t], t))
        return cls(ranked[: max(0, max_size - len(_SPECIALS))])

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, tokens: Sequence[str]) -> list[int]:
        return [self.stoi.get(t, UNK) for t in tokens]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Tokens up to the first EOS, without padding/BOS."""
        out = []
        for i in ids:
            i = int(i)
            if i == EOS:
                break
            if i not in (PAD, BOS):
                out.append(self.itos[i] if i < len(self.itos) else "<unk>")
        return out
