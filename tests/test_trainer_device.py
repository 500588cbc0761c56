"""Training on the batch simulator: the rollout stays on the device (nothing is read back per
step), env.device's rule and its refusals, bf16 learning, and the multi-rank modes
(tests/mpi/device_trainer_cases.py at 2 and 3 ranks)."""
from __future__ import annotations

import pytest
import torch

from mpi_launch import REPO, mpi_pytest
from wagma_rl.config import ConfigError, load_config
from wagma_rl.distrib.base import Strategy
from wagma_rl.rl.collect import DeviceCollector, make_collector
from wagma_rl.rl.config import DDPPOConfig
from wagma_rl.rl.metrics import EpisodeWindow
from wagma_rl.rl.policy import PointNavPolicy
from wagma_rl.rl.setup import Collection, check_config, env_device
from wagma_rl.rl.storage import RolloutStorage
from wagma_rl.rl.trainer import train

QUICK = REPO / "configs" / "quick_pointnav.yaml"


class _AlwaysOn(Strategy):
    """A strategy that never ends a rollout (the collector's only call to it here)."""

    def __init__(self):  # no communicator: the collector only calls collect_more
        pass

    def collect_more(self, step, num_steps):
        return True


class _HostReads(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the operations that read tensor data back to the host (item, bool, nonzero, ...),
    except reads of ``allowed`` host-only tensors (the storage's segment lengths)."""

    READS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero", "aten::equal"}

    def __init__(self, allowed):
        super().__init__()
        self.allowed = {t.untyped_storage().data_ptr() for t in allowed}
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name in self.READS and not (
                isinstance(args[0], torch.Tensor)
                and args[0].untyped_storage().data_ptr() in self.allowed):
            self.count += 1
        return func(*args, **(kwargs or {}))


def _collect_reads(num_steps, monkeypatch, *, early_exit=False, count=True):
    import envs

    torch.manual_seed(0)
    # early_exit=False: the step a GPU runs (without the cpu-only end of the ray chunks)
    env = envs.make_vector_env("pointnav", 4, device="cpu", scenes="trivial", depth_size=16,
                               early_exit=early_exit, max_episode_steps=20)
    obs, _ = env.reset()
    policy = PointNavPolicy(depth_size=16, hidden_size=16, base_planes=4, resnet_layers=(1,))
    storage = RolloutStorage(num_steps=num_steps, num_envs=4, depth_shape=(16, 16, 1),
                             num_recurrent_layers=1, hidden_size=16)
    storage.set_first(depth=obs["depth"], goal=obs["pointgoal_with_gps_compass"])
    collector = DeviceCollector(env, num_steps=num_steps)
    episodes = EpisodeWindow(4, 50)
    if not count:
        collector.collect(policy, storage, _AlwaysOn(), episodes, torch.device("cpu"))
        return None, episodes
    copies = []
    for name in ("numpy", "tolist"):  # not dispatched: counted by name
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _original=original, **k):
            if self.untyped_storage().data_ptr() != storage.lengths.untyped_storage().data_ptr():
                copies.append(name)
            return _original(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, name, counted)
    with _HostReads([storage.lengths]) as reads:
        got = collector.collect(policy, storage, _AlwaysOn(), episodes, torch.device("cpu"))
    monkeypatch.undo()
    assert got.frames == 4 * num_steps
    return reads.count + len(copies), episodes


def test_a_device_rollout_reads_back_once_whatever_its_length(monkeypatch):
    short, _ = _collect_reads(8, monkeypatch)
    long, episodes = _collect_reads(40, monkeypatch)
    assert short == long == 1  # the episode records, once, after the rollout


def test_episodes_ended_in_a_device_rollout_reach_the_window(monkeypatch):
    _, episodes = _collect_reads(60, monkeypatch, early_exit=True, count=False)  # episodes end at 20 steps
    assert episodes.finished > 0
    sums = episodes.sums()
    assert sums[0] == min(episodes.finished, 50) and 0 <= sums[2] <= sums[0]


def _cuda_syncs(num_steps, cuda_graph=False):
    """Synchronising calls torch reports while a warmed-up device rollout of ``num_steps``
    steps runs on cuda (sync debug mode ``warn``; ``cuda_graph``: the policy's step replayed)."""
    import warnings

    import envs

    env = envs.make_vector_env("pointnav", 32, device="cuda", scenes="default", depth_size=32)
    obs, _ = env.reset()
    policy = PointNavPolicy(depth_size=32).cuda()
    storage = RolloutStorage(num_steps=num_steps, num_envs=32, depth_shape=(32, 32, 1),
                             num_recurrent_layers=1, hidden_size=128, device="cuda")
    storage.set_first(depth=obs["depth"], goal=obs["pointgoal_with_gps_compass"])
    collector = DeviceCollector(env, num_steps=num_steps, cuda_graph=cuda_graph)
    cuda = torch.device("cuda")
    collector.collect(policy, storage, _AlwaysOn(), EpisodeWindow(32, 50), cuda)  # warm-up
    storage.after_update()
    with warnings.catch_warnings():  # switching the mode on reports a sync of its own (H200)
        warnings.simplefilter("ignore")
        torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            collector.collect(policy, storage, _AlwaysOn(), EpisodeWindow(32, 50), cuda)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return [f"{w.filename}:{w.lineno}" for w in seen if "synchroniz" in str(w.message)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none)")
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_on_cuda_a_device_rollout_synchronises_once_whatever_its_length(cuda_graph):
    short, long = _cuda_syncs(8, cuda_graph), _cuda_syncs(32, cuda_graph)
    assert len(short) == len(long) <= 1, f"synchronised at {short} (8 steps), {long} (32 steps)"


def test_sampled_actions_follow_the_policys_probabilities():
    # act() samples by Gumbel-max (no host read): the frequencies are softmax(logits).
    policy = PointNavPolicy(depth_size=8, use_depth=False, hidden_size=8)
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]]).repeat(20000, 1)
    torch.manual_seed(0)
    policy.forward = lambda *a, **k: (logits, torch.zeros(len(logits)), None)
    actions = policy.act(None, None, None, None, None)[0]
    freq = torch.bincount(actions, minlength=4).double() / len(actions)
    torch.testing.assert_close(freq, torch.softmax(logits[0].double(), 0), atol=0.01, rtol=0)


