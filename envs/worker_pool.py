"""Environments in worker processes: :class:`ProcessVectorEnv` (one env per process, stepped in
lock-step or asynchronously) and :class:`InProcessAsync` (the same asynchronous calls over a
batched vector env in this process).

Why not gymnasium's ``AsyncVectorEnv``: it steps all envs or none (no subset in flight, which
variable experience rollouts need), names no worker when one dies or hangs, and its workers
die with the trainer's SIGINT/SIGTERM. habitat's ``VectorEnv`` has the right shape (a process
per env, workers that ignore signals) but pickles every frame. This module keeps gymnasium's
vector API (what the trainer and ``PointNavVectorEnv`` speak) and adds ``step_async(actions,
env_ids)`` / ``step_wait_any()``.

Each worker is a fresh Python interpreter (``context="exec"``, the default: fork and exec, so
no copy of the trainer's MPI state, torch threads or locks, and not its ``__main__`` script,
whose import would initialise MPI in the worker if the script imports mpi4py at the top). It
starts with the MPI launcher's variables removed from its environment (:data:`LAUNCHER_PREFIXES`:
a child must not take itself for an MPI rank) and with SIGINT, SIGTERM and SIGUSR1 blocked until
it ignores them (the trainer's handlers decide when to stop; the pool ends with
:meth:`ProcessVectorEnv.close`), and dies with the pool's process: the kernel sends it SIGKILL
when its parent dies (Linux's ``PR_SET_PDEATHSIG``), so a worker hung inside its simulator does
not outlive a trainer that was killed (under a forkserver, a thread of the worker watches the
pool's process instead). ``context="forkserver"`` or ``"spawn"`` use multiprocessing
instead, for env_fns defined in ``__main__``: those workers import the parent's ``__main__``
before they can drop the variables, so keep MPI's import inside ``main()`` there.

Observations go through one block of shared memory (an anonymous memfd: nothing in /dev/shm to
leak, freed with its last mapping); only rewards, flags and the small ``infos`` arrays cross the
pipes.
"""

from __future__ import annotations

import mmap
import multiprocessing as mp
import os
import pickle
import pickletools
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from multiprocessing import reduction, util
from multiprocessing.connection import Connection, wait

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv, VectorWrapper
from gymnasium.vector.utils import batch_space

__all__ = ["ProcessVectorEnv", "InProcessAsync", "EnvWorkerError", "LAUNCHER_PREFIXES",
           "WorkerEnvFn"]

# Variables of MPI launchers (Hydra, Open MPI, Intel MPI, PMI/PMIx) and of a SLURM job step
# that make a process take itself for an MPI rank or a task of the step. Job-level SLURM
# variables (SLURM_JOB_ID, ...) stay.
LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "MPI_", "MPIR_", "MPIEXEC_", "HYDRA_", "HYDI_", "OMPI_",
                     "ORTE_", "PRTE_", "I_MPI_", "SLURM_STEP", "SLURM_SRUN_", "SLURM_PMI")
_LAUNCHER_NAMES = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_GTIDS",
                   "SLURM_TASK_PID", "SLURM_STEPID", "SLURM_LAUNCH_NODE_IPADDR")
# The observation block: an anonymous memory file (memfd) with this name in /proc/*/maps.
SHM_NAME = "wagma_envs_obs"
_IGNORED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
_ALIGN = 64


class EnvWorkerError(RuntimeError):
    """A worker process died, hung past the timeout or its env raised; the pool is closed.
    ``env_ids`` and ``pids`` name the workers, ``episodes`` the episode each was in (or had
    just ended; None before its first), all named in the message too; ``worker_traceback``
    holds the env's traceback when it raised."""

    def __init__(self, message, *, env_ids=(), pids=(), episodes=(), worker_traceback=None):
        super().__init__(message)
        self.env_ids = list(env_ids)
        self.pids = list(pids)
        self.episodes = list(episodes)
        self.worker_traceback = worker_traceback


