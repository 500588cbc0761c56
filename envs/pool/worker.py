"""A worker process's side of the pool: build the env, then answer the pool's ``(command, *args)``
messages over the pipe (``attach`` the observation block, ``step``, ``reset``, ``get_attr``,
``close``), writing observations into its row of the shared block (:mod:`envs.pool.shared_memory`).
How the process is started and protected from the trainer's signals is :mod:`envs.pool.launch`'s."""

from __future__ import annotations

import mmap
import os
import pickle
import traceback
from multiprocessing import reduction

import numpy as np

from .shared_memory import obs_layout, obs_views

__all__ = ["serve", "portable"]


def portable(exc):
    """``exc`` if it survives pickling, else a RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def serve(index, conn, payload):
    """A worker's life: build the env, then answer ``(command, *args)`` messages."""
    env = block = views = None
    try:
        try:
            env = pickle.loads(payload)()
            if getattr(env, "num_envs", None) != 1:
                raise ValueError(f"env_fns[{index}] built {type(env).__name__} with num_envs="
                                 f"{getattr(env, 'num_envs', None)}; a ProcessVectorEnv worker "
                                 "runs one env (num_envs=1)")
            obs_layout(env.single_observation_space)
        except BaseException as exc:
            conn.send(("error", portable(exc), traceback.format_exc()))
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
                    views = {k: v[index] for k, v in obs_views(block, layout, stride,
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
                conn.send(("error", portable(exc), traceback.format_exc()))
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