def _cfg(*over):
    return load_config(DDPPOConfig, QUICK, list(over))


@pytest.mark.parametrize("over,match", [
    (("env.device=cpu", "rollout.mode=ver"), "rollout.mode=lockstep"),
    (("env.device=cpu", "env.backend=habitat"), "env.backend=pointnav"),
    (("env.device=cuda:0", "env.workers=process"), "env.workers=inprocess"),
    (("env.device=tpu",), "use auto, numpy, cpu, cuda or cuda:N"),
    (("run.precision=fp8",), "run.precision"),
])
def test_settings_the_batch_simulator_cannot_run_are_refused_naming_the_key(over, match):
    with pytest.raises(ConfigError, match=match):
        check_config(_cfg(*over), world_size=1)


def test_auto_puts_the_simulator_on_the_runs_gpu_and_keeps_numpy_on_cpu():
    gpu = torch.device("cuda", 1)
    assert env_device(_cfg(), torch.device("cpu")) is None
    assert env_device(_cfg(), gpu) == gpu
    assert env_device(_cfg("rollout.mode=ver"), gpu) is None
    assert env_device(_cfg("env.device=numpy"), gpu) is None
    assert env_device(_cfg("env.device=cpu"), gpu) == torch.device("cpu")
    assert env_device(_cfg("env.device=cuda"), gpu) == gpu


def test_make_collector_picks_the_device_collector_for_a_batch_simulator():
    import envs

    env = envs.make_vector_env("pointnav", 2, device="cpu", scenes="trivial", depth_size=8)
    on_cpu = Collection("lockstep", "inprocess", torch.device("cpu"))
    assert isinstance(make_collector(on_cpu, env, num_steps=4), DeviceCollector)
    with pytest.raises(ValueError, match="rollout.mode=lockstep"):
        Collection("ver", "inprocess", torch.device("cpu"))


@pytest.mark.slow
def test_bf16_on_the_batch_simulator_learns_as_fp32_on_numpy_does(tmp_path):
    # tests/test_trainer_learning.py's budget and bar (random-policy success + 0.15), here with
    # the batch simulator and bf16 autocast: the same learning within its noise.
    from test_trainer_learning import FRAMES, random_policy_success

    common = [f"run.total_frames={FRAMES}", "env.num_envs=4", "ppo.num_steps=64",
              "ppo.ppo_epoch=2", "policy.hidden_size=64", "run.checkpoint_interval=1000",
              "run.stats_window=40"]
    cfg = _cfg(f"run.dir={tmp_path / 'bf16'}", "env.device=cpu", "run.precision=bf16", *common)
    baseline = random_policy_success(_cfg(*common))
    result = train(cfg)
    assert result.frames >= FRAMES
    success = result.last_stats["success"]
    assert success >= baseline + 0.15, f"success {success:.2f} vs random {baseline:.2f}"


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3])
def test_the_modes_train_on_the_batch_simulator(nprocs):
    mpi_pytest(nprocs, "tests/mpi/device_trainer_cases.py", timeout=240)


def test_segment_lengths_set_directly_void_the_lock_step_record():
    # Lock-step storage counts its slots in an int; lengths written from outside (a benchmark's
    # uneven rollout) must win over it.
    st = RolloutStorage(num_steps=8, num_envs=3, depth_shape=(4, 4, 1), num_recurrent_layers=1,
                        hidden_size=4)
    st.lengths[:] = torch.tensor([5, 2, 7])
    assert (st.step, st.frames, st.uniform) == (7, 14, False)


