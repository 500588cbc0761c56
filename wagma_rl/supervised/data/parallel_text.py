"""A user's parallel text: ``<path>/<split>.<src>`` and ``<path>/<split>.<tgt>``, one sentence per line."""
from __future__ import annotations

from pathlib import Path

__all__ = ["read_parallel"]


def read_parallel(path: str | Path, split: str, *, src_ext: str = "src", tgt_ext: str = "tgt",
                  lowercase: bool = False) -> list[tuple[list[str], list[str]]]:
    """Whitespace-tokenised sentence pairs of ``split``; the two files must have equal line counts."""
    base = Path(path)
    files = [base / f"{split}.{src_ext}", base / f"{split}.{tgt_ext}"]
    for f in files:
        if not f.is_file():
            raise FileNotFoundError(f"parallel text file {str(f)!r} not found: data.path must hold "
                                    f"{split}.{src_ext} and {split}.{tgt_ext} (one sentence per line)")
    lines = [f.read_text(encoding="utf-8").splitlines() for f in files]
    if len(lines[0]) != len(lines[1]):
        raise ValueError(f"{files[0]} has {len(lines[0])} lines but {files[1]} has {len(lines[1])}; "
                         "parallel files need one line per sentence pair")
    norm = (lambda s: s.lower()) if lowercase else (lambda s: s)
    return [(norm(a).split(), norm(b).split()) for a, b in zip(*lines) if a.strip() and b.strip()]
