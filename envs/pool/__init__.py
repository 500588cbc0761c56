"""Pools of environments that step asynchronously: :class:`ProcessVectorEnv` (one env per worker
process) and :class:`InProcessAsync` (the same calls over a batched env in this process).

Modules, by concern:
  process_env.py    ProcessVectorEnv, the pool the trainer talks to, and EnvWorkerError;
  in_process.py     InProcessAsync;
  launch.py         starting the worker processes (exec'd interpreters or multiprocessing), the
                    launcher's variables they drop, the signals they ignore, WorkerEnvFn;
  worker.py         a worker's side: build the env, answer the pool's commands;
  shared_memory.py  the observation block the pool and its workers share;
  actions.py        step_async's argument checks, shared by both pools.
"""

from .in_process import InProcessAsync
from .launch import LAUNCHER_PREFIXES, WorkerEnvFn
from .process_env import EnvWorkerError, ProcessVectorEnv

__all__ = ["ProcessVectorEnv", "InProcessAsync", "EnvWorkerError", "LAUNCHER_PREFIXES",
           "WorkerEnvFn"]
