"""``rollout.cuda_graph``: the policy's step of a GPU rollout replayed from a CUDA graph
(wagma_rl/rl/graphed.py) computes what the eager step computes, samples the same actions, follows
the weights' in-place changes and is captured again when they move. The graph itself needs a GPU
(those tests skip without one); on cpu the sampling's caller-drawn noise and the collector's
choice are checked."""
from __future__ import annotations

import pytest
import torch

from wagma_rl.distrib.base import Strategy
from wagma_rl.rl.collect import DeviceCollector
from wagma_rl.rl.graphed import GraphedAct
from wagma_rl.rl.metrics import EpisodeWindow
from wagma_rl.rl.policy import PointNavPolicy
from wagma_rl.rl.storage import RolloutStorage

cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                          reason="needs a CUDA GPU (CI has none): CUDA graphs replay on a GPU")

#: A small DD-PPO-shaped policy (ResNet encoder, 2-layer LSTM) and the default one (GRU).
POLICIES = {"lstm": dict(depth_size=32, hidden_size=64, base_planes=8, resnet_layers=(1, 1),
                         rnn_type="lstm", rnn_layers=2),
            "default": dict(depth_size=32)}


class _AlwaysOn(Strategy):
    def __init__(self):
        pass

    def collect_more(self, step, num_steps):
        return True


def inputs(policy, n, device, step, size=32):
    """One step's inputs for ``n`` envs (``size`` x ``size`` depth), the same for a given step."""
    g = torch.Generator(device="cpu").manual_seed(100 + step)
    depth = torch.rand(n, size, size, 1, generator=g)
    goal = torch.randn(n, 2, generator=g)
    prev = torch.randint(-1, 4, (n,), generator=g)
    masks = (torch.rand(n, generator=g) > 0.2).float()
    h = torch.randn(policy.initial_state(n).shape, generator=g)
    return tuple(t.to(device) for t in (depth, goal, prev, masks, h))


def test_act_with_the_callers_noise_samples_what_its_own_draw_samples():
    torch.manual_seed(3)
    policy = PointNavPolicy(**POLICIES["lstm"]).eval()
    x = inputs(policy, 6, "cpu", 0)
    torch.manual_seed(11)
    own = policy.act(*x)
    torch.manual_seed(11)
    noise = torch.rand(6, policy.num_actions)
    given = policy.act(*x, noise=noise)
    for a, b in zip(own, given):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_on_cpu_the_collector_calls_the_policy_as_it_is():
    collector = DeviceCollector(None, num_steps=4, cuda_graph=True)
    policy = PointNavPolicy(**POLICIES["default"])
    assert collector._act(policy, torch.device("cpu")) == policy.act
    assert collector.graphed is None


@cuda
@pytest.mark.parametrize("kind", sorted(POLICIES))
@pytest.mark.parametrize("precision", [None, torch.bfloat16])
def test_the_replayed_step_is_the_eager_step(kind, precision):
    """Over several steps with new inputs each, an in-place weight change (an optimizer step)
    and a moved parameter (captured again): actions, log-probs, values and state equal eager
    calls' to the bit, drawing the same random numbers."""
    torch.manual_seed(0)
    policy = PointNavPolicy(**POLICIES[kind]).cuda().eval()
    graphed = GraphedAct(policy)
    for step in range(6):
        if step == 3:
            with torch.no_grad():
                for p in policy.parameters():
                    p.add_(0.01 * torch.randn_like(p))
        if step == 4:
            first = next(policy.parameters())
            first.data = first.data.clone()  # moved: the graph must be captured again
        x = inputs(policy, 16, "cuda", step)
        # One autocast region per step, as the trainer opens one per rollout: eager calls reuse
        # autocast's cast weights within a region, which would not see the change at step 3.
        with torch.autocast("cuda", dtype=precision or torch.float32, enabled=precision is not None):
            torch.manual_seed(50 + step)
            torch.cuda.manual_seed(50 + step)
            eager = policy.act(*x)
        with torch.autocast("cuda", dtype=precision or torch.float32, enabled=precision is not None):
            torch.manual_seed(50 + step)
            torch.cuda.manual_seed(50 + step)
            replayed = [t.clone() for t in graphed(*x)]
        for a, b in zip(eager, replayed):
            torch.testing.assert_close(b, a, rtol=0, atol=0)
    assert graphed.failed == "" and graphed.captures == 2


@cuda
def test_a_graphed_rollout_is_the_eager_rollout():
    """Two rollouts of the batch simulator (the weights changed in place between them): the
    storage a graphed collector fills equals an eager collector's, slot by slot."""
    import envs

    filled = {}
    for graph in (False, True):
        torch.manual_seed(1)
        torch.cuda.manual_seed(1)
        env = envs.make_vector_env("pointnav", 16, device="cuda", scenes="default", depth_size=32,
                                   seed=7)
        obs, _ = env.reset()
        policy = PointNavPolicy(**POLICIES["lstm"]).cuda()
        storage = RolloutStorage(num_steps=12, num_envs=16, depth_shape=(32, 32, 1),
                                 num_recurrent_layers=policy.num_recurrent_layers,
                                 hidden_size=64, device="cuda")
        storage.set_first(depth=obs["depth"], goal=obs["pointgoal_with_gps_compass"])
        collector = DeviceCollector(env, num_steps=12, cuda_graph=graph)
        rows = []
        for rollout in range(2):
            collector.collect(policy, storage, _AlwaysOn(), EpisodeWindow(16, 50), torch.device("cuda"))
            rows.append([t.clone() for t in (storage.actions, storage.log_probs, storage.values,
                                              storage.hidden, storage.depth)])
            storage.after_update()
            with torch.no_grad():
                for p in policy.parameters():
                    p.mul_(0.99)
        filled[graph] = rows
        assert (collector.graphed is not None) == graph
    for eager, replayed in zip(filled[False], filled[True]):
        for a, b in zip(eager, replayed):
            torch.testing.assert_close(b, a, rtol=0, atol=0)
