# Modules under tests/mpi/ run inside mpiexec (launched by tests/mpi_launch.py), never directly.
# tests/habitat_contract/ runs in .venv-habitat with tests/habitat_standins on PYTHONPATH
# (launched by tests/test_habitat_contract.py), never in this environment.
collect_ignore = ["mpi", "habitat_contract", "habitat_standins"]
