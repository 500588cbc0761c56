"""The collective's exceptions."""
from __future__ import annotations

__all__ = ["CollectiveTimeout", "NonFiniteResult"]


class CollectiveTimeout(TimeoutError):
    """A collective could not complete: ``ranks`` did not answer within the timeout, or MPI reported
    the connection to them failed (a killed process, a lost node or link) before they delivered."""

    def __init__(self, message: str, ranks: tuple[int, ...] = ()):
        super().__init__(message)
        self.ranks = tuple(ranks)


class NonFiniteResult(FloatingPointError):
    """A collective's result held NaN or inf, so it was not applied: the buffer and the published
    contribution are as they were and the collective stays usable. Every member of that collective
    gets it (results are bitwise identical). ``iteration``: the refused collective (None: a
    synchronize); ``own``: whether this rank's own data (its contribution, or a late member's
    fresh buffer) held the NaN or inf."""

    def __init__(self, message: str, iteration: int = -1, own: bool = False):
        super().__init__(message)
        self.iteration = None if iteration < 0 else int(iteration)
        self.own = bool(own)
