"""Multi-rank specification of NonBlockingSGD's backward-order gradient buckets (every rank, under
mpiexec; launched by tests/test_optim_mpi.py at 2 and 4 ranks).

Each case trains two replicas of the same model, one with small buckets and one without
(``bucket_bytes=0``), in rounds in which nobody fires before every rank has published its whole
batch, so both see the same rounds. The accumulator sums the same gradients in the same order
either way, so the parameters must be equal to the bit.
"""
import numpy as np
import pytest
import torch
from mpi4py import MPI

from wagma_rl.optim import NonBlockingDPSGD, NonBlockingSGD

torch.set_num_threads(1)

SMALL = 64  # bytes: 16 floats, so every layer's weight or bias is a bucket or part of one


def random_mlp() -> torch.nn.Sequential:
    torch.manual_seed(11)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16),
                               torch.nn.Tanh(), torch.nn.Linear(16, 1))


def params_vector(model: torch.nn.Module) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


@pytest.mark.parametrize("cls", [NonBlockingSGD, NonBlockingDPSGD])
class TestNonBlockingBuckets:
    COMM = MPI.COMM_WORLD

    def pair(self, cls, micro_batches=3):
        bucketed, plain = random_mlp(), random_mlp()
        a = cls(torch.optim.SGD(bucketed.parameters(), lr=0.1, momentum=0.9),
                micro_batches=micro_batches, comm=self.COMM, bucket_bytes=SMALL)
        b = cls(torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9),
                micro_batches=micro_batches, comm=self.COMM, bucket_bytes=0)
        return bucketed, a, plain, b

    def on_time_round(self, model, opt, xs, *, backwards=1):
        """One batch: every micro-batch published before anyone fires (the barrier)."""
        for x in xs:
            for _ in range(backwards):  # more than one: gradients accumulate before micro_step
                model(x).pow(2).mean().backward()
            assert opt.micro_step()
        self.COMM.Barrier()
        opt.step()
        opt.zero_grad()

    def batches(self, rounds, micro_batches):
        g = torch.Generator().manual_seed(100 + self.COMM.rank)
        return [[torch.randn(4, 6, generator=g) for _ in range(micro_batches)] for _ in range(rounds)]

    def test_bucketed_rounds_equal_the_unbucketed_ones_to_the_bit(self, cls):
        bucketed, a, plain, b = self.pair(cls)
        for xs in self.batches(3, 3):
            for model, opt in ((bucketed, a), (plain, b)):
                self.on_time_round(model, opt, xs)
        assert np.array_equal(params_vector(bucketed), params_vector(plain))
        assert a.last_round.counts == b.last_round.counts == (3,) * self.COMM.size
        # On cpu a bucket is copied the moment backward completes it: all of them left in backward.
        assert a.stats.extra["buckets"] > 2
        assert a.stats.extra["buckets_in_backward"] == a.stats.extra["buckets"]
        assert "bucket_fallbacks" not in a.stats.extra and "buckets" not in b.stats.extra
        a.close(), b.close()

    def test_accumulated_backwards_repack_and_still_equal_the_unbucketed_rounds(self, cls):
        bucketed, a, plain, b = self.pair(cls, micro_batches=2)
        for xs in self.batches(2, 2):
            for model, opt in ((bucketed, a), (plain, b)):
                self.on_time_round(model, opt, xs, backwards=2)
        assert np.array_equal(params_vector(bucketed), params_vector(plain))
        assert a.stats.extra["bucket_fallbacks"] == 4  # every micro-batch: 2 rounds of 2
        a.close(), b.close()

    def test_bucket_bytes_must_be_a_non_negative_integer(self, cls):
        with pytest.raises(ValueError, match="bucket_bytes must be a non-negative integer"):
            cls(torch.optim.SGD(random_mlp().parameters(), lr=0.1), micro_batches=2,
                comm=self.COMM, bucket_bytes=-1)
