"""What a backend hands the evaluator: a vector env over a fixed episode set."""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["EvalSet"]


class EvalSet(NamedTuple):
    """``env``: a vector env whose ``infos["counted"]`` is False for episodes past the set (an
    env that ran out replays uncounted); ``episode_ids``: the set, in order; ``source``: where
    the episodes come from (a file path), for the report."""

    env: Any
    episode_ids: list
    source: str
