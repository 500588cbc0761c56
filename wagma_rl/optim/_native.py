"""Import of the native wait-avoiding collective with an error that says how to get it."""
from __future__ import annotations

__all__ = ["native_coll"]


def native_coll():
    """Return the ``native_coll`` module, or raise ImportError with build instructions."""
    try:
        import native_coll as mod
    except ImportError as exc:
        raise ImportError("WAGMA and NonBlockingSGD need the native collective `native_coll`, "
                          "which is not built/importable here; run `make install` (it compiles "
                          f"native_coll with the environment's MPI). Original error: {exc}") from exc
    return mod