def test_a_channels_last_encoder_computes_what_the_contiguous_one_does():
    torch.manual_seed(0)
    nchw = PointNavPolicy(depth_size=32, hidden_size=16, base_planes=8, resnet_layers=(1, 1))
    nhwc = PointNavPolicy(depth_size=32, hidden_size=16, base_planes=8, resnet_layers=(1, 1),
                          memory_format=torch.channels_last)
    nhwc.load_state_dict(nchw.state_dict())
    convs = [m.weight for m in nhwc.encoder.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs and all(w.is_contiguous(memory_format=torch.channels_last) for w in convs)
    assert nhwc._channels(torch.rand(3, 32, 32, 1)).is_contiguous(memory_format=torch.channels_last)
    inputs = (torch.rand(6, 32, 32, 1), torch.rand(6, 2), torch.tensor([-1, 0, 1, 2, 3, 0]),
              torch.tensor([0.0, 1, 1, 1, 1, 1]), torch.zeros(1, 6, 16))
    for a, b in zip(nchw(*inputs), nhwc(*inputs)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # The averaged and saved parameters keep their values whatever the layout.
    for (name, a), b in zip(nchw.state_dict().items(), nhwc.state_dict().values()):
        assert torch.equal(a, b), name


def test_the_gpu_settings_reach_torch_and_the_policy(tmp_path):
    cfg = _cfg(f"run.dir={tmp_path}", "run.total_frames=64", "env.num_envs=2", "ppo.num_steps=16",
               "ppo.num_mini_batch=1", "policy.memory_format=channels_last",
               "run.cudnn_benchmark=true")
    from wagma_rl.rl.setup import build_policy

    policy = build_policy(cfg)
    assert policy.encoder.stem[0].weight.is_contiguous(memory_format=torch.channels_last)
    before = torch.backends.cudnn.benchmark
    try:
        result = train(cfg)
        assert result.frames >= 64 and torch.backends.cudnn.benchmark
    finally:
        torch.backends.cudnn.benchmark = before
    with pytest.raises(ConfigError, match="policy.memory_format"):
        _cfg("policy.memory_format=nhwc")


def test_group_norms_in_the_autocast_dtype_compute_what_fp32_ones_do():
    torch.manual_seed(0)
    kwargs = dict(depth_size=32, hidden_size=16, base_planes=8, resnet_layers=(1, 1))
    fp32 = PointNavPolicy(**kwargs)
    low = PointNavPolicy(**kwargs, norm_precision="autocast")
    low.load_state_dict(fp32.state_dict())
    depth = torch.rand(6, 32, 32, 1)
    x = fp32._channels(depth)
    # Outside autocast the two are the same module.
    torch.testing.assert_close(fp32.encoder(x), low.encoder(x), rtol=0, atol=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        gn = low.encoder.stem[1]
        # No cast to fp32 and back (CUDA's autocast runs group_norm in fp32; cpu's does not, so
        # here the two differ only in the parameters' rounding to bf16).
        assert gn(low.encoder.stem[0](x)).dtype == torch.bfloat16
        a, b = fp32.encoder(x), low.encoder(x)
    torch.testing.assert_close(a.float(), b.float(), rtol=0.05, atol=0.05)
    b.float().square().mean().backward()
    grads = [p.grad for p in low.encoder.parameters()]
    assert all(g is not None and g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)
    with pytest.raises(ConfigError, match="policy.norm_precision"):
        _cfg("policy.norm_precision=bf16")


def _compiled_pair(backend, device="cpu", **kwargs):
    torch.manual_seed(0)
    kwargs = dict(depth_size=32, hidden_size=16, base_planes=8, resnet_layers=(1, 1), **kwargs)
    plain = PointNavPolicy(**kwargs).to(device)
    compiled = PointNavPolicy(**kwargs, compile_encoder=backend).to(device)
    compiled.load_state_dict(plain.state_dict())
    return plain, compiled


def _assert_same_forward_and_grads(plain, compiled, device, tol):
    inputs = (torch.rand(6, 32, 32, 1), torch.rand(6, 2), torch.tensor([-1, 0, 1, 2, 3, 0]),
              torch.tensor([0.0, 1, 1, 1, 1, 1]), torch.zeros(1, 6, 16))
    inputs = tuple(t.to(device) for t in inputs)
    outs = [policy(*inputs) for policy in (plain, compiled)]
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    for policy, (logits, values, _) in zip((plain, compiled), outs):
        (logits.square().mean() + values.square().mean()).backward()
    for (name, a), b in zip(plain.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=tol, atol=tol, msg=name)


def test_a_compiled_encoder_keeps_the_model_and_its_checkpoints():
    # The cpu check runs torch.compile's own graph capture with the eager backend (TorchInductor's
    # C++ build takes ~30 s of a 2-core machine for the smallest encoder; the cuda test below
    # runs Inductor itself).
    plain, compiled = _compiled_pair("eager")
    assert compiled.encoder._compiled_call_impl is not None
    assert plain.encoder._compiled_call_impl is None
    # The same parameter names: checkpoints, the averaged flat buffers and evaluation see no
    # difference.
    assert list(compiled.state_dict()) == list(plain.state_dict())
    _assert_same_forward_and_grads(plain, compiled, "cpu", 1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU (CI has none): TorchInductor emits Triton kernels there")
def test_an_inductor_compiled_encoder_computes_what_the_eager_one_does_on_cuda():
    plain, compiled = _compiled_pair(True, "cuda")
    _assert_same_forward_and_grads(plain, compiled, "cuda", 1e-4)
