"""Multi-rank specification of the 16-bit global exchange (global_precision="bf16" / "fp16") in
WAGMA (the native collective's 16-bit wire, blocking globals) and LocalSGD (the bounded 16-bit
reduce-scatter + allgather); run on every rank under mpiexec, launched by tests/test_optim_mpi.py
at 2, 3 and 4 ranks.

Every expected value is computed here in numpy by emulating the wire: each rank's delta x_r - B
rounded to 16 bits (bf16: round to nearest even on the float32 bits; fp16: numpy's float16),
decoded, summed in rank order, divided by the number of ranks, rounded once more, added to B, all
in float32; results are compared bit for bit, on every rank.
"""
import os

import numpy as np
import pytest
import torch
from mpi4py import MPI

from native_coll import WaitAvoidingAllreduce
from wagma_rl.optim import WAGMA, LocalSGD
from wagma_rl.optim.finite import NonFiniteError
from wagma_rl.optim.outer import OuterNesterov

torch.set_num_threads(1)
COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
F32 = np.float32
N = 37  # model values: chunks of unequal length at 2, 3 and 4 ranks
PRECISIONS = ["bf16", "fp16"]


# ---- the emulated wire ---------------------------------------------------------------------
def round16(x: np.ndarray, precision: str) -> np.ndarray:
    """float32 -> 16 bits (round to nearest even) -> float32."""
    x = np.asarray(x, F32)
    if precision == "fp16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(F32)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    out = (r & 0xFFFFFFFF).astype(np.uint32).view(F32)
    return np.where(np.isnan(x), x, out)


def expected_global(B: np.ndarray, xs: list, precision: str) -> np.ndarray:
    """B + round16(sum_r round16(x_r - B) / S), rank order, float32."""
    total = None
    for x in xs:
        d = round16((x - B).astype(F32), precision)
        total = d if total is None else (total + d).astype(F32)
    return (B + round16((total / F32(len(xs))).astype(F32), precision)).astype(F32)


def same_bits(a, b) -> bool:
    return np.array_equal(np.asarray(a, F32).view(np.uint32), np.asarray(b, F32).view(np.uint32))


def identical_everywhere(w: np.ndarray) -> bool:
    return all(same_bits(w, o) for o in COMM.allgather(w))


# ---- the models ----------------------------------------------------------------------------
def start_model() -> np.ndarray:
    """Rank 0's start model (every optimizer broadcasts it): values of very different sizes."""
    gen = np.random.default_rng(1)
    return (gen.standard_normal(N) * 10.0 ** gen.uniform(-3, 3, N)).astype(F32)


def progress(round_: int, rank: int = RANK) -> np.ndarray:
    """Rank ``rank``'s local progress in a round: small and large steps, never beyond fp16's range."""
    gen = np.random.default_rng(100 * round_ + rank)
    return (gen.standard_normal(N) * 10.0 ** gen.uniform(-5, 1, N)).astype(F32)


def build(kind: str, precision: str, *, group_size: int = 1, sync_period: int = 2, **kw):
    model = torch.nn.Linear(N, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.from_numpy(start_model()).view(1, N))
    inner = torch.optim.SGD(model.parameters(), lr=1.0)
    if kind == "local_sgd":
        return model, LocalSGD(inner, local_steps=0, comm=COMM, global_precision=precision, **kw)
    return model, WAGMA(inner, group_size=group_size, sync_period=sync_period, local_steps=0,
                        comm=COMM, global_precision=precision, **kw)


def grow(model, opt, by: np.ndarray) -> None:
    """One SGD step (lr 1) that adds ``by`` to the weights."""
    model.weight.grad = -torch.from_numpy(np.asarray(by, F32).copy()).view(1, N)
    opt.step()


def weights(model) -> np.ndarray:
    return model.weight.detach().reshape(-1).numpy().copy()


def global_round(model, opt, by: np.ndarray):
    """Local progress, then one global average (WAGMA: a group average of one first). Returns
    the global average's info (WAGMA), else None."""
    if isinstance(opt, WAGMA):
        assert opt.average().kind == "group"  # a group of one: the model stays as it is
    grow(model, opt, by)
    if isinstance(opt, WAGMA):
        assert opt.is_global()
        return opt.average()
    opt.average()
    return None


