"""Contract tests against the real habitat-lab and habitat-baselines (0.3.320250127, from PyPI).

They run in the separate environment ``.venv-habitat`` (``make install-habitat``; habitat-lab
pins numpy 1.26 and gym 0.23) with ``tests/habitat_standins`` first on PYTHONPATH, through
``tests/test_habitat_contract.py`` (part of ``make test``) or ``make test-habitat``. Only the
compiled modules are stood in (habitat_sim, torchvision, and magnum/corrade registered by
sitecustomize.py; see their docstrings); everything else -- config composition, the dataset loader, Env/RLEnv, the gym
wrappers, the PointNav task, sensors and measures, RolloutStorage and PPO -- is habitat's code.
"""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STANDINS = REPO / "tests" / "habitat_standins"


def pytest_configure(config):
    import habitat_sim

    if Path(habitat_sim.__file__).resolve().parents[1] != STANDINS:
        raise pytest.UsageError(f"habitat_sim comes from {habitat_sim.__file__}, not the stand-in: "
                                f"run with PYTHONPATH={STANDINS}{os.pathsep}{REPO}")


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """Embedded episode files of the trivial scenes (train: 4, val: 3 episodes) and their export
    for habitat: ``{"embedded": {split: file}, "data_path": ..., "scenes_dir": ...}``."""
    from envs.pointnav.episodes import save_episodes
    from envs.pointnav.export import export
    from envs.pointnav.make_episodes import make_episodes

    root = tmp_path_factory.mktemp("exported")
    out = {"embedded": {}}
    for split, count in (("train", 4), ("val", 3)):
        eps = make_episodes(scenes="trivial", split=split, count=count, seed=5,
                            id_prefix=f"{split}-")
        out["embedded"][split] = str(root / f"embedded_{split}.json.gz")
        save_episodes(out["embedded"][split], eps)
        export(eps, str(root / "habitat"), split=split)
    out["data_path"] = str(root / "habitat" / "episodes" / "{split}" / "{split}.json.gz")
    out["scenes_dir"] = str(root / "habitat" / "scenes")
    return out
