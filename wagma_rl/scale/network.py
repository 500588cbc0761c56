"""The simulator's network cost model: alpha-beta-gamma (latency, seconds per byte on the wire,
seconds per byte reduced), with the collective schedules the project's code actually uses.

Parameter sets (:data:`NETWORKS`, chosen with ``--network``):

* ``ib100``: a 100 Gb/s InfiniBand-class fabric (EDR/HDR100): alpha 1.5 us end to end through one
  switch hop, beta 1 / 12.5 GB/s, gamma 1 / 10 GB/s (one core summing float32 from memory). The
  usual published figures for such fabrics (osu_latency ~1-2 us, osu_bw ~12 GB/s).
* ``twonode``: the namespaced two-node network of this machine (MPI over TCP between two
  cluster/netns.py nodes joined through a veth bridge). Calibrated with ``benchmarks/netcal.py``,
  one rank per node (``python -m cluster.netns run --nodes 2 --ppn 1 -- benchmarks/netcal.py``):
  alpha 24.1 us, beta 0.76 ns/B (1.3 GB/s), measured 2026-11-23 (loopback TCP gave 19.2 us and
  the same beta).
* ``node``: the ranks of one node of this machine over shared memory (4 ranks on 2 cores, as in
  the measured mode comparisons): alpha 28.7 us, beta 0.59 ns/B, from ``mpiexec -n 4
  benchmarks/netcal.py`` (the latency is a scheduling delay: 4 ranks share 2 cores).
* ``ideal``: free communication (the analytic checks).

Schedules:

* MPI ``Allreduce`` (gradient averaging, local SGD's and D-PSGD's global average): the better of
  recursive doubling, ``ceil(log2 P) (alpha + n beta + n gamma)``, and Rabenseifner's
  reduce-scatter + allgather, ``2 ceil(log2 P) alpha + 2 (P-1)/P n beta + (P-1)/P n gamma``
  (MPICH switches between them by message size).
* The native wait-avoiding collective over S members (``native_coll/src/schedule.c``):
  direct reduce-scatter + allgather in two rounds, every member posting S - 1 sends per round:
  ``2 (alpha + (S-1) g) + 2 (S-1)/S n beta + (S-1)/S n gamma`` with ``g`` the per-message
  injection gap (LogGP's g), taken as alpha / 4. WAGMA's global iterations use it with S = P.
* Ring gossip (D-PSGD): a zero-byte handshake with both neighbours, then both models exchanged at
  once: ``alpha + alpha + 2 n beta + 2 n gamma``.
* Barrier (dissemination): ``ceil(log2 P) alpha``.
"""
from __future__ import annotations

import dataclasses
import math

__all__ = ["Network", "NETWORKS", "get_network"]


@dataclasses.dataclass(frozen=True)
class Network:
    """An alpha-beta-gamma network (see the module docstring for the schedules)."""

    name: str
    alpha: float
    """Latency of one message, seconds."""
    beta: float
    """Seconds per byte on the wire."""
    gamma: float
    """Seconds per byte reduced (summing float32)."""
    note: str = ""

    @property
    def gap(self) -> float:
        """Per-message injection gap when one rank posts many sends at once (LogGP's g)."""
        return self.alpha / 4

    def allreduce(self, p: int, nbytes: float) -> float:
        """MPI Allreduce of ``nbytes`` over ``p`` ranks."""
        if p <= 1:
            return 0.0
        lg = math.ceil(math.log2(p))
        rd = lg * (self.alpha + nbytes * (self.beta + self.gamma))
        rab = 2 * lg * self.alpha + (p - 1) / p * nbytes * (2 * self.beta + self.gamma)
        return min(rd, rab)

    def group(self, s: int, nbytes: float) -> float:
        """The native collective (direct reduce-scatter + allgather) over ``s`` members."""
        if s <= 1:
            return 0.0
        return (2 * (self.alpha + (s - 1) * self.gap)
                + (s - 1) / s * nbytes * (2 * self.beta + self.gamma))

    def gossip(self, p: int, nbytes: float) -> float:
        """D-PSGD's exchange with both ring neighbours (handshake included)."""
        if p <= 1:
            return 0.0
        peers = 1 if p == 2 else 2
        return 2 * self.alpha + peers * nbytes * (self.beta + self.gamma)

    def barrier(self, p: int) -> float:
        """A dissemination barrier over ``p`` ranks."""
        return math.ceil(math.log2(p)) * self.alpha if p > 1 else 0.0


NETWORKS = {
    "ib100": Network("ib100", 1.5e-6, 1 / 12.5e9, 1 / 10e9,
                     "100 Gb/s InfiniBand class (published figures)"),
    "twonode": Network("twonode", 24.1e-6, 0.76e-9, 1 / 10e9,
                       "this machine's namespaced two-node TCP network (cluster/netns.py)"),
    "node": Network("node", 28.7e-6, 0.59e-9, 1 / 10e9,
                    "one node of this machine, shared memory, 4 ranks on 2 cores"),
    "ideal": Network("ideal", 0.0, 0.0, 0.0, "free communication"),
}


def get_network(name: str) -> Network:
    """The parameter set called ``name`` (ValueError listing the choices otherwise)."""
    if name not in NETWORKS:
        raise ValueError(f"unknown network {name!r}; choose one of {sorted(NETWORKS)}")
    return NETWORKS[name]