# ---- WAGMA and LocalSGD: the arithmetic -------------------------------------------------------
class TestExactValues:
    @pytest.mark.parametrize("precision", PRECISIONS)
    @pytest.mark.parametrize("kind", ["wagma", "local_sgd"])
    def test_two_global_averages_are_B_plus_the_once_rounded_mean_on_every_rank(self, kind, precision):
        model, opt = build(kind, precision)
        with opt:
            B = start_model()
            for round_ in (1, 2):
                xs = [(B + progress(round_, r)).astype(F32) for r in range(SIZE)]
                global_round(model, opt, progress(round_))
                want = expected_global(B, xs, precision)
                assert same_bits(weights(model), want) and identical_everywhere(weights(model))
                B = want  # the next round's deltas are taken against this global model

    @pytest.mark.parametrize("precision", PRECISIONS)
    @pytest.mark.parametrize("kind", ["wagma", "local_sgd"])
    def test_with_an_outer_optimizer_B_is_its_prev(self, kind, precision):
        model, opt = build(kind, precision, outer="nesterov", outer_lr=0.7, outer_momentum=0.9)
        ref = OuterNesterov(torch.from_numpy(start_model()), lr=0.7, momentum=0.9)
        with opt:
            for round_ in (1, 2):
                B = ref.prev.numpy().copy()
                xs = [(B + progress(round_, r)).astype(F32) for r in range(SIZE)]
                global_round(model, opt, progress(round_))
                T = torch.from_numpy(expected_global(B, xs, precision))
                ref.step(T)  # the outer rule on the emulated average
                assert same_bits(weights(model), T.numpy()) and identical_everywhere(weights(model))

    @pytest.mark.parametrize("outer", [False, True])
    def test_overlapped_globals_apply_B_plus_the_mean_and_the_engine_moves_B(self, outer):
        kw = dict(outer="nesterov", outer_lr=0.7, outer_momentum=0.9) if outer else {}
        model, opt = build("wagma", "bf16", global_mode="overlap", **kw)
        ref = OuterNesterov(torch.from_numpy(start_model()), lr=0.7, momentum=0.9) if outer else None
        B = start_model()
        with opt:
            for round_ in (1, 2):
                assert opt.average().kind == "group"  # a group of one: nothing changes
                grow(model, opt, progress(round_))
                Us = COMM.allgather(weights(model))  # the snapshots the global takes
                assert opt.average().kind == "global"
                grow(model, opt, progress(10 + round_))  # progress after the snapshot
                W = weights(model)
                opt._wa.settle()  # wait for the average and apply it, deterministically
                A = expected_global(B, Us, "bf16")
                if outer:
                    G = torch.from_numpy(A.copy())
                    ref.step(G)
                    G = G.numpy()
                    held = opt._outer.prev.numpy()[:N]
                else:
                    G, held = A, opt._base.numpy()[:N]
                assert same_bits(weights(model), (G + (W - Us[RANK])).astype(F32))
                assert same_bits(held, G) and identical_everywhere(held)  # the next B
                B = G

    @pytest.mark.parametrize("late", ["apply", "merge"])
    def test_a_late_member_of_the_group_average_before_the_global(self, late):
        if SIZE == 1:
            pytest.skip("needs two ranks")
        precision, last = "bf16", SIZE - 1
        model, opt = build("wagma", precision, group_size=SIZE, late=late)
        on_time = COMM.Split(0 if RANK != last else 1, RANK)
        B = start_model()
        W = (B + progress(1, last)).astype(F32)  # the late rank's model when it arrives
        grow(model, opt, progress(1))
        if RANK == last:  # averages only once the others have: its stand-in (B) is used
            for src in range(SIZE - 1):
                COMM.recv(source=src, tag=41)
            info = opt.average()
            assert info.kind == "group" and last in info.stale
        else:
            opt.publish()  # fresh whoever starts the group average
            on_time.Barrier()
            assert opt.average().kind == "group"
            COMM.send("done", dest=last, tag=41)
        # The group average in float32, member order, the late rank's stand-in being B.
        contrib = [(B + progress(1, r)).astype(F32) for r in range(SIZE - 1)] + [B]
        R = contrib[0]
        for c in contrib[1:]:
            R = (R + c).astype(F32)
        R = (R / F32(SIZE)).astype(F32)
        own = (W - B).astype(F32) if late == "apply" else ((W - B) / F32(SIZE)).astype(F32)
        after_group = [R] * (SIZE - 1) + [(R + own).astype(F32)]
        assert same_bits(weights(model), after_group[RANK])
        # The global, 16 bits: the late rank's progress travels as its delta like everyone's.
        assert opt.average().kind == "global"
        want = expected_global(B, after_group, precision)
        assert same_bits(weights(model), want) and identical_everywhere(weights(model))
        on_time.Free()
        opt.close()