class WorkerEnvFn:
    """A picklable ``env_fn``: ``build(**options)``, then ``wrap(env, index)`` when ``wrap`` is
    given (``build`` and ``wrap`` must be picklable: module-level functions or classes)."""

    def __init__(self, build, index=0, *, wrap=None, **options):
        self.build, self.index, self.wrap, self.options = build, int(index), wrap, options

    def __call__(self):
        env = self.build(**self.options)
        return env if self.wrap is None else self.wrap(env, self.index)

    def __repr__(self):
        return f"WorkerEnvFn({getattr(self.build, '__qualname__', self.build)}, {self.index})"


def _scrub_launcher_environment(environ=os.environ):
    """Remove the MPI launcher's and SLURM step's variables from ``environ``."""
    for key in list(environ):
        if key.startswith(LAUNCHER_PREFIXES) or key in _LAUNCHER_NAMES:
            del environ[key]


def _portable(exc):
    """``exc`` if it survives pickling, else a RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _layout(space):
    """``[(key, shape, dtype, offset)]`` of one env's Dict-of-Box observation and its bytes."""
    if not isinstance(space, gym.spaces.Dict) or not all(
            isinstance(s, gym.spaces.Box) for s in space.spaces.values()):
        raise TypeError(f"ProcessVectorEnv shares Dict observations of Box entries, got {space}")
    out, offset = [], 0
    for key, box in space.spaces.items():
        out.append((key, tuple(box.shape), np.dtype(box.dtype), offset))
        offset += -(-int(np.prod(box.shape, dtype=np.int64)) * np.dtype(box.dtype).itemsize
                    // _ALIGN) * _ALIGN
    return out, offset


def _shared_file(size):
    """A file descriptor of ``size`` bytes of anonymous shared memory: a memfd (no name in
    /dev/shm to leak, not bounded by its size), else an unlinked file there."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create(SHM_NAME, os.MFD_CLOEXEC)
    else:
        fd, path = tempfile.mkstemp(prefix=SHM_NAME,
                                    dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        os.unlink(path)
    os.ftruncate(fd, size)
    return fd


def _views(buf, layout, stride, num_envs):
    """Arrays ``(num_envs, *shape)`` per key over ``buf`` (env ``i`` at ``i * stride``)."""
    return {key: np.ndarray((num_envs, *shape), dtype=dtype, buffer=buf, offset=offset,
                            strides=(stride, *np.empty(shape, dtype).strides))
            for key, shape, dtype, offset in layout}


def _serve(index, conn, payload):
    """A worker's life: build the env, then answer ``(command, *args)`` messages."""
    env = block = views = None
    try:
        try:
            env = pickle.loads(payload)()
            if getattr(env, "num_envs", None) != 1:
                raise ValueError(f"env_fns[{index}] built {type(env).__name__} with num_envs="
                                 f"{getattr(env, 'num_envs', None)}; a ProcessVectorEnv worker "
                                 "runs one env (num_envs=1)")
            _layout(env.single_observation_space)
        except BaseException as exc:
            conn.send(("error", _portable(exc), traceback.format_exc()))
            return
        conn.send(("ok", (env.single_observation_space, env.single_action_space)))
        while True:
            cmd, *args = conn.recv()
            if cmd == "close":
                return
            try:
                if cmd == "attach":  # the block's descriptor follows the message
                    layout, stride, size = args
                    fd = reduction.recv_handle(conn)
                    block = mmap.mmap(fd, size)
                    os.close(fd)
                    views = {k: v[index] for k, v in _views(block, layout, stride,
                                                            index + 1).items()}
                    reply = None
                elif cmd == "step":
                    obs, rew, term, trunc, info = env.step(np.asarray([args[0]]))
                    for k, v in views.items():
                        v[...] = obs[k][0]
                    reply = (float(rew[0]), bool(term[0]), bool(trunc[0]), info)
                elif cmd == "reset":
                    obs, info = env.reset(seed=args[0], options=args[1])
                    for k, v in views.items():
                        v[...] = obs[k][0]
                    reply = info
                elif cmd == "get_attr":
                    reply = getattr(env, args[0])
                else:
                    raise ValueError(f"unknown command {cmd!r}")
            except Exception as exc:
                conn.send(("error", _portable(exc), traceback.format_exc()))
            else:
                conn.send(("ok", reply))
    except (EOFError, OSError):  # the pool's process is gone: nothing to answer
        pass
    finally:
        views = None
        if block is not None:
            block.close()
        if env is not None:
            try:
                env.close()
            except Exception:
                pass


def _die_with(pool_pid):
    """End this process when the pool's process ``pool_pid`` dies: Linux's
    ``PR_SET_PDEATHSIG`` when that is the parent (``spawn``); under a forkserver (the parent,
    which the trainer's signals may end before the pool does) a thread that polls it."""
    if os.getppid() == pool_pid:
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
            if os.getppid() == pool_pid:
                return
        except (OSError, AttributeError):
            pass

    def watch():
        while True:
            try:
                os.kill(pool_pid, 0)
            except ProcessLookupError:
                os._exit(1)
            except PermissionError:
                pass
            time.sleep(0.5)

    import threading

    threading.Thread(target=watch, name="die-with-pool", daemon=True).start()


def _mp_worker(index, conn, payload, pool_pid):
    """A multiprocessing worker: die with the pool's process, ignore the signals, drop the
    launcher's variables, serve."""
    _die_with(pool_pid)
    for sig in _IGNORED_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    _scrub_launcher_environment()
    _serve(index, conn, payload)


def _exec_worker(fd):
    """An exec'd worker (:data:`_BOOT`): its index, env_fn and the pool's ``sys.path`` come
    first over the pipe ``fd``."""
    conn = Connection(fd)
    try:
        index, payload, path = conn.recv()
    except (EOFError, OSError):
        return
    sys.path[:] = path
    try:
        _serve(index, conn, payload)
    finally:  # as multiprocessing's workers: no interpreter teardown (slow) once the env closed
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


# An exec'd worker's program: the signals arrive blocked (see _ExecWorker) and are ignored before
# they are unblocked, so none can stop it, not even while the interpreter starts. First of all it
# asks the kernel for SIGKILL when its parent dies (Linux's PR_SET_PDEATHSIG, through libc's
# prctl), then leaves if the parent (argv[2]) is gone already: a worker hung inside its simulator
# never reads the pipe's EOF, and must not outlive a trainer that was killed.
_BOOT = """import signal, sys, os
try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):  # not Linux: the pipe's EOF still ends an idle worker
    pass
if os.getppid() != int(sys.argv[2]):
    os._exit(0)
signals = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
for s in signals:
    signal.signal(s, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
from envs.worker_pool import _exec_worker
_exec_worker(int(sys.argv[1]))
"""


def _from_main(payload):
    """Whether a pickle names an object of ``__main__`` (which an exec'd worker does not have)."""
    for op, arg, _ in pickletools.genops(payload):
        if (op.name in ("GLOBAL", "INST") and str(arg).split(" ")[0] == "__main__") or (
                "UNICODE" in op.name and arg == "__main__"):
            return True
    return False


class _ExecWorker:
    """A worker started as a fresh interpreter (fork and exec) with the launcher's variables
    removed from its environment and the ignored signals blocked until it ignores them."""

    def __init__(self, index, payload):
        env = dict(os.environ)
        _scrub_launcher_environment(env)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where envs is
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        ours, theirs = socket.socketpair()
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _IGNORED_SIGNALS)
        try:
            self.popen = subprocess.Popen([sys.executable, "-c", _BOOT, str(theirs.fileno()),
                                           str(os.getpid())],
                                          pass_fds=[theirs.fileno()], env=env,
                                          stdin=subprocess.DEVNULL)
        except BaseException:
            ours.close()
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            theirs.close()
        self.conn, self.pid = Connection(ours.detach()), self.popen.pid
        self.first_message = (index, payload, list(sys.path))

    def exitcode(self, wait_s):
        """The exit code (negative: the signal) once it has exited within ``wait_s``, else None."""
        try:
            return self.popen.wait(wait_s)
        except subprocess.TimeoutExpired:
            return None


