"""STAND-IN for ``habitat_sim.errors``: the exception types habitat-lab imports."""

__all__ = ["GreedyFollowerError"]


class GreedyFollowerError(Exception):
    pass