# ---- non-finite contributions -----------------------------------------------------------------
def poison(precision: str, how: str) -> np.ndarray:
    """Rank 1's progress: a NaN, or a delta beyond fp16's range (finite in float32)."""
    by = progress(1)
    by[3] = np.nan if how == "nan" else 1e5
    return by


class TestNonFinite:
    @pytest.mark.parametrize("how", ["nan", "fp16 overflow"])
    def test_local_sgd_refuses_a_bad_contribution_and_names_it_on_every_rank(self, how):
        if SIZE == 1:
            pytest.skip("needs two ranks")
        model, opt = build("local_sgd", "fp16")
        with opt:
            grow(model, opt, poison("fp16", how) if RANK == 1 else progress(1))
            with pytest.raises(NonFiniteError) as info:
                opt.average()
            assert info.value.ranks == (1,)

    @pytest.mark.parametrize("how", ["nan", "fp16 overflow"])
    def test_wagma_drop_skips_the_global_and_keeps_B(self, how):
        if SIZE == 1:
            pytest.skip("needs two ranks")
        model, opt = build("wagma", "fp16", nonfinite="drop")
        with opt:
            B = start_model()
            assert opt.average().kind == "group"
            bad = poison("fp16", how)
            grow(model, opt, bad if RANK == 1 else progress(1))
            before = weights(model)
            assert opt.average() is None  # refused on every rank: nothing applied
            if how == "nan" and RANK == 1:
                assert same_bits(weights(model), B)  # its last averaged model, taken back
            else:
                assert same_bits(weights(model), before)  # a finite model is kept as it was
            if how != "nan" and RANK == 1:  # take the huge step back: the next global is healthy
                grow(model, opt, -bad)
            xs = COMM.allgather(weights(model))
            assert opt.average().kind == "group"
            assert opt.average().kind == "global"
            assert same_bits(weights(model), expected_global(B, xs, "fp16"))  # B was kept

    def test_local_sgd_drop_averages_the_others(self):
        if SIZE == 1:
            pytest.skip("needs two ranks")
        model, opt = build("local_sgd", "fp16", nonfinite="drop")
        with opt:
            B = start_model()
            grow(model, opt, poison("fp16", "fp16 overflow") if RANK == 1 else progress(1))
            opt.average()
            healthy = [(B + progress(1, r)).astype(F32) for r in range(SIZE) if r != 1]
            assert same_bits(weights(model), expected_global(B, healthy, "fp16"))
            assert opt.stats.extra["nonfinite_ranks"] == (1,)


# ---- the wire -----------------------------------------------------------------------------------
def chunk(n: int, k: int) -> tuple[int, int]:
    base, rem = divmod(n, SIZE)
    return k * base + min(k, rem), base + (1 if k < rem else 0)


def direct_bytes(n: int, unit: int) -> int:
    """What one member of an all-rank direct schedule sends: every other owner's chunk of its
    contribution, then its own averaged chunk to every other member."""
    _, mine = chunk(n, RANK)
    return unit * ((n - mine) + (SIZE - 1) * mine)