class _ProcessWorker:
    """A multiprocessing worker (``context`` "forkserver" or "spawn")."""

    first_message = None

    def __init__(self, ctx, index, payload):
        ours, theirs = ctx.Pipe()
        self.proc = ctx.Process(target=_mp_worker, args=(index, theirs, payload, os.getpid()),
                                daemon=True, name=f"env-worker-{index}")
        try:
            self.proc.start()
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.conn, self.pid = ours, self.proc.pid

    def exitcode(self, wait_s):
        """The exit code once it has exited within ``wait_s``, else None (also when the
        forkserver that reports it is gone)."""
        self.proc.join(wait_s)
        return None if self.proc.exitcode == 255 else self.proc.exitcode


class _Resources:
    """What a pool owns (processes, pipes, the shared observation block), released once by
    :meth:`release` (from ``close()``, after an error, at garbage collection or at exit)."""

    def __init__(self):
        self.workers, self.block, self.released = [], None, False
        self.obs = None  # the parent's views of the block

    def release(self, grace=0.0):
        """Ask the workers to close (waiting up to ``grace`` seconds), SIGKILL the rest, reap
        them, close the pipes and unmap the shared memory (freed with its last mapping)."""
        if self.released:
            return
        self.released = True
        live = {}
        for w in self.workers:
            if w.conn.closed:
                continue
            if grace > 0:
                try:
                    w.conn.send(("close",))
                except OSError:
                    pass
            live[w.conn] = w
        deadline = time.monotonic() + grace
        while live:  # a worker's pipe reaches EOF when it exits
            ready = wait(list(live), max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            for conn in ready:
                try:
                    conn.recv()  # a step's answer, sent before it read "close"
                except (EOFError, OSError):
                    live.pop(conn)
        # A worker whose pipe is still open is alive (an exited one closed it), so its pid is
        # its own: SIGKILL it (the workers ignore SIGTERM; a stopped one dies too).
        for w in live.values():
            try:
                os.kill(w.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for w in self.workers:
            w.exitcode(5.0)  # reaped
            w.conn.close()
        self.obs = None  # views must go before the block is unmapped
        if self.block is not None:
            try:
                self.block.close()
            except BufferError:  # a view still held somewhere: unmapped when it goes
                pass


class ProcessVectorEnv(VectorEnv):
    """``len(env_fns)`` environments, each in its own worker process, with gymnasium's vector
    API, SAME_STEP autoreset (as the wrapped envs) and asynchronous stepping of any subset.

    ``env_fns``: picklable zero-argument callables (module-level functions, classes,
    ``functools.partial`` or :class:`WorkerEnvFn`), each returning a vector env of exactly one
    env (``num_envs == 1``, e.g. ``PointNavVectorEnv(1, ...)``) with a Dict-of-Box observation
    space; all must have the same spaces. ``timeout``: seconds a worker may take to start, to
    answer a reset or to finish a step before :class:`EnvWorkerError`; ``start_timeout``: to
    start and build its env (default ``timeout``). ``context``: how workers start, ``"exec"``
    (a fresh interpreter; env_fns must come from an importable module) or multiprocessing's
    ``"forkserver"``/``"spawn"`` (see the module docs). ``names``: labels for error messages.

    Results are what the wrapped envs return, stacked over envs: observations are copies,
    rewards float32, terminated/truncated bool, ``infos`` the dict of arrays whose keys every
    env reported, concatenated. A worker that dies, hangs past ``timeout`` or whose env raises
    closes the pool and raises one :class:`EnvWorkerError` naming the env, its pid and the
    episode it was in (its ``infos["episode_id"]``, when the env reports one).
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, env_fns, *, timeout=300.0, context="exec", names=None,
                 start_timeout=None):
        env_fns = list(env_fns)
        if not env_fns:
            raise ValueError("ProcessVectorEnv needs at least one env_fn")
        start_timeout = timeout if start_timeout is None else start_timeout
        if not (timeout > 0 and start_timeout > 0):
            raise ValueError(f"timeouts must be > 0 seconds, got {timeout!r}, {start_timeout!r}")
        if names is not None and len(names) != len(env_fns):
            raise ValueError(f"{len(names)} names for {len(env_fns)} env_fns")
        if context == "fork" or (context != "exec" and context not in mp.get_all_start_methods()):
            raise ValueError(f"context must be 'exec', 'forkserver' or 'spawn', got {context!r} "
                             "(a fork copies the trainer's MPI state and threads)")
        ctx = None if context == "exec" else mp.get_context(context)
        payloads = []
        for i, fn in enumerate(env_fns):
            try:
                payloads.append(pickle.dumps(fn))
            except Exception as exc:
                raise TypeError(f"env_fns[{i}] ({fn!r}) cannot be sent to a worker process: "
                                f"{exc}; use a module-level function, a class or "
                                "functools.partial of one") from exc
            if context == "exec" and _from_main(payloads[-1]):
                raise TypeError(f"env_fns[{i}] ({fn!r}) is defined in __main__, which a worker "
                                "process does not import: define it in a module (or use "
                                "context='forkserver')")
        self.num_envs = len(env_fns)
        self.timeout = float(timeout)
        self.closed = False
        self._names = None if names is None else [str(n) for n in names]
        self._in_flight = np.zeros(self.num_envs, dtype=bool)
        self._sent_at = np.zeros(self.num_envs)
        self._episodes = [None] * self.num_envs  # (episode id, ended) each env reported last
        self._started = False
        self._broken = None
        self._res = _Resources()
        self._finalizer = util.Finalize(self, _Resources.release, args=(self._res,),
                                        exitpriority=10)
        try:
            for i, payload in enumerate(payloads):
                if context == "exec":
                    self._res.workers.append(_ExecWorker(i, payload))
                    self._send(i, self._res.workers[i].first_message, "start")
                else:
                    self._res.workers.append(_ProcessWorker(ctx, i, payload))
            spaces = self._gather(range(self.num_envs), "start", float(start_timeout))
            self._set_spaces(spaces)
            layout, stride = _layout(self.single_observation_space)
            stride = max(stride, _ALIGN)
            fd = _shared_file(stride * self.num_envs)
            try:
                self._res.block = mmap.mmap(fd, stride * self.num_envs)
                self._res.obs = _views(self._res.block, layout, stride, self.num_envs)
                for i, w in enumerate(self._res.workers):
                    self._send(i, ("attach", layout, stride, stride * self.num_envs))
                    try:
                        reduction.send_handle(w.conn, fd, w.pid)
                    except OSError:
                        self._dead(i, "attach")
            finally:
                os.close(fd)
            self._gather(range(self.num_envs), "attach", float(start_timeout))
        except BaseException:
            self._release(grace=0.0)
            raise

    # ---- the gymnasium vector API ---------------------------------------------------------
    def reset(self, *, seed=None, options=None):
        """Reset every env (``seed``: env ``i`` reseeded with ``seed + i``); returns
        ``(obs, infos)``. No step may be in flight."""
        self._check_open()
        if self._in_flight.any():
            raise RuntimeError(f"reset() with steps in flight (envs "
                               f"{np.flatnonzero(self._in_flight).tolist()}): collect them "
                               "with step_wait_any() first")
        for i in range(self.num_envs):
            self._send(i, ("reset", None if seed is None else int(seed) + i, options))
        infos = self._gather(range(self.num_envs), "reset")
        for i, info in enumerate(infos):
            self._note_episode(i, info, False)
        self._started = True
        return self._observations(None), _concat_infos(infos)

    def step(self, actions):
        """Step every env with ``actions`` (one per env) and wait for all; returns
        ``(obs, rewards, terminated, truncated, infos)``."""
        ids = np.arange(self.num_envs)
        self.step_async(actions, ids)
        results = self._gather(ids, "step")
        return (self._observations(None), *_stack_results(results))

    def step_async(self, actions, env_ids):
        """Send ``actions[k]`` to env ``env_ids[k]``; raises ValueError when one of them has a
        step in flight."""
        self._check_open()
        if not self._started:
            raise RuntimeError("call reset() before step()")
        ids, actions = _check_async(actions, env_ids, self._in_flight, self.single_action_space)
        now = time.monotonic()
        for i, a in zip(ids, actions):
            self._send(int(i), ("step", a))
            self._in_flight[i] = True
            self._sent_at[i] = now

    def step_wait_any(self, *, timeout=None, within=None):
        """Wait until at least one env in flight finished its step (up to ``timeout`` seconds,
        default the pool's; each env also has the pool's timeout from its ``step_async``), then
        return ``(env_ids, obs, rewards, terminated, truncated, infos)`` of every env in flight
        that has finished, ``env_ids`` ascending. ``within``: give up after that many seconds
        without an error, returning no env (empty arrays) when none finished by then."""
        self._check_open()
        waiting = np.flatnonzero(self._in_flight)
        if waiting.size == 0:
            raise RuntimeError("step_wait_any() with no step in flight: call step_async() first")
        limit = self.timeout if timeout is None else float(timeout)
        call_deadline = time.monotonic() + limit
        give_up = None if within is None else time.monotonic() + max(0.0, float(within))
        conns = {self._res.workers[i].conn: int(i) for i in waiting}
        while True:
            until = min(call_deadline, float(self._sent_at[waiting].min()) + self.timeout)
            if give_up is not None:
                until = min(until, give_up)
            ready = wait(list(conns), max(0.0, until - time.monotonic()))
            if ready:
                break
            now = time.monotonic()
            if give_up is not None and now >= give_up:
                return self._nothing()
            if now >= call_deadline:
                self._hung(waiting, limit, "step")
            late = waiting[self._sent_at[waiting] + self.timeout <= now]
            if late.size:
                self._hung(late, self.timeout, "step")
        ids = np.array(sorted(conns[c] for c in ready), dtype=np.int64)
        results = [self._receive(int(i), "step") for i in ids]
        self._in_flight[ids] = False
        return (ids, self._observations(ids), *_stack_results(results))

    @property
    def in_flight(self):
        """Bool array (num_envs,): the envs with a step in flight."""
        return self._in_flight.copy()

    @property
    def pids(self):
        """The worker processes' pids, env ``i``'s at ``i``."""
        return [w.pid for w in self._res.workers]

    def get_attr(self, name):
        """The attribute ``name`` of every worker's env (a list); no step may be in flight."""
        self._check_open()
        if self._in_flight.any():
            raise RuntimeError("get_attr() with steps in flight")
        for i in range(self.num_envs):
            self._send(i, ("get_attr", str(name)))
        return self._gather(range(self.num_envs), f"get_attr({name!r})")

    def close_extras(self, **kwargs):
        """Close the workers (they close their envs; SIGKILL after a grace period of at most
        10 s) and free the shared memory."""
        self._release(grace=min(self.timeout, 10.0))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- internals ------------------------------------------------------------------------
    def _set_spaces(self, spaces):
        first_obs, first_act = spaces[0]
        for i, (obs, act) in enumerate(spaces):
            if obs != first_obs or act != first_act:
                raise ValueError(f"env {i} has spaces {obs}, {act}; env 0 has {first_obs}, "
                                 f"{first_act}: a pool's envs must have the same spaces")
        self.single_observation_space = first_obs
        self.single_action_space = first_act
        self.observation_space = batch_space(first_obs, self.num_envs)
        self.action_space = batch_space(first_act, self.num_envs)

    def _nothing(self):
        """Empty results, shaped as :meth:`step_wait_any`'s (no env finished in time)."""
        ids = np.zeros(0, dtype=np.int64)
        return (ids, self._observations(ids), np.zeros(0, np.float32), np.zeros(0, bool),
                np.zeros(0, bool), {})

    def _observations(self, ids):
        obs = self._res.obs
        return {k: v.copy() for k, v in obs.items()} if ids is None else \
            {k: v[ids] for k, v in obs.items()}

    def _label(self, i):
        name = f" {self._names[i]!r}" if self._names else ""
        return f"env {i}{name} (pid {self._res.workers[i].pid}{self._episode_text(i)})"

    def _episode_text(self, i):
        if self._episodes[i] is None:
            return ""
        episode, ended = self._episodes[i]
        return f", {'after' if ended else 'in'} episode {episode!r}"

    def _note_episode(self, i, info, ended):
        """Keep env ``i``'s episode id from its reset or step ``info`` (when it reports one)."""
        episode = info.get("episode_id") if isinstance(info, dict) else None
        if episode is not None and np.size(episode) == 1:
            self._episodes[i] = (str(np.asarray(episode).reshape(-1)[0]), bool(ended))

    def _check_open(self):
        if self._broken is not None:
            raise RuntimeError(f"the environment pool is closed after an error: {self._broken}")
        if self.closed or self._res.released:
            raise RuntimeError("the environment pool is closed")

    def _release(self, grace):
        self._finalizer.cancel()
        self._res.release(grace)

    def _fail(self, message, ids, worker_traceback=None):
        """Close the pool and raise one EnvWorkerError naming envs ``ids``."""
        ids = [int(i) for i in ids]
        pids = [self._res.workers[i].pid for i in ids]
        episodes = [None if self._episodes[i] is None else self._episodes[i][0] for i in ids]
        self._broken = message
        self._release(grace=0.0)
        self.closed = True
        raise EnvWorkerError(message, env_ids=ids, pids=pids, episodes=episodes,
                             worker_traceback=worker_traceback)

    def _hung(self, ids, seconds, what):
        self._fail(f"{', '.join(self._label(i) for i in ids)} did not finish a {what} within "
                   f"{seconds:g} s (hung or too slow); the environment pool is closed", ids)

    def _dead(self, i, what):
        code = self._res.workers[i].exitcode(1.0)
        if code is None:
            how = "exit status unknown"
        elif code < 0:
            how = f"killed by {signal.Signals(-code).name}"
        else:
            how = f"exit code {code}"
        self._fail(f"{self._label(i)} died during {what} ({how}); the environment pool is "
                   "closed", [i])

    def _send(self, i, message, what=None):
        try:
            self._res.workers[i].conn.send(message)
        except OSError:
            self._dead(i, what or message[0])

    def _receive(self, i, what):
        """Env ``i``'s answer (it is ready); raises EnvWorkerError on an error or EOF."""
        try:
            status, payload, *tb = self._res.workers[i].conn.recv()
        except (EOFError, OSError):
            self._dead(i, what)
        if status == "error":
            first = (str(payload).splitlines() or [""])[0]
            if what == "start" and isinstance(payload, Exception):
                # A construction error (a bad option, a missing file) keeps its type, so the
                # caller reports it as it would for an in-process env.
                if hasattr(payload, "add_note"):
                    payload.add_note(f"(raised building {self._label(i)}; its traceback:\n"
                                     f"{tb[0]})")
                self._broken = f"{type(payload).__name__}: {first}"
                self._release(grace=0.0)
                self.closed = True
                raise payload
            self._fail(f"{self._label(i)} raised {type(payload).__name__} in {what}: {first}; "
                       "the environment pool is closed", [i], tb[0] if tb else None)
        if what == "step":
            self._note_episode(i, payload[3], payload[1] or payload[2])
        return payload

    def _gather(self, ids, what, timeout=None):
        """The answers of envs ``ids`` (in that order), all within ``timeout`` seconds (default
        the pool's)."""
        ids = [int(i) for i in ids]
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        pending = {self._res.workers[i].conn: i for i in ids}
        out = {}
        while pending:
            ready = wait(list(pending), max(0.0, deadline - time.monotonic()))
            if not ready:
                self._hung(sorted(pending.values()), timeout, what)
            for conn in ready:
                i = pending.pop(conn)
                out[i] = self._receive(i, what)
                self._in_flight[i] = False
        return [out[i] for i in ids]


def _check_async(actions, env_ids, in_flight, action_space):
    """``(env_ids, actions)`` as arrays after checking them (ValueError naming the problem)."""
    ids = np.asarray(env_ids).reshape(-1)
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"env_ids must be integers, got {env_ids!r}")
    ids = ids.astype(np.int64)
    actions = np.asarray(actions)
    if actions.ndim == 0 or len(actions) != len(ids):
        raise ValueError(f"step_async needs one action per env id: {len(ids)} env ids, actions "
                         f"of shape {actions.shape}")
    n = len(in_flight)
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        raise ValueError(f"env ids {ids.tolist()} out of range [0, {n})")
    if len(np.unique(ids)) != len(ids):
        raise ValueError(f"env ids {ids.tolist()} repeat an env")
    if in_flight[ids].any():
        raise ValueError(f"envs {ids[in_flight[ids]].tolist()} already have a step in flight: "
                         "collect it with step_wait_any() first")
    if isinstance(action_space, gym.spaces.Discrete):
        a = actions.reshape(-1)
        if not (np.issubdtype(a.dtype, np.integer) or (
                np.issubdtype(a.dtype, np.floating) and np.all(a == np.round(a)))) or (
                a.size and (a.min() < action_space.start
                            or a.max() >= action_space.start + action_space.n)):
            raise ValueError(f"actions must be integers in [{action_space.start}, "
                             f"{action_space.start + action_space.n}), got {a.tolist()}")
        actions = [int(x) for x in a]
    return ids, actions


def _stack_results(results):
    """``(rewards, terminated, truncated, infos)`` from per-env step answers."""
    return (np.array([r[0] for r in results], dtype=np.float32),
            np.array([r[1] for r in results], dtype=bool),
            np.array([r[2] for r in results], dtype=bool),
            _concat_infos([r[3] for r in results]))


def _concat_infos(infos):
    """The keys every env reported, their arrays concatenated in env order."""
    keys = [k for k in infos[0] if all(k in i for i in infos[1:])]
    return {k: np.concatenate([np.asarray(i[k]).reshape(-1, *np.shape(i[k])[1:])
                               for i in infos]) for k in keys}


class InProcessAsync(VectorWrapper):
    """The asynchronous calls of :class:`ProcessVectorEnv` over a batched vector env in this
    process (e.g. ``PointNavVectorEnv``), whose one ``step`` moves every env.

    ``step_async`` records actions; ``step_wait_any`` steps the wrapped env once every env has
    an action pending and returns all envs as finished together. It raises RuntimeError when
    only some envs have one (a batched env cannot step a subset). ``reset``, ``step`` and any
    other attribute pass through to the wrapped env.
    """

    def __init__(self, env):
        super().__init__(env)
        self._in_flight = np.zeros(env.num_envs, dtype=bool)
        self._actions = [None] * env.num_envs

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.env, name)

    def reset(self, *, seed=None, options=None):
        """Reset the wrapped env; no step may be pending."""
        self._check_idle("reset()")
        return self.env.reset(seed=seed, options=options)

    def step(self, actions):
        """Step the wrapped env; no step may be pending."""
        self._check_idle("step()")
        return self.env.step(actions)

    def step_async(self, actions, env_ids):
        """Record ``actions[k]`` for env ``env_ids[k]`` (ValueError when one is pending)."""
        ids, acts = _check_async(actions, env_ids, self._in_flight, self.single_action_space)
        for i, a in zip(ids, acts):
            self._actions[i] = a
        self._in_flight[ids] = True

    def step_wait_any(self, *, timeout=None, within=None):
        """Step every env with its pending action; returns ``(env_ids, obs, rewards,
        terminated, truncated, infos)`` with ``env_ids`` all envs. ``timeout`` and ``within``
        are not used (the step is synchronous)."""
        if not self._in_flight.any():
            raise RuntimeError("step_wait_any() with no step in flight: call step_async() first")
        if not self._in_flight.all():
            raise RuntimeError(f"{type(self.env).__name__} steps all its envs at once: call "
                               f"step_async() for every env before step_wait_any() (envs "
                               f"{np.flatnonzero(~self._in_flight).tolist()} have no action); "
                               "stepping a subset needs ProcessVectorEnv")
        actions = np.asarray(self._actions)
        self._in_flight[:] = False
        self._actions = [None] * self.num_envs
        obs, rewards, terminated, truncated, infos = self.env.step(actions)
        return np.arange(self.num_envs, dtype=np.int64), obs, rewards, terminated, truncated, infos

    @property
    def in_flight(self):
        """Bool array (num_envs,): the envs with an action pending."""
        return self._in_flight.copy()

    @property
    def pids(self):
        """This process's pid for every env."""
        return [os.getpid()] * self.num_envs

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _check_idle(self, what):
        if self._in_flight.any():
            raise RuntimeError(f"{what} with actions pending for envs "
                               f"{np.flatnonzero(self._in_flight).tolist()}: collect them with "
                               "step_wait_any() first")
