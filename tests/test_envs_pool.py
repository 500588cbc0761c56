"""The env worker pool (envs.ProcessVectorEnv): one env per process, the gymnasium vector API in
lock-step, asynchronous steps of any subset, and its faults (a killed worker, a hung one,
signals, launcher variables), leaving no process and no shared memory behind; and
InProcessAsync, the same asynchronous calls over the batched in-process env.

The probe env below is imported by the workers from this module (a pool pickles env_fns by
reference)."""

import functools
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import VectorEnv
from gymnasium.vector.utils import batch_space

import envs
from envs import EnvWorkerError, InProcessAsync, ProcessVectorEnv
from envs.pointnav.episodes import load_episodes, save_episodes
from envs.pointnav.make_episodes import make_episodes
from envs.pool import WorkerEnvFn
from procs import start_time
from envs.pool.shared_memory import SHM_NAME

TESTS = Path(__file__).resolve().parent
OPTS = dict(scenes="trivial", depth_size=16)


@pytest.fixture(autouse=True)
def _deadline():
    """Every test here ends within 120 s (an alarm raises in the test) instead of hanging."""
    def expire(signum, frame):
        raise TimeoutError("test ran past its 120 s deadline")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(120)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


class ProbeEnv(VectorEnv):
    """One env: obs ``x`` = (index, steps taken, last action), reward = the action; a step
    sleeps ``step_s`` seconds; action ``raise_on`` raises ValueError. Keeps its process's
    environment and pid (``environ``, ``pid``) for the tests."""

    def __init__(self, index=0, *, step_s=0.0, raise_on=None):
        self.num_envs = 1
        self.single_observation_space = gym.spaces.Dict(
            {"x": gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)})
        self.single_action_space = gym.spaces.Discrete(4)
        self.observation_space = batch_space(self.single_observation_space, 1)
        self.action_space = batch_space(self.single_action_space, 1)
        self.index, self.step_s, self.raise_on, self.steps = index, step_s, raise_on, 0
        self.environ, self.pid = dict(os.environ), os.getpid()

    def _obs(self, action):
        return {"x": np.array([[self.index, self.steps, action]], np.float32)}

    def reset(self, *, seed=None, options=None):
        self.steps = 0
        return self._obs(-1), {"seed": np.array([-1 if seed is None else seed])}

    def step(self, actions):
        a = int(actions[0])
        if a == self.raise_on:
            raise ValueError(f"probe env {self.index} refuses action {a}")
        time.sleep(self.step_s)
        self.steps += 1
        return (self._obs(a), np.array([a], np.float32), np.array([a == 0]), np.array([False]),
                {"index": np.array([self.index])})


def tag_env(env, index):
    """A wrap_worker: marks the env with its index."""
    env.tag = f"wrapped {index}"
    return env


def probes(n, **kwargs):
    return [functools.partial(ProbeEnv, i, **kwargs) for i in range(n)]


