"""The collective's exceptions."""
from __future__ import annotations

__all__ = ["CollectiveTimeout"]


class CollectiveTimeout(TimeoutError):
    """A collective could not complete: ``ranks`` did not answer within the timeout, or MPI reported
    the connection to them failed (a killed process, a lost node or link) before they delivered."""

    def __init__(self, message: str, ranks: tuple[int, ...] = ()):
        super().__init__(message)
        self.ranks = tuple(ranks)
