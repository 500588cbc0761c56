"""A discrete-event simulator of the trainer's distributed modes from 4 to thousands of workers.

    python -m wagma_rl.scale --modes allreduce preempt wagma dpsgd local_sgd --workers 1024 \\
        --updates 1000 --rollout lognormal:1.0,0.3 --group-size 8 --sync-period 10 --network ib100

* :mod:`.rollout`: compute times per worker and update (distributions, trace replay, a fit);
* :mod:`.collection`: inside a rank, lock-step or VER collection over per-env step times;
* :mod:`.network`: the alpha-beta-gamma network and its calibrated parameter sets;
* :mod:`.simulate`: one model per mode, following the project's protocols;
* :mod:`.cli`: the command line (``--json`` for machine-readable output).

The results are throughput figures (frames/s, waiting); how many frames a mode needs to learn is
outside the model. See docs/results/scale.md for the validation against real runs and the scale sweep.
"""
import numpy as np

from .collection import COLLECTIONS
from .network import NETWORKS, Network, get_network, network_of
from .rollout import Workload, fit_trace, parse_rollout
from .simulate import MODES, Setup, simulate

__all__ = ["simulate", "Setup", "MODES", "COLLECTIONS", "Network", "NETWORKS", "get_network", "network_of",
           "Workload", "parse_rollout", "fit_trace", "run"]


def run(modes, setup: Setup, workload: Workload, *, seed: int = 0) -> dict:
    """Simulate every mode of ``modes`` on the same drawn compute times (and env stalls);
    ``{mode: figures}``. A traced workload must be simulated with its run's rollout shape
    (ValueError otherwise: its times are those of that many frames)."""
    for name in ("num_steps", "num_envs"):
        traced = getattr(workload, name)
        if traced is not None and traced != getattr(setup, name):
            raise ValueError(f"the trace at {workload.params[0]} was recorded with "
                             f"{name}={traced}; simulate it with {name}={traced}, not "
                             f"{getattr(setup, name)}")
    draw = workload.draw(np.random.default_rng(seed), setup.updates, setup.workers, env_seed=seed)
    return {mode: simulate(mode, setup, draw) for mode in modes}