def gone(pid, within=5.0):
    """Whether process ``pid`` has ended (no process, or a zombie) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def shm_blocks():
    """The pools' shared observation blocks this process maps, and any file of this process in
    /dev/shm (there should be none: the blocks are anonymous)."""
    maps = [line for line in Path("/proc/self/maps").read_text().splitlines()
            if SHM_NAME in line]
    # The pid as a whole token: another job's file may hold its digits by chance (CI once saw
    # MPICH's /dev/shm/mpich_shm_92803f_0 in worker 92803, from an MPI test in another worker).
    mine = re.compile(rf"(?<![0-9A-Za-z]){os.getpid()}(?![0-9A-Za-z])")
    return maps + [p for p in glob.glob("/dev/shm/*") if mine.search(Path(p).name)]


@pytest.fixture(scope="module")
def episode_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("pool") / "trivial_train.json.gz"
    save_episodes(path, make_episodes(scenes="trivial", split="train", count=8, seed=2))
    return str(path)


# ---- lock-step ------------------------------------------------------------------------------
def test_lock_step_equals_the_in_process_env_for_the_same_seeds():
    pool = envs.make_vector_env("pointnav", 3, workers="process", seed=4, **OPTS)
    ref = envs.make_vector_env("pointnav", 3, seed=4, **OPTS)
    assert isinstance(pool, ProcessVectorEnv) and pool.num_envs == 3
    assert len(set(pool.pids)) == 3 and os.getpid() not in pool.pids
    assert pool.observation_space == ref.observation_space
    assert pool.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
    rng = np.random.default_rng(0)
    ended = 0
    for seed in (None, 11):  # the constructor's seeds, then env i reseeded with 11 + i
        obs, infos = pool.reset(seed=seed)
        robs, rinfos = ref.reset(seed=seed)
        for k in robs:
            np.testing.assert_array_equal(obs[k], robs[k])
        assert list(infos["episode_id"]) == list(rinfos["episode_id"])
        for _ in range(80):
            actions = rng.choice(4, 3, p=[0.05, 0.55, 0.2, 0.2])
            out, want = pool.step(actions), ref.step(actions)
            for k in want[0]:
                np.testing.assert_array_equal(out[0][k], want[0][k])
            for got, exp in zip(out[1:4], want[1:4]):
                assert got.dtype == exp.dtype
                np.testing.assert_array_equal(got, exp)
            assert set(out[4]) == set(want[4])
            for k in want[4]:
                np.testing.assert_array_equal(out[4][k], want[4][k])
            ended += int(np.sum(want[2] | want[3]))
    assert ended > 0  # auto-resets were compared too
    pool.close()


def test_a_worker_runs_one_env():
    with pytest.raises(ValueError, match=r"num_envs=2; a ProcessVectorEnv worker runs one env"):
        ProcessVectorEnv([functools.partial(envs.PointNavVectorEnv, 2, **OPTS)], timeout=30)
    assert not shm_blocks()


def test_an_env_fn_that_cannot_be_pickled_is_refused_naming_it():
    with pytest.raises(TypeError, match=r"env_fns\[0\].*cannot be sent to a worker process"):
        ProcessVectorEnv([lambda: envs.PointNavVectorEnv(1, **OPTS)])


def test_an_env_fn_from_main_is_refused_where_the_workers_do_not_import_main(monkeypatch):
    def make():
        return ProbeEnv()

    make.__module__, make.__qualname__ = "__main__", "make_probe_in_main"
    monkeypatch.setattr(sys.modules["__main__"], "make_probe_in_main", make, raising=False)
    with pytest.raises(TypeError, match=r"env_fns\[0\].*is defined in __main__.*forkserver"):
        ProcessVectorEnv([make])
    with pytest.raises(ValueError, match="context must be 'exec', 'forkserver' or 'spawn'"):
        ProcessVectorEnv(probes(1), context="fork")


# ---- asynchronous steps ---------------------------------------------------------------------
def test_step_wait_any_returns_the_envs_that_finished_and_leaves_the_others_in_flight():
    fns = [functools.partial(ProbeEnv, 0), functools.partial(ProbeEnv, 1, step_s=0.5),
           functools.partial(ProbeEnv, 2)]
    with ProcessVectorEnv(fns, timeout=30) as pool:
        pool.reset()
        pool.step_async(np.array([2, 3]), np.array([0, 1]))
        assert pool.in_flight.tolist() == [True, True, False]
        ids, obs, rewards, term, trunc, infos = pool.step_wait_any()
        assert ids.dtype == np.int64 and ids.tolist() == [0]
        assert pool.in_flight.tolist() == [False, True, False]
        np.testing.assert_array_equal(obs["x"], [[0, 1, 2]])
        assert rewards.dtype == np.float32 and rewards.tolist() == [2.0]
        assert term.dtype == bool and trunc.dtype == bool and infos["index"].tolist() == [0]
        pool.step_async(np.array([1, 1]), np.array([2, 0]))
        seen = {}
        while pool.in_flight.any():
            ids, obs, rewards, *_ = pool.step_wait_any()
            assert ids.tolist() == sorted(ids.tolist())
            for i, x in zip(ids, obs["x"]):
                seen[int(i)] = x.tolist()
        assert seen == {0: [0, 2, 1], 1: [1, 1, 3], 2: [2, 1, 1]}


def test_step_wait_any_within_returns_no_env_when_none_finished_in_time():
    fns = [functools.partial(ProbeEnv, 0, step_s=0.5)]
    with ProcessVectorEnv(fns, timeout=30) as pool:
        pool.reset()
        pool.step_async(np.array([1]), np.array([0]))
        ids, obs, rewards, term, trunc, infos = pool.step_wait_any(within=0.05)
        assert ids.tolist() == [] and rewards.shape == (0,) and obs["x"].shape[0] == 0
        assert pool.in_flight.tolist() == [True]
        assert pool.step_wait_any(within=5.0)[0].tolist() == [0]


def test_the_asynchronous_calls_refuse_misuse():
    with ProcessVectorEnv(probes(2), timeout=30) as pool:
        with pytest.raises(RuntimeError, match="call reset"):
            pool.step_async(np.array([1]), np.array([0]))
        pool.reset()
        with pytest.raises(RuntimeError, match="no step in flight"):
            pool.step_wait_any()
        pool.step_async(np.array([1]), np.array([1]))
        with pytest.raises(ValueError, match=r"envs \[1\] already have a step in flight"):
            pool.step_async(np.array([1]), np.array([1]))
        with pytest.raises(ValueError, match="already have a step in flight"):
            pool.step(np.array([1, 1]))
        with pytest.raises(RuntimeError, match="reset.. with steps in flight"):
            pool.reset()
        with pytest.raises(ValueError, match=r"integers in \[0, 4\)"):
            pool.step_async(np.array([7]), np.array([0]))
        with pytest.raises(ValueError, match="out of range"):
            pool.step_async(np.array([1]), np.array([2]))
        assert pool.step_wait_any()[0].tolist() == [1]


def test_in_process_async_steps_the_batched_env_once_every_env_has_an_action():
    venv = InProcessAsync(envs.make_vector_env("pointnav", 2, seed=3, **OPTS))
    ref = envs.make_vector_env("pointnav", 2, seed=3, **OPTS)
    venv.reset()
    ref.reset()
    assert venv.pids == [os.getpid()] * 2 and venv.sim is venv.env.sim  # attributes pass through
    venv.step_async(np.array([2]), np.array([1]))
    with pytest.raises(RuntimeError, match=r"steps all its envs at once.*envs \[0\] have no"):
        venv.step_wait_any()
    venv.step_async(np.array([1]), np.array([0]))
    assert venv.in_flight.all()
    ids, obs, rewards, *_ = venv.step_wait_any()
    want = ref.step(np.array([1, 2]))
    assert ids.tolist() == [0, 1] and not venv.in_flight.any()
    np.testing.assert_array_equal(obs["depth"], want[0]["depth"])
    np.testing.assert_array_equal(rewards, want[1])
    with pytest.raises(RuntimeError, match="no step in flight"):
        venv.step_wait_any()


# ---- faults ---------------------------------------------------------------------------------
@pytest.mark.parametrize("context", ["exec", "forkserver"])
def test_a_killed_worker_raises_one_error_naming_env_and_pid_quickly(context):
    fns = [WorkerEnvFn(envs.PointNavVectorEnv, i, num_envs=1, **OPTS) for i in range(2)]
    pool = ProcessVectorEnv(fns, timeout=60, context=context)
    _, infos = pool.reset()
    episode = str(infos["episode_id"][1])
    pids = pool.pids
    os.kill(pids[1], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(EnvWorkerError) as err:
        pool.step(np.array([1, 1]))
    assert time.monotonic() - start < 5.0
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(
        f"env 1 (pid {pids[1]}, in episode {episode!r}) died during step")
    assert "killed by SIGKILL" in msg and err.value.env_ids == [1] and err.value.pids == [pids[1]]
    assert err.value.episodes == [episode]
    assert all(gone(p) for p in pids) and not shm_blocks()
    with pytest.raises(RuntimeError, match="closed after an error: env 1"):
        pool.step(np.array([1, 1]))
    pool.close()


@pytest.mark.parametrize("how", ["sleeps", "stopped"])
def test_a_hung_worker_raises_within_the_timeout(how):
    fns = [functools.partial(ProbeEnv, 0),
           functools.partial(ProbeEnv, 1, step_s=600.0 if how == "sleeps" else 0.0)]
    pool = ProcessVectorEnv(fns, timeout=2.0, start_timeout=60)
    pool.reset()
    pids = pool.pids
    if how == "stopped":
        os.kill(pids[1], signal.SIGSTOP)
    start = time.monotonic()
    with pytest.raises(EnvWorkerError) as err:
        pool.step(np.array([1, 1]))
    assert 1.9 < time.monotonic() - start < 6.0
    assert str(err.value) == (f"env 1 (pid {pids[1]}) did not finish a step within 2 s (hung or "
                              "too slow); the environment pool is closed")
    assert all(gone(p) for p in pids) and not shm_blocks()


def test_an_explicit_wait_timeout_names_every_env_still_in_flight():
    pool = ProcessVectorEnv(probes(2, step_s=600.0), timeout=60, names=["left", "right"])
    pool.reset()
    pool.step_async(np.array([1, 1]), np.array([0, 1]))
    with pytest.raises(EnvWorkerError, match=r"env 0 'left' \(pid \d+\), env 1 'right' \(pid "
                                             r"\d+\) did not finish a step within 0.5 s"):
        pool.step_wait_any(timeout=0.5)


def test_an_env_that_raises_closes_the_pool_with_its_error_and_traceback():
    pool = ProcessVectorEnv(probes(2, raise_on=3), timeout=30)
    pool.reset()
    pid = pool.pids[1]
    with pytest.raises(EnvWorkerError) as err:
        pool.step(np.array([1, 3]))
    assert str(err.value) == (f"env 1 (pid {pid}) raised ValueError in step: probe env 1 refuses "
                              "action 3; the environment pool is closed")
    assert "Traceback" in err.value.worker_traceback and "def step" not in str(err.value)
    assert gone(pid) and not shm_blocks()


def test_a_construction_error_keeps_its_type_and_leaves_nothing_behind():
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['scene'\]"):
        envs.make_vector_env("pointnav", 2, workers="process", scene="trivial")
    assert not shm_blocks()


SIGNAL_SCRIPT = """
import json, os, signal, sys, time
sys.path[:0] = [{tests!r}, {repo!r}]
import numpy as np
from envs import ProcessVectorEnv
from test_envs_pool import probes
got = []
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
    signal.signal(s, lambda n, f: got.append(n))
