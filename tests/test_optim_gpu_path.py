"""The device path of wagma_rl.optim's flat buffers and AllreduceSGD's buckets, as far as one
process can check it. On cpu the stream and event parts are no-ops and the copies are plain; the
CUDA tests skip there (with the reason) and run on a GPU machine."""
from pathlib import Path

import numpy as np
import pytest
import torch

from wagma_rl.optim import DPSGD, WAGMA, AllreduceSGD, LocalSGD, NonBlockingSGD
from wagma_rl.optim.allreduce_sgd import DEFAULT_BUCKET_BYTES
from wagma_rl.optim.buckets import plan_buckets
from wagma_rl.optim.flat import DeviceCopies, FlatBuffer, copies_for, pack_grads, unpack_grads

OPTIM = Path(__file__).resolve().parents[1] / "wagma_rl" / "optim"
cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                          reason="no CUDA device here: the side-stream copies run on a GPU machine")


def test_no_device_wide_synchronize_anywhere_in_the_optimizers():
    offenders = [f.name for f in OPTIM.glob("*.py") if "cuda.synchronize" in f.read_text()]
    assert offenders == []


class TestCopiesOnCpu:
    def test_copies_to_the_host_are_done_on_return_and_give_no_event(self):
        copies = copies_for("cpu")
        dst, src = torch.zeros(4), torch.arange(4.0)
        assert copies.to_host([(dst, src)]) is None and torch.equal(dst, src)

    def test_copies_to_the_device_and_the_host_guards_are_no_ops(self):
        copies = DeviceCopies(torch.device("cpu"))
        dst = torch.zeros(3)
        copies.to_device([(dst, torch.ones(3))])
        copies.host_writable()
        DeviceCopies.wait(None)
        assert torch.equal(dst, torch.ones(3)) and copies.stream is None and DeviceCopies.ready(None)

    def test_one_copier_per_device(self):
        assert copies_for("cpu") is copies_for(torch.device("cpu"))

    def test_pack_mode_buffer_is_not_pinned_on_cpu(self):
        p = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
        assert not FlatBuffer([p], views=False).flat.is_pinned()


class TestBucketPlan:
    def test_default_is_ddp_25_mib_on_gpus_and_one_allreduce_on_cpu(self):
        assert DEFAULT_BUCKET_BYTES == 25 * 2**20
        opt = AllreduceSGD(torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=1.0))
        assert opt.bucket_bytes == 0
        opt.close()

    def test_nonblocking_sgd_has_no_buckets_on_cpu_by_default(self):
        opt = NonBlockingSGD(torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=1.0),
                             micro_batches=2)
        assert opt.bucket_bytes == 0 and opt._buckets is None
        opt.close()

    def test_buckets_follow_backward_order_and_cover_every_parameter_once(self):
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        opt = AllreduceSGD(torch.optim.SGD(m.parameters(), lr=1.0), bucket_bytes=64)
        plan = plan_buckets(opt._order, 64)
        assert opt._order[0] is m[2].bias and opt._order[-1] is m[0].weight
        # [b2 w2 b1 w1 | b0 w0]: a bucket closes at the parameter that takes it to 64 bytes.
        assert [(first, end, a, z) for first, end, a, z in plan] == [(0, 4, 0, 30), (4, 6, 30, 50)]
        opt.close()

    @pytest.mark.parametrize("bad", [-1, 1.5, True, "25MB"])
    def test_bucket_bytes_must_be_a_non_negative_integer(self, bad):
        m = torch.nn.Linear(2, 2)
        with pytest.raises(ValueError, match="bucket_bytes must be a non-negative integer"):
            AllreduceSGD(torch.optim.SGD(m.parameters(), lr=1.0), bucket_bytes=bad)

    def test_one_rank_has_no_buckets_and_no_hooks(self):
        m = torch.nn.Linear(2, 2)
        opt = AllreduceSGD(torch.optim.SGD(m.parameters(), lr=1.0))
        assert opt._buckets is None
        opt.close()