class TestWire:
    @pytest.mark.parametrize("precision", PRECISIONS)
    def test_a_global_sends_half_the_bytes_of_a_group_average_of_all_ranks(self, precision):
        n = 1001
        buf = (np.arange(n, dtype=F32) * F32(0.001) + F32(RANK)).astype(F32)
        base = np.full(n, 0.5, F32)
        with WaitAvoidingAllreduce(COMM, buf, group_size=SIZE, sync_period=2,
                                   global_precision=precision, global_base=base) as wa:
            group = wa.allreduce(late="merge")
            xs = COMM.allgather(buf.copy())
            glob = wa.allreduce(late="merge")
        assert (group.kind, glob.kind) == ("group", "global")
        assert group.bytes_sent == direct_bytes(n, 4)
        assert glob.bytes_sent == direct_bytes(n, 2) == group.bytes_sent // 2
        assert same_bits(buf, expected_global(base, xs, precision))

    def test_the_optimizer_reports_half_the_bytes_at_its_globals(self):
        sent = {}
        for precision in ("fp32", "bf16"):
            model, opt = build("wagma", precision)
            with opt:
                sent[precision] = global_round(model, opt, progress(1)).bytes_sent
        assert sent["bf16"] * 2 == sent["fp32"] == direct_bytes(N + SIZE, 4)

    def test_synchronize_stays_float32(self):
        n = 64
        buf = (np.arange(n, dtype=F32) * F32(0.1) + F32(RANK) / F32(3)).astype(F32)
        xs = COMM.allgather(buf.copy())
        with WaitAvoidingAllreduce(COMM, buf, group_size=1, sync_period=2, global_precision="bf16",
                                   global_base=np.zeros(n, F32)) as wa:
            wa.synchronize()
        total = xs[0]
        for x in xs[1:]:
            total = (total + x).astype(F32)
        assert same_bits(buf, (total / F32(SIZE)).astype(F32))

    def test_the_wire_cannot_change_under_a_global_that_exists_on_this_rank(self):
        """The engine refuses a new wire while a global iteration made on another one exists on
        this rank (wa.h): here its own outstanding overlapped global, the deterministic case of
        the global a peer's activation creates before a slow rank set its wire. The engine goes
        on with the wire it had: the global applies the exact float32 mean."""
        from native_coll.collective import GLOBAL_PRECISIONS
        n = 33
        buf = (np.arange(n, dtype=F32) * F32(0.25) + F32(RANK)).astype(F32)
        base = np.zeros(n, F32)
        with WaitAvoidingAllreduce(COMM, buf, group_size=1, sync_period=2,
                                   global_mode="overlap") as wa:
            wa.allreduce()  # iteration 0: this rank alone
            xs = COMM.allgather(buf.copy())
            assert wa.allreduce().kind == "global"  # iteration 1: outstanding from here
            with pytest.raises(ValueError, match=r"global iteration 1 already exists on this rank "
                                                 r"on the float32 wire .* all agree"):
                wa._engine.set_global_precision(GLOBAL_PRECISIONS["fp16"], base.ctypes.data)
            assert wa.settle().applied_global == 1
        total = xs[0]
        for x in xs[1:]:
            total = (total + x).astype(F32)
        assert same_bits(buf, (total / F32(SIZE)).astype(F32))  # U = buf: A + (buf - U) = A

    def test_a_16_bit_global_runs_the_direct_schedule_where_the_node_aware_one_would(self):
        if SIZE != 4:
            pytest.skip("needs two pretend nodes of two ranks")
        os.environ.update(WA_NODE_SIZE="2", WA_HIER_MIN_BYTES="0")
        try:
            buf = np.full(40, float(RANK), F32)
            with WaitAvoidingAllreduce(COMM, buf, group_size=4, sync_period=2,
                                       global_precision="bf16",
                                       global_base=np.zeros(40, F32)) as wa:
                assert wa.allreduce(late="merge").nodes == 2  # the float32 group average: node-aware
                assert wa.allreduce(late="merge").nodes == 0  # the 16-bit global: direct
        finally:
            del os.environ["WA_NODE_SIZE"], os.environ["WA_HIER_MIN_BYTES"]


# After WAGMA raises NonFiniteError, the offending rank's notice to its peers stays unreceived in
# the closed optimizer's BoundedComm, and MPICH gives the freed communicator's context to the next
# duplicate: the WAGMA built next in the same processes receives that notice. It must drop it
# (the BoundedComm's token) and not wait in an agreement its peers never join (the second test).
class TestAfterARaise:
    def test_wagma_raise_names_the_rank_whose_fp16_delta_overflowed_on_every_rank(self):
        if SIZE == 1:
            pytest.skip("needs two ranks")
        model, opt = build("wagma", "fp16")
        with opt:
            assert opt.average().kind == "group"
            grow(model, opt, poison("fp16", "fp16 overflow") if RANK == 1 else progress(1))
            with pytest.raises(NonFiniteError) as info:
                opt.average()
            assert info.value.ranks == (1,)

    def test_a_wagma_built_after_the_raise_drops_the_stale_notice_and_averages(self):
        model, opt = build("wagma", "fp32", timeout=20.0)
        with opt:
            B = start_model()
            for round_ in (3, 4):
                xs = [(B + progress(round_, r)).astype(F32) for r in range(SIZE)]
                global_round(model, opt, progress(round_))
                w = weights(model)
                assert identical_everywhere(w)
                np.testing.assert_allclose(w, np.mean(xs, axis=0, dtype=np.float64), rtol=1e-6,
                                           atol=1e-6)
                B = w
            assert opt.stats.extra.get("nonfinite_skipped", 0) == 0