with ProcessVectorEnv(probes(2, step_s=1.0), timeout=30, context={context!r}) as pool:
    pool.reset()
    pool.step_async(np.array([1, 2]), np.array([0, 1]))
    time.sleep(0.3)
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        os.killpg(0, s)  # the whole group: this process, the workers (and a forkserver)
    done = []
    while pool.in_flight.any():
        done += pool.step_wait_any()[0].tolist()
    obs = pool.step(np.array([3, 3]))[0]  # the workers still answer
    pids = pool.pids
print(json.dumps({{"done": sorted(done), "got": sorted(set(got)), "x": obs["x"].tolist(),
                  "pids": pids}}))
"""


@pytest.mark.parametrize("context", ["exec", "forkserver"])
def test_signals_to_the_process_group_during_a_step_do_not_stop_the_workers(context):
    script = SIGNAL_SCRIPT.format(tests=str(TESTS), repo=str(TESTS.parent), context=context)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=90, start_new_session=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["done"] == [0, 1]
    assert out["got"] == sorted([signal.SIGINT, signal.SIGTERM, signal.SIGUSR1])
    assert out["x"] == [[0, 2, 3], [1, 2, 3]]
    assert all(gone(p) for p in out["pids"])


ORPHAN_SCRIPT = """
import json, sys, time
sys.path[:0] = [{tests!r}, {repo!r}]
import numpy as np
from envs import ProcessVectorEnv
from test_envs_pool import ProbeEnv
import functools
pool = ProcessVectorEnv([functools.partial(ProbeEnv, 0), functools.partial(ProbeEnv, 1,
                         step_s=600.0)], timeout=900, context={context!r})
