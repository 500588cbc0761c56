"""Local SGD: local steps, and a synchronous global model average every ``local_steps`` steps."""
from __future__ import annotations

from typing import Iterable

import torch
from mpi4py import MPI

from wagma_rl.bounded_comm import DEFAULT_TIMEOUT

from .averaging import global_average
from .outer import build_outer, check_outer_options
from .periodic import PeriodicAveraging
from .precision import precision_options

__all__ = ["LocalSGD"]


class LocalSGD(PeriodicAveraging):
    """Model averaging every ``local_steps`` local steps (a blocking allreduce over all ranks).

    Args:
        optimizer: the wrapped ``torch.optim.Optimizer``.
        local_steps: optimizer steps per global average (1 = average after every step; 0 = only
            when :meth:`average` is called, e.g. once per PPO update by the RL trainer).
        comm: communicator (default ``MPI.COMM_WORLD``).
        buffers: module buffers to average with the parameters.
        timeout: seconds an average may wait for the slowest rank (then ``PeerTimeout``).
        nonfinite: ``"raise"`` or ``"drop"`` a rank whose model holds NaN/inf (see
            :class:`~wagma_rl.optim.DistributedOptimizer`).
        outer: ``None`` (default: the average becomes the model) or ``"nesterov"``: an outer
            Nesterov-momentum step on every average, DiLoCo's outer optimizer
            (:mod:`wagma_rl.optim.outer`; keeps two more model-size float32 buffers).
        outer_lr: the outer step's learning rate (> 0; DiLoCo 0.7; 1 with momentum 0 = plain).
        outer_momentum: the outer step's momentum, in [0, 1) (DiLoCo 0.9).
        global_precision: ``"fp32"`` (default) or ``"bf16"``/``"fp16"``: the averages send 16-bit
            pseudo-gradients (each rank's model minus the last global model B, rounded to
            nearest even), half the bytes; the mean is rounded to 16 bits once and every rank
            takes ``B + mean`` (:mod:`wagma_rl.optim.precision`;
            docs/optimizers.md#low-precision-global-exchange). B is the outer optimizer's
            ``prev`` when there is one, else one more model-size float32 copy. :meth:`synchronize`
            stays float32.
        background: run each average on a thread while the next forward and backward pass
            compute; the next ``step()`` puts it into the parameters before its local step, so
            that step's gradient was computed at the model this rank contributed (one pass
            late). Equal to the blocking schedule where the gradients do not depend on the
            parameters (docs/optimizers.md, "Model averaging in the background").
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, local_steps: int, comm: MPI.Comm | None = None,
                 buffers: Iterable[torch.Tensor] | None = None, timeout: float = DEFAULT_TIMEOUT,
                 nonfinite: str = "raise", outer: str | None = None, outer_lr: float = 0.7,
                 outer_momentum: float = 0.9, global_precision: str = "fp32",
                 background: bool = False):
        outer_options = check_outer_options("LocalSGD", outer, outer_lr, outer_momentum)
        precision_option = precision_options("LocalSGD", global_precision)
        self.global_precision = global_precision
        super().__init__(optimizer, local_steps=local_steps, comm=comm, buffers=buffers, timeout=timeout,
                         nonfinite=nonfinite, background=background,
                         options={**outer_options, **precision_option})
        self._outer = build_outer(outer_options, self._flat.body)
        # B, the last global model (identical on every rank; at first the broadcast model): the
        # outer optimizer's prev when there is one, else a copy of our own.
        self._base = (self._flat.body.clone()
                      if global_precision != "fp32" and self._outer is None else None)

    def _exchange(self) -> tuple[int, ...]:
        # The mean over all ranks (every average is global), then the outer step if any (the
        # same mean as without one, so outer_lr=1, outer_momentum=0 gives it bit for bit).
        base = self._outer.prev if self._outer is not None else self._base
        dropped = global_average(self._deadline, self._flat.array, numel=self._flat.numel,
                                 step=self._stats.steps, nonfinite=self.nonfinite,
                                 precision=self.global_precision,
                                 base=None if base is None else base.numpy())
        if self._outer is not None:
            self._outer.step(self._flat.body)  # prev becomes the new model: the next B
        elif self._base is not None:
            self._base.copy_(self._flat.body)
        return dropped

    def _after_synchronize(self) -> None:
        # The synchronised model is identical everywhere and closer to every replica than the
        # last global one: it is the next B (an outer optimizer's prev stays its own).
        if self._base is not None:
            self._base.copy_(self._flat.body)

    def _load_wrapper_state(self, wrapper) -> None:
        super()._load_wrapper_state(wrapper)
        if self._base is not None:  # the loaded model, the same file on every rank
            self._flat.gather()
            self._base.copy_(self._flat.body)
