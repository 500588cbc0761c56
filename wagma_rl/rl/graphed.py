"""The policy's step of a GPU rollout captured once as a CUDA graph and replayed
(``rollout.cuda_graph``).

Eagerly, each step of a rollout launches the policy's kernels one by one from Python: some 150 for
DD-PPO's encoder alone, each a few microseconds of host time, more than the GPU needs to run them
for a few hundred envs (on an H200, 256 envs of DD-PPO's policy took 6.7-11 ms a step to collect,
docs/results/gpu.md). Captured as a CUDA graph, the step is one launch. What that needs, and how
it stays the same computation:

* **Fixed buffers.** The step's inputs are copied into tensors the graph reads; its outputs are
  tensors the graph writes, overwritten by the next replay (the rollout storage and the simulator
  copy what they are given).
* **The same random numbers.** Gumbel-max sampling's uniform draws are made outside the graph, into
  a buffer it reads, from the default generator and at the point of the step where the eager
  :meth:`~wagma_rl.rl.policy.PointNavPolicy.act` draws them, so a graphed rollout samples what an
  eager one does.
* **The current weights.** The graph reads the parameters where they live, so the optimizers'
  in-place steps and averages reach it. It is captured again when a parameter or buffer moved
  (another policy, a load that replaced tensors), when the batch's shapes, the autocast setting
  or the policy's train/eval mode changed. Autocast's cache of cast weights is off inside the graph, so each replay casts the
  weights of that moment.
* **Failure is not fatal.** A capture that fails (a CUDA runtime or library that cannot be
  captured) warns once, naming the reason, and the rollout runs eagerly.
"""
from __future__ import annotations

import warnings

import torch

__all__ = ["GraphedAct"]


class GraphedAct:
    """``policy.act(depth, goal, prev_actions, masks, h)`` (sampling, not deterministic) replayed
    from a CUDA graph; call it as ``policy.act``. :attr:`failed` holds why it fell back to eager
    calls (empty while graphed); :attr:`captures` counts the captures."""

    def __init__(self, policy):
        self.policy = policy
        self.failed = ""
        self.captures = 0
        self._key = None
        self._graph = None
        self._in: list[torch.Tensor] = []
        self._noise: torch.Tensor | None = None
        self._out = None

    def _signature(self, inputs) -> tuple:
        device = inputs[0].device
        return (tuple((tuple(t.shape), t.dtype, t.device) for t in inputs),
                tuple(t.data_ptr() for t in self.policy.parameters()),
                tuple(t.data_ptr() for t in self.policy.buffers()),
                torch.is_autocast_enabled(device.type), torch.get_autocast_dtype(device.type),
                self.policy.training)

    def __call__(self, depth, goal, prev_actions, masks, h):
        inputs = (depth, goal, prev_actions, masks, h)
        if self.failed:
            return self.policy.act(*inputs)
        key = self._signature(inputs)
        if key != self._key:
            self._capture(inputs, key)
            if self.failed:
                return self.policy.act(*inputs)
        for dst, src in zip(self._in, inputs):
            dst.copy_(src)
        self._noise.uniform_()  # the draw eager act() makes, from the same generator
        self._graph.replay()
        return self._out

    def _capture(self, inputs, key) -> None:
        self._graph = self._out = None  # the previous graph's memory goes first
        self._key = key
        device = inputs[0].device
        self._in = [t.clone() for t in inputs]
        self._noise = torch.empty(inputs[0].shape[0], self.policy.num_actions,
                                  dtype=torch.float32, device=device)
        enabled = torch.is_autocast_enabled(device.type)
        dtype = torch.get_autocast_dtype(device.type)
        # Captured kernels must cast the weights at every replay: no cast cache in the graph.
        fresh_casts = torch.autocast(device.type, dtype=dtype, enabled=enabled, cache_enabled=False)
        graph = torch.cuda.CUDAGraph()
        try:
            # Libraries set up their handles and workspaces on first use: warm up on a side
            # stream (as torch's docs ask) before capturing.
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side), fresh_casts:
                self._noise.fill_(0.5)  # (no draw from the generator: the rollout's stay as eager)
                for _ in range(2):
                    self.policy.act(*self._in, noise=self._noise)
            torch.cuda.current_stream(device).wait_stream(side)
            with torch.cuda.graph(graph), fresh_casts:
                out = self.policy.act(*self._in, noise=self._noise)
        except RuntimeError as exc:  # pragma: no cover - depends on the CUDA runtime
            self.failed = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            warnings.warn(f"rollout.cuda_graph: capturing the policy's step failed ({self.failed}); "
                          "collecting eagerly (slower)", RuntimeWarning, stacklevel=3)
            return
        self._graph, self._out = graph, out
        self.captures += 1
