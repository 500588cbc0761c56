# User-facing targets: install, test, train (each creates .venv/ when it is missing).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# The CPU wheel of torch; installed before the project so pip never resolves the CUDA build.
TORCH_SPEC ?= torch==2.13.0
# The editable install maps the package files that exist when it runs, so a new module (or a change
# to the native sources) re-runs it.
PKG_FILES  := $(wildcard native_coll/src/*.c native_coll/src/*.h) CMakeLists.txt pyproject.toml \
              $(shell find native_coll wagma_rl envs -name '*.py' 2>/dev/null)

.PHONY: install test train bench sanitize clean

install: $(VENV)/.stamp-install

$(VENV)/.stamp-deps:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install "$(TORCH_SPEC)"
	$(PIP) install "scikit-build-core>=0.10" "cmake>=3.18" ninja mpich mpi4py numpy gymnasium tensorboard pyyaml pillow pytest
	touch $@

# --no-build-isolation so the native library is compiled
# with the venv's mpicc (or $MPICC) and links the MPI that mpi4py loads.
$(VENV)/.stamp-install: $(VENV)/.stamp-deps $(PKG_FILES)
	$(PIP) install --no-build-isolation --no-deps -e ".[test]"
	touch $@

test: install
	$(PY) -m pytest -q

# The main job: DD-PPO with WAGMA on the embedded PointNav default scenes, 4 ranks (~10 minutes here).
train: install
	$(VENV)/bin/mpiexec -n 4 $(PY) run_ddppo.py --config configs/wagma_pointnav.yaml

# The collective's benchmark at 4 and 8 ranks (tables in benchmarks/results/, shown in the README).
bench: install
	$(VENV)/bin/mpiexec -n 4 $(PY) benchmarks/collective.py --group-size 4 --out benchmarks/results/collective_4.md
	$(VENV)/bin/mpiexec -n 8 $(PY) benchmarks/collective.py --group-size 4 --out benchmarks/results/collective_8.md

# Builds the C stress driver under AddressSanitizer and ThreadSanitizer and runs it at 4 ranks.
sanitize: install
	bash native_coll/tests/run_sanitizers.sh

clean:
	rm -rf build $(VENV) runs