pool.reset()
pool.step_async(np.array([1, 1]), np.array([0, 1]))  # env 1 hangs in its step ("the simulator")
print(json.dumps(pool.pids), flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("context", ["exec", "forkserver"])
def test_workers_idle_or_hung_die_with_a_killed_trainer(context):
    script = ORPHAN_SCRIPT.format(tests=str(TESTS), repo=str(TESTS.parent), context=context)
    trainer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        pids = json.loads(trainer.stdout.readline())
        started = {p: start_time(p) for p in pids}
    finally:
        trainer.kill()  # SIGKILL: no clean-up of its own runs
        trainer.wait(30)
        trainer.stdout.close()
    try:
        assert len(pids) == 2 and all(gone(p, within=10.0) for p in pids)
    finally:
        for p in pids:  # a worker that outlived its trainer; never a process that took its pid
            if started[p] is not None and start_time(p) == started[p]:
                os.kill(p, signal.SIGKILL)


LAUNCHER_SCRIPT = """
import json, sys
sys.path[:0] = [{tests!r}, {repo!r}]
from envs import ProcessVectorEnv
from test_envs_pool import probes
with ProcessVectorEnv(probes(1), timeout=30, context={context!r}) as pool:
    print(json.dumps(sorted(pool.get_attr("environ")[0])))
"""


@pytest.mark.parametrize("context", ["exec", "forkserver"])
def test_mpi_launcher_variables_do_not_reach_the_workers(context):
    launcher = {"PMI_RANK": "1", "PMI_SIZE": "2", "PMI_FD": "7", "PMIX_RANK": "1",
                "HYDRA_CONTROL_FD": "9", "OMPI_COMM_WORLD_RANK": "1", "I_MPI_PIN": "1",
                "MPIR_CVAR_CH3_NOLOCAL": "1", "MPI_LOCALRANKID": "1", "SLURM_PROCID": "1",
                "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2"}
    kept = {"SLURM_JOB_ID": "42", "WAGMA_PROBE": "yes"}
    env = {**os.environ, **launcher, **kept}
    script = LAUNCHER_SCRIPT.format(tests=str(TESTS), repo=str(TESTS.parent), context=context)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=90, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = set(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert not seen & set(launcher) and set(kept) <= seen


# ---- cleanup --------------------------------------------------------------------------------
def test_close_leaves_no_process_and_no_shared_memory():
    pool = ProcessVectorEnv(probes(2), timeout=30)
    pool.reset()
    assert len(shm_blocks()) == 1
    pool.step_async(np.array([1]), np.array([0]))  # close() with a step in flight
    pids = pool.pids
    pool.close()
    assert all(gone(p) for p in pids) and not shm_blocks()
    with pytest.raises(RuntimeError, match="closed"):
        pool.reset()


def test_garbage_collection_closes_a_forgotten_pool():
    import gc

    pool = ProcessVectorEnv(probes(2), timeout=30)
    pids = pool.pids
    del pool
    gc.collect()
    assert all(gone(p) for p in pids) and not shm_blocks()


# ---- the factory ----------------------------------------------------------------------------
def _episodes_seen(venv, steps):
    """Episode ids each env ran in ``steps`` steps of STOP (each step ends an episode)."""
    _, infos = venv.reset()
    seen = [{str(e)} for e in infos["episode_id"]]
    for _ in range(steps):
        infos = venv.step(np.zeros(venv.num_envs, dtype=np.int64))[4]
        for i, e in enumerate(infos["episode_id"]):
            seen[i].add(str(e))
    return seen


def test_workers_take_disjoint_shares_of_an_episode_file(episode_file):
    ids = [e.episode_id for e in load_episodes(episode_file)]
    # rank 1 of 2 with 2 envs: env i runs share 1 * 2 + i of 4 (every 4th episode from there)
    with envs.make_vector_env("pointnav", 2, workers="process", episodes=episode_file,
                              shard_index=1, num_shards=2, depth_size=8) as pool:
        assert _episodes_seen(pool, 6) == [set(ids[2::4]), set(ids[3::4])]


def test_wrap_worker_wraps_each_env_in_its_worker():
    with envs.make_vector_env("pointnav", 2, workers="process", wrap_worker=tag_env,
                              **OPTS) as pool:
        assert pool.get_attr("tag") == ["wrapped 0", "wrapped 1"]
    with pytest.raises(TypeError, match="wrap_worker .* needs workers='process'"):
        envs.make_vector_env("pointnav", 2, wrap_worker=tag_env, **OPTS)
    with pytest.raises(ValueError, match="workers must be one of"):
        envs.make_vector_env("pointnav", 2, workers="threads", **OPTS)


def test_an_evaluation_set_in_worker_processes_runs_each_episode_once(episode_file):
    eval_set = envs.make_eval_env("pointnav", 3, episodes=episode_file, workers="process",
                                  depth_size=8, max_episode_steps=5)
    with eval_set.env as venv:
        assert isinstance(venv, ProcessVectorEnv) and venv.num_envs == 3
        venv.reset()
        counted = []
        for _ in range(4 * 5):
            _, _, term, trunc, infos = venv.step(np.full(3, 2))
            counted += [str(e) for e, c, d in zip(infos["episode_id"], infos["counted"],
                                                  term | trunc) if c and d]
    assert sorted(counted) == sorted(eval_set.episode_ids)


@pytest.mark.mpi
def test_workers_of_mpi_ranks_are_no_ranks_even_when_the_script_imports_mpi_first():
    from mpi_launch import mpi_run

    proc = mpi_run(2, [str(TESTS / "programs" / "env_pool_under_mpi.py")], timeout=100)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert sorted(r["rank"] for r in lines) == [0, 1]
    for r in lines:
        assert r["rank_has"] and r["workers_see"] == [] and r["x"] == [[0, 1, 1], [1, 1, 2]]
