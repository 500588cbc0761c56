"""One mpiexec launch per rank count for the multi-rank specification modules that run with the
plain environment (tests/test_native_coll_mpi.py, tests/test_overlap.py, tests/test_optim_mpi.py):
the ranks start once per count instead of once per module and count (a start costs a rank about
2.5 CPU-s, 4.5 once it steps a torch optimizer). Each test asserts its own module's outcome in
the shared launch (:func:`mpi_launch.assert_module_passed`); tests/conftest.py keeps the three
files in one xdist worker, so each launch is made once per session."""
from __future__ import annotations

import functools

from mpi_launch import assert_module_passed, mpi_pytest_shared

# module -> (rank counts it runs at, its own time limit in seconds)
SPEC_MODULES = {
    "tests/mpi/native_coll_cases.py": ((1, 2, 3, 4, 8), 240),
    "tests/mpi/native_coll_pretended_cases.py": ((8,), 240),
    "tests/mpi/hier_cases.py": ((2, 4, 6, 8), 240),
    "tests/mpi/overlap_cases.py": ((2, 3, 4, 8), 240),
    "tests/mpi/overlap_pretended_cases.py": ((4,), 240),
    "tests/mpi/optim_cases.py": ((2, 3, 4), 120),
    "tests/mpi/optim_wagma_cases.py": ((2, 3, 4), 180),
    "tests/mpi/optim_outer_cases.py": ((2, 3, 4), 180),
    "tests/mpi/precision_cases.py": ((2, 3, 4), 180),
    "tests/mpi/optim_nonblocking_buckets_cases.py": ((2, 4), 120),
    "tests/mpi/optim_background_cases.py": ((2, 4), 120),
    "tests/mpi/optim_node_cases.py": ((2, 3, 4), 60),
}
SHARING_FILES = ("test_native_coll_mpi.py", "test_overlap.py", "test_optim_mpi.py")
"""The test files whose tests share these launches (one xdist group in tests/conftest.py)."""


@functools.lru_cache(maxsize=None)
def spec_launch(nprocs: int):
    """The launch at ``nprocs`` ranks of every module of SPEC_MODULES that runs at that count."""
    modules = [m for m, (counts, _) in SPEC_MODULES.items() if nprocs in counts]
    limit = sum(SPEC_MODULES[m][1] for m in modules)
    return mpi_pytest_shared(nprocs, modules, timeout=limit)


def assert_spec_passed(module: str, nprocs: int) -> None:
    """``module`` passed on every rank of the shared launch at ``nprocs`` ranks."""
    counts, _ = SPEC_MODULES[module]
    assert nprocs in counts, f"{module} is not specified at {nprocs} ranks (SPEC_MODULES)"
    assert_module_passed(spec_launch(nprocs), module)
