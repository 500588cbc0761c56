"""The simulator's network cost model: alpha-beta-gamma (latency, seconds per byte on the wire,
seconds per byte reduced), with the collective schedules the project's code actually uses, on
nodes of ``ppn`` ranks each (block placement: rank r on node r // ppn).

Parameter sets (:data:`NETWORKS`, chosen with ``--network``; ``--ppn`` and ``--link-gbit`` of
``python -m wagma_rl.scale`` change the ranks per node and cap the link):

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

Within a node messages cost ``local_alpha`` and ``local_beta`` (the ``node`` set's figures unless a
set says otherwise); between nodes ``alpha`` and ``beta``, where ``beta`` is the node's link: the
ranks of a node that send across at once share it, so a step costs the most bytes any one node
puts on its link times beta. With ``ppn = 1`` (the default) every rank is a node of its own and
the formulas below reduce to the single-level ones.

Schedules:

* MPI ``Allreduce`` (gradient averaging, local SGD's and D-PSGD's global average): on one rank
  per node the better of recursive doubling, ``ceil(log2 P) (alpha + n beta + n gamma)``, and
  Rabenseifner's reduce-scatter + allgather, ``2 ceil(log2 P) alpha + 2 (P-1)/P n beta + (P-1)/P n
  gamma`` (MPICH switches between them by message size); with several ranks per node MPICH's
  node-aware algorithm: a binomial reduce to a leader per node, that allreduce among the N
  leaders, a binomial broadcast back, ``2 ceil(log2 ppn) (local_alpha + n local_beta) + ceil(log2
  ppn) n gamma + allreduce(N)``.
* The native wait-avoiding collective over S members (``native_coll/src/schedule.c``):
  direct reduce-scatter + allgather in two rounds, every member posting S - 1 sends per round:
  ``2 (alpha + (S-1) g) + 2 L n beta + (S-1)/S n gamma`` with ``g`` the per-message injection gap
  (LogGP's g), taken as alpha / 4, and ``L`` the largest share of the buffer one node puts on its
  link per round, ``c (S - c) / S`` for a node holding c members (``(S-1)/S`` on one rank per node).
  When the members are on N >= 2 nodes with the same number p >= 2 on each, the node-aware schedule
  (``native_coll/src/schedule_hier.c``) runs instead: a direct exchange within the node, between
  one member per node and slice, and within the node again, ``2 (local_alpha + (p-1) g) + 2 (alpha
  + (N-1) g) + 2 (p-1)/p n local_beta + 2 (N-1)/N n beta + ((p-1)/p + (N-1)/(N p)) n gamma``.
  WAGMA's global iterations use it with all P ranks as members.
* Ring gossip (D-PSGD): a zero-byte handshake with both neighbours, then both models exchanged at
  once: ``alpha + alpha + 2 n beta + 2 n gamma``.
* Barrier (dissemination): ``ceil(log2 P) alpha``.
"""
from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import Sequence

__all__ = ["Network", "NETWORKS", "get_network", "network_of"]


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
    ppn: int = 1
    """Ranks per node (rank r on node r // ppn); 1: every rank a node of its own."""
    local_alpha: float = 28.7e-6
    """Latency of one message within a node (shared memory), seconds."""
    local_beta: float = 0.59e-9
    """Seconds per byte within a node."""
    note_link: str = ""
    """What :func:`network_of` capped the link at ("link 1 Gbit/s"), for the printed header."""

    def describe(self) -> str:
        """The set's name with what was changed: "twonode, 2 ranks per node, link 1 Gbit/s"."""
        parts = [self.name] + ([f"{self.ppn} ranks per node"] if self.ppn > 1 else [])
        return ", ".join(parts + ([self.note_link] if self.note_link else []))

    @property
    def gap(self) -> float:
        """Per-message injection gap when one rank posts many sends at once (LogGP's g)."""
        return self.alpha / 4

    def allreduce(self, p: int, nbytes: float) -> float:
        """MPI Allreduce of ``nbytes`` over ranks 0..p-1."""
        if p <= 1:
            return 0.0
        ppn = min(self.ppn, p)
        if ppn > 1:
            nodes = math.ceil(p / ppn)
            lg = math.ceil(math.log2(ppn))
            local = 2 * lg * (self.local_alpha + nbytes * self.local_beta) + lg * nbytes * self.gamma
            return local + dataclasses.replace(self, ppn=1).allreduce(nodes, nbytes)
        lg = math.ceil(math.log2(p))
        rd = lg * (self.alpha + nbytes * (self.beta + self.gamma))
        rab = 2 * lg * self.alpha + (p - 1) / p * nbytes * (2 * self.beta + self.gamma)
        return min(rd, rab)

    def group(self, s: int, nbytes: float) -> float:
        """The native collective over ``s`` members on nodes of their own (the direct schedule)."""
        if s <= 1:
            return 0.0
        return (2 * (self.alpha + (s - 1) * self.gap)
                + (s - 1) / s * nbytes * (2 * self.beta + self.gamma))

    def members(self, ranks: Sequence[int], nbytes: float, *, node_aware: bool = True) -> float:
        """The native collective over these ranks, on nodes of ``ppn`` ranks: the node-aware
        schedule where it runs (and ``node_aware``), else the direct one with each node's link
        shared by its members."""
        s = len(ranks)
        if s <= 1:
            return 0.0
        if self.ppn == 1:
            return self.group(s, nbytes)
        counts = list(Counter(r // self.ppn for r in ranks).values())
        n_nodes, p = len(counts), counts[0]
        if node_aware and n_nodes >= 2 and p >= 2 and all(c == p for c in counts):
            return (2 * (self.local_alpha + (p - 1) * self.gap) + 2 * (self.alpha + (n_nodes - 1) * self.gap)
                    + 2 * (p - 1) / p * nbytes * self.local_beta
                    + 2 * (n_nodes - 1) / n_nodes * nbytes * self.beta
                    + ((p - 1) / p + (n_nodes - 1) / (n_nodes * p)) * nbytes * self.gamma)
        if n_nodes == 1:  # all within one node
            return (2 * (self.local_alpha + (s - 1) * self.gap)
                    + (s - 1) / s * nbytes * (2 * self.local_beta + self.gamma))
        link = max(c * (s - c) for c in counts) / s  # the busiest node's share per round
        local = max(c - 1 for c in counts) / s
        return (2 * (self.alpha + (s - 1) * self.gap)
                + 2 * nbytes * max(link * self.beta, local * self.local_beta)
                + (s - 1) / s * nbytes * self.gamma)

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


def network_of(name: str, *, ppn: int = 1, link_gbit: float | None = None) -> Network:
    """The set ``name`` on nodes of ``ppn`` ranks, its link capped at ``link_gbit`` Gbit/s (beta
    becomes the larger of the set's and 8 / rate), as ``--ppn`` and ``--link-gbit`` ask."""
    net = dataclasses.replace(get_network(name), ppn=ppn)
    if link_gbit is not None:
        net = dataclasses.replace(net, beta=max(net.beta, 8 / (link_gbit * 1e9)),
                                  note_link=f"link {link_gbit:g} Gbit/s")
    return net
