# Modules under tests/mpi/ run inside mpiexec (launched by tests/mpi_launch.py), never directly.
collect_ignore = ["mpi"]
