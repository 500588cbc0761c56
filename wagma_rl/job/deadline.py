"""The bounded communicator the job's modules use: :mod:`wagma_rl.bounded_comm` (it sits below
``job/`` and ``optim/``, which both wait on it); imported here so ``job`` modules keep one name."""
from wagma_rl.bounded_comm import DEFAULT_TIMEOUT, Deadline, Peer, PeerTimeout, describe_ranks

__all__ = ["Deadline", "Peer", "PeerTimeout", "DEFAULT_TIMEOUT", "describe_ranks"]
