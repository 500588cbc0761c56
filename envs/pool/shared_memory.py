"""The observation block a pool shares with its workers: one anonymous memory file (a memfd:
nothing in /dev/shm to leak, freed with its last mapping) holding every env's Dict-of-Box
observation, env ``i`` at ``i * stride``, each entry aligned to :data:`ALIGN` bytes. The pool maps
it whole (:class:`~envs.pool.process_env.ProcessVectorEnv`); a worker maps it and writes its own
row (:mod:`envs.pool.worker`)."""

from __future__ import annotations

import os
import tempfile

import gymnasium as gym
import numpy as np

__all__ = ["SHM_NAME", "ALIGN", "obs_layout", "shared_file", "obs_views"]

# The observation block: an anonymous memory file (memfd) with this name in /proc/*/maps.
SHM_NAME = "wagma_envs_obs"
ALIGN = 64


def obs_layout(space):
    """``[(key, shape, dtype, offset)]`` of one env's Dict-of-Box observation and its bytes."""
    if not isinstance(space, gym.spaces.Dict) or not all(
            isinstance(s, gym.spaces.Box) for s in space.spaces.values()):
        raise TypeError(f"ProcessVectorEnv shares Dict observations of Box entries, got {space}")
    out, offset = [], 0
    for key, box in space.spaces.items():
        out.append((key, tuple(box.shape), np.dtype(box.dtype), offset))
        offset += -(-int(np.prod(box.shape, dtype=np.int64)) * np.dtype(box.dtype).itemsize
                    // ALIGN) * ALIGN
    return out, offset


def shared_file(size):
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


def obs_views(buf, layout, stride, num_envs):
    """Arrays ``(num_envs, *shape)`` per key over ``buf`` (env ``i`` at ``i * stride``)."""
    return {key: np.ndarray((num_envs, *shape), dtype=dtype, buffer=buf, offset=offset,
                            strides=(stride, *np.empty(shape, dtype).strides))
            for key, shape, dtype, offset in layout}
