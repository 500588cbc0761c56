"""Environments in worker processes: :class:`ProcessVectorEnv`, one env per process, stepped in
lock-step or asynchronously, and the :class:`EnvWorkerError` it raises.

Why not gymnasium's ``AsyncVectorEnv``: it steps all envs or none (no subset in flight, which
variable experience rollouts need), names no worker when one dies or hangs, and its workers
die with the trainer's SIGINT/SIGTERM. habitat's ``VectorEnv`` has the right shape (a process
per env, workers that ignore signals) but pickles every frame. This pool keeps gymnasium's
vector API (what the trainer and ``PointNavVectorEnv`` speak) and adds ``step_async(actions,
env_ids)`` / ``step_wait_any()``. How its workers start is :mod:`envs.pool.launch`'s; observations
go through one block of shared memory (:mod:`envs.pool.shared_memory`); only rewards, flags and
the small ``infos`` arrays cross the pipes.
"""

from __future__ import annotations

import mmap
import multiprocessing as mp
import os
import pickle
import signal
import time
from multiprocessing import reduction, util
from multiprocessing.connection import wait

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from .actions import check_async
from .launch import ExecWorker, ProcessWorker, from_main
from .shared_memory import ALIGN, obs_layout, obs_views, shared_file

__all__ = ["ProcessVectorEnv", "EnvWorkerError"]


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
            if context == "exec" and from_main(payloads[-1]):
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
                    self._res.workers.append(ExecWorker(i, payload))
                    self._send(i, self._res.workers[i].first_message, "start")
                else:
                    self._res.workers.append(ProcessWorker(ctx, i, payload))
            spaces = self._gather(range(self.num_envs), "start", float(start_timeout))
            self._set_spaces(spaces)
            layout, stride = obs_layout(self.single_observation_space)
            stride = max(stride, ALIGN)
            fd = shared_file(stride * self.num_envs)
            try:
                self._res.block = mmap.mmap(fd, stride * self.num_envs)
                self._res.obs = obs_views(self._res.block, layout, stride, self.num_envs)
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
        ids, actions = check_async(actions, env_ids, self._in_flight, self.single_action_space)
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