@cuda
class TestCopiesOnCuda:
    def test_gather_and_scatter_round_trip_through_pinned_memory(self):
        p = torch.nn.Parameter(torch.arange(1000.0, device="cuda"))
        flat = FlatBuffer([p])
        assert flat.mode == "pack" and flat.flat.is_pinned()
        assert np.array_equal(flat.array[:1000], np.arange(1000.0, dtype=np.float32))
        flat.array[:1000] *= 2
        flat.scatter()
        # A kernel queued after the scatter on the compute stream sees the new values.
        assert torch.equal((p.detach() + 0).cpu(), torch.arange(1000.0) * 2)

    def test_gather_sees_the_compute_streams_latest_writes(self):
        p = torch.nn.Parameter(torch.zeros(1 << 20, device="cuda"))
        flat = FlatBuffer([p])
        with torch.no_grad():
            for _ in range(20):  # queue a backlog the side stream must wait for
                p.add_(1.0)
        flat.gather()
        assert float(flat.array[: 1 << 20].min()) == 20.0

    def test_host_write_after_scatter_waits_for_the_copy(self):
        p = torch.nn.Parameter(torch.zeros(1 << 22, device="cuda"))
        flat = FlatBuffer([p])
        flat.array[:] = 3.0
        flat.scatter()
        flat.host_writable()
        flat.array[:] = 5.0
        assert float(p.detach().min()) == 3.0

    def test_gradients_round_trip(self):
        m = torch.nn.Linear(64, 32).cuda()
        m(torch.randn(8, 64, device="cuda")).sum().backward()
        params = list(m.parameters())
        want = [p.grad.clone() for p in params]
        out = torch.zeros(sum(p.numel() for p in params), pin_memory=True)
        assert pack_grads(params, out) == [True, True]
        unpack_grads(out * 2, params)
        assert all(torch.equal(p.grad, w * 2) for p, w in zip(params, want))

    def test_gpu_parameters_get_25_mib_buckets_by_default(self):
        opt = AllreduceSGD(torch.optim.SGD(torch.nn.Linear(2, 2).cuda().parameters(), lr=1.0))
        assert opt.bucket_bytes == DEFAULT_BUCKET_BYTES
        opt.close()

    def test_nonblocking_sgd_gets_25_mib_buckets_on_gpus_by_default(self):
        opt = NonBlockingSGD(torch.optim.SGD(torch.nn.Linear(2, 2).cuda().parameters(), lr=1.0),
                             micro_batches=2)
        assert opt.bucket_bytes == DEFAULT_BUCKET_BYTES and len(opt._buckets) == 1
        opt.close()

    def test_allreduce_sgd_on_one_rank_steps_on_the_device(self):
        m = torch.nn.Linear(8, 4).cuda()
        ref = torch.nn.Linear(8, 4).cuda()
        ref.load_state_dict(m.state_dict())
        opt = AllreduceSGD(torch.optim.SGD(m.parameters(), lr=0.1))
        plain = torch.optim.SGD(ref.parameters(), lr=0.1)
        x = torch.randn(4, 8, device="cuda")
        for model, o in ((m, opt), (ref, plain)):
            model(x).pow(2).sum().backward()
            o.step()
        assert all(torch.equal(a, b) for a, b in zip(m.parameters(), ref.parameters()))
        opt.close()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
@pytest.mark.parametrize("cls,kw", [(LocalSGD, {"local_steps": 1}), (DPSGD, {}),
                                    (WAGMA, {"group_size": 1, "sync_period": 3})])
def test_background_average_on_one_rank_round_trips_the_model_through_the_host(device, cls, kw):
    """One rank's average is its own model: the background copy-out (side stream on cuda, waited
    for on the thread) and the copy back at the next step must leave plain SGD's trajectory."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2)).to(device)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2)).to(device)
    ref.load_state_dict(model.state_dict())
    opt = cls(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), buffers=model.buffers(),
              background=True, **kw)
    plain = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(4, 8, device=device)
    for _ in range(4):
        for m, o in ((model, opt), (ref, plain)):
            m(x).pow(2).sum().backward()
            o.step()
            o.zero_grad()
    opt.wait_average()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), ref.state_dict().values()))
    opt.close()
