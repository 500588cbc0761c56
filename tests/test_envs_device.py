"""The batch simulator on a torch device (envs/pointnav/torch_sim.py) against the numpy reference:
the same episodes and actions give the same positions, collisions, rewards, dones, success and
depth on every scene set; sampled episodes follow the episode rules; bad input is refused."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import envs
from envs.pointnav.episodes import save_episodes
from envs.pointnav.make_episodes import make_episodes
from envs.pointnav.scenes import get_scene_set
from envs.pointnav.sim import PointNavSim
from envs.pointnav.torch_sim import TorchPointNavSim

STEPS = 1000


@pytest.fixture(scope="module", params=["trivial", "default", "large"])
def episode_file(request, tmp_path_factory):
    # Few scenes per set (a large scene takes ~0.4 s to load), episodes dealt round and round.
    path = tmp_path_factory.mktemp("episodes") / f"{request.param}.json.gz"
    save_episodes(path, make_episodes(scenes=request.param, split="train", count=5, seed=3))
    return request.param, str(path)


@pytest.fixture(scope="module")
def trajectories(episode_file):
    """Both simulators run the same episode file with the same actions for 1,000 steps (STOP 1 in
    30, episodes cut at 60 steps: many auto-resets, collisions and slides)."""
    _, path = episode_file
    n = 6
    ref = PointNavSim(n, episodes=path, depth_size=16, max_episode_steps=60)
    dev = TorchPointNavSim(n, episodes=path, depth_size=16, max_episode_steps=60)
    first = (ref.reset()[0], dev.reset()[0])
    actions = np.random.default_rng(0).choice(4, (STEPS, n), p=[0.03, 0.57, 0.2, 0.2])
    out = []
    for a in actions:
        r = ref.step(a)
        d = dev.step(torch.as_tensor(a))
        out.append((r, d, ref.pos.copy(), dev.pos.numpy().copy(), ref.heading.copy(),
                    dev.heading.numpy().copy()))
    return first, out


class TestAgainstTheNumpyReference:
    """The same episodes and actions: the batch simulator's results are the reference's."""

    def test_first_observations_match(self, trajectories):
        (ref, dev), _ = trajectories
        np.testing.assert_allclose(dev["depth"].numpy() * 10.0, ref["depth"] * 10.0, atol=1e-4)
        np.testing.assert_allclose(dev["pointgoal_with_gps_compass"].numpy(),
                                   ref["pointgoal_with_gps_compass"], atol=1e-5)

    def test_positions_and_headings_match(self, trajectories):
        _, steps = trajectories
        worst = max(np.abs(p_ref - p_dev).max() for _, _, p_ref, p_dev, _, _ in steps)
        turn = max(np.abs(np.angle(np.exp(1j * (h_ref - h_dev)))).max()
                   for *_, h_ref, h_dev in steps)
        assert worst < 1e-6 and turn < 1e-9, (worst, turn)

    def test_collisions_dones_and_success_are_equal(self, trajectories):
        _, steps = trajectories
        for k, (r, d, *_) in enumerate(steps):
            assert np.array_equal(r[2], d[2].numpy()), f"terminated differs at step {k}"
            assert np.array_equal(r[3], d[3].numpy()), f"truncated differs at step {k}"
            assert np.array_equal(r[4]["success"], d[4]["success"].numpy()), k
            assert np.array_equal(r[4]["collided"], d[4]["collided"].numpy()), k
            assert np.array_equal(r[4]["elapsed_steps"], d[4]["elapsed_steps"].numpy()), k
        ended = sum(int((r[2] | r[3]).sum()) for r, *_ in steps)
        collided = sum(int(r[4]["collided"].sum()) for r, *_ in steps)
        assert ended > 50 and collided > 50  # the comparison covered resets and wall slides

    def test_rewards_distances_and_spl_match(self, trajectories):
        _, steps = trajectories
        for k, (r, d, *_) in enumerate(steps):
            np.testing.assert_allclose(d[1].numpy(), r[1], atol=1e-5, err_msg=f"step {k}")
            np.testing.assert_allclose(d[4]["distance_to_goal"].numpy(),
                                       r[4]["distance_to_goal"], atol=1e-5, err_msg=f"step {k}")
            np.testing.assert_allclose(d[4]["spl"].numpy(), r[4]["spl"], atol=1e-5)

    def test_depth_within_a_tenth_of_a_millimetre(self, trajectories):
        _, steps = trajectories
        worst = max(np.abs(d[0]["depth"].numpy() - r[0]["depth"]).max() * 10.0
                    for r, d, *_ in steps)
        assert worst < 1e-4, f"depth differs by {worst} m"


@pytest.mark.parametrize("scenes", ["trivial", "default"])
def test_sampled_episodes_follow_the_episode_rules(scenes):
    sset = get_scene_set(scenes)
    sim = TorchPointNavSim(64, scenes=scenes, depth_size=8, seed=5, episodes_per_scene=2)
    sim.reset()
    visited = set()
    rng = np.random.default_rng(1)
    for _ in range(40):
        start = sim.pos.clone()
        fresh = sim.steps == 0
        d, goal = sim.shortest[fresh].numpy(), sim.goal[fresh].numpy()
        lo, hi = sset.geodesic_range
        assert ((d >= lo - 1e-4) & (d <= hi + 1e-4)).all(), d
        euclid = np.linalg.norm(goal - start[fresh].numpy(), axis=1)
        assert (d >= sset.min_ratio * euclid - 1e-3).all()
        visited.update(sim.scene.tolist())
        # STOP often: episodes end and restart, scenes change every 2 episodes
        sim.step(torch.as_tensor(rng.choice(4, 64, p=[0.5, 0.3, 0.1, 0.1])))
    assert (sim.scene_count <= 2).all()
    assert len(visited) == len(sset.scene_ids("train"))


def test_the_same_seed_gives_the_same_stream():
    a = TorchPointNavSim(8, scenes="trivial", depth_size=8, seed=3)
    b = TorchPointNavSim(8, scenes="trivial", depth_size=8, seed=3)
    oa, ob = a.reset()[0], b.reset()[0]
    actions = torch.as_tensor(np.random.default_rng(0).choice(4, (100, 8)))
    for act in actions:
        oa, ra, *_ = a.step(act)
        ob, rb, *_ = b.step(act)
        assert torch.equal(oa["depth"], ob["depth"]) and torch.equal(ra, rb)


def test_an_episode_file_deals_episodes_in_file_order_round_and_round(tmp_path):
    path = tmp_path / "e.json.gz"
    save_episodes(path, make_episodes(scenes="trivial", split="train", count=3, seed=1))
    sim = TorchPointNavSim(2, episodes=str(path), depth_size=8)
    sim.reset()
    seen = [sim.episode_index.tolist()]
    for _ in range(3):
        sim.step(torch.zeros(2, dtype=torch.long))  # STOP: both end, both take the next two
        seen.append(sim.episode_index.tolist())
    assert seen == [[0, 1], [2, 0], [1, 2], [0, 1]]


def test_noise_options_change_observations_within_their_range():
    sim = TorchPointNavSim(4, scenes="trivial", depth_size=8, seed=0, depth_noise_std=0.05,
                           pointgoal_noise_std=0.1)
    obs, _ = sim.reset()
    clean = TorchPointNavSim(4, scenes="trivial", depth_size=8, seed=0).reset()[0]
    assert not torch.equal(obs["depth"], clean["depth"])
    assert obs["depth"].min() >= 0 and obs["depth"].max() <= 1
    assert (obs["pointgoal_with_gps_compass"][:, 0] >= 0).all()


def test_gymnasium_make_vec_still_returns_numpy():
    import gymnasium as gym

    env = gym.make_vec("PointNav-v0", 2, scenes="trivial", depth_size=8)
    obs, _ = env.reset(seed=0)
    assert isinstance(obs["depth"], np.ndarray)
    env.close()


def test_make_vector_env_with_a_device_gives_the_batch_simulator():
    env = envs.make_vector_env("pointnav", 3, device="cpu", scenes="trivial", depth_size=8)
    obs, _ = env.reset()
    assert isinstance(obs["depth"], torch.Tensor) and obs["depth"].shape == (3, 8, 8, 1)
    _, reward, term, trunc, info = env.step(torch.ones(3, dtype=torch.long))
    assert reward.dtype == torch.float32 and term.dtype == torch.bool
    assert set(info) >= {"success", "spl", "distance_to_goal", "collided"}


@pytest.mark.parametrize("bad,match", [
    (dict(workers="process"), "backend='pointnav', workers='inprocess'"),
    (dict(backend="habitat"), "backend='pointnav'"),
])
def test_make_vector_env_refuses_a_device_where_the_batch_simulator_cannot_run(bad, match):
    kwargs = dict(backend="pointnav", num_envs=2, device="cpu", scenes="trivial")
    kwargs.update(bad)
    with pytest.raises(ValueError, match=match):
        envs.make_vector_env(**kwargs)


def test_an_episode_file_played_once_is_refused_with_the_way_out(tmp_path):
    path = tmp_path / "e.json.gz"
    save_episodes(path, make_episodes(scenes="trivial", split="train", count=2, seed=1))
    with pytest.raises(ValueError, match="env.device=numpy"):
        TorchPointNavSim(2, episodes=str(path), repeat_episodes=False)


@pytest.mark.parametrize("actions", [[0, 1], [0, 1, 4], [0.5, 1, 2], [-1, 0, 1]])
def test_bad_host_actions_are_refused_naming_the_actions(actions):
    sim = TorchPointNavSim(3, scenes="trivial", depth_size=8)
    sim.reset()
    with pytest.raises(ValueError, match="STOP"):
        sim.step(actions)


def test_a_float_action_tensor_is_refused():
    sim = TorchPointNavSim(3, scenes="trivial", depth_size=8)
    sim.reset()
    with pytest.raises(ValueError, match="integers"):
        sim.step(torch.zeros(3))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none)")
@pytest.mark.parametrize("compile", [False, True], ids=["eager_cast", "compiled_cast"])
def test_on_cuda_the_graph_replay_matches_eager_steps(compile):
    kwargs = dict(scenes="default", depth_size=32, seed=4, device="cuda")
    graphed = TorchPointNavSim(64, compile=compile, **kwargs)
    eager = TorchPointNavSim(64, graph=False, **kwargs)
    graphed.reset(), eager.reset()
    gen = torch.Generator(device="cuda").manual_seed(0)
    for _ in range(50):
        act = torch.randint(0, 4, (64,), device="cuda", generator=gen)
        og, rg, *_ = graphed.step(act)
        oe, re, *_ = eager.step(act)
        torch.testing.assert_close(og["depth"], oe["depth"])
        torch.testing.assert_close(rg, re)
    assert graphed._graph is not None


@pytest.fixture(scope="module")
def compiled_run(tmp_path_factory):
    """The reference, the eager batch simulator and one with ``compile=True`` (Inductor's C++
    on cpu) run the same 'default' episodes and actions for 300 steps (8 envs, depth 16)."""
    path = tmp_path_factory.mktemp("episodes") / "compiled.json.gz"
    save_episodes(path, make_episodes(scenes="default", split="train", count=5, seed=3))
    n, kwargs = 8, dict(episodes=str(path), depth_size=16, max_episode_steps=60)
    ref, eager = PointNavSim(n, **kwargs), TorchPointNavSim(n, **kwargs)
    compiled = TorchPointNavSim(n, compile=True, **kwargs)
    depths = [(ref.reset()[0]["depth"], eager.reset()[0]["depth"],
               compiled.reset()[0]["depth"])]
    for a in np.random.default_rng(0).choice(4, (300, n), p=[0.03, 0.57, 0.2, 0.2]):
        act = torch.as_tensor(a)
        depths.append((ref.step(a)[0]["depth"], eager.step(act)[0]["depth"],
                       compiled.step(act)[0]["depth"]))
    return eager, compiled, depths


class TestTheCompiledRayCast:
    """``compile=True``: the same depth as the eager cast and the reference, without a flag read
    back (the fixed chunk count)."""

    def test_depth_equals_the_eager_depth_at_every_step(self, compiled_run):
        _, _, depths = compiled_run
        for k, (_, eager, compiled) in enumerate(depths):
            assert torch.equal(compiled, eager), f"step {k}"

    def test_depth_within_a_tenth_of_a_millimetre_of_the_reference(self, compiled_run):
        _, _, depths = compiled_run
        worst = max(np.abs(compiled.numpy() - ref).max() * 10.0 for ref, _, compiled in depths)
        assert worst < 1e-4, f"depth differs by {worst} m"

    def test_distances_equal_the_eager_cast_on_rays_in_every_direction(self, compiled_run):
        eager, compiled, _ = compiled_run
        rays = compiled._ray_env
        gen = torch.Generator().manual_seed(0)
        origin = compiled.pos[rays] / compiled.resolution
        phi = torch.rand(rays.numel(), generator=gen, dtype=torch.float64) * (2 * math.pi)
        direction = torch.stack([torch.sin(phi), -torch.cos(phi)], 1)
        scene = compiled.scene[rays]
        t = compiled._cast(origin, direction, scene)
        assert torch.equal(t, eager._cast(origin, direction, scene))

    def test_early_exit_is_refused_with_the_reason(self):
        with pytest.raises(ValueError, match="early_exit"):
            TorchPointNavSim(2, scenes="trivial", depth_size=8, compile=True, early_exit=True)


@pytest.mark.parametrize("scenes", ["trivial", "default"])  # (loading "large" takes 12 s)
def test_the_eager_chunk_loop_equals_the_fused_formulas_to_the_bit(scenes):
    """The eager loop (int64 indices in place, the first hit by argmax) and the plain formulas
    the compiled cast fuses give the same distances, axis-aligned and near-axis rays included."""
    from envs.pointnav.torch_sim import _cast_rays

    sim = TorchPointNavSim(4, scenes=scenes, depth_size=8, seed=0)
    bank, gen, n = sim.bank, torch.Generator().manual_seed(1), 6000
    scene = torch.randint(len(bank.scenes), (n,), generator=gen)
    rows = torch.as_tensor([sc.rows for sc in bank.scenes])[scene]
    cols = bank.cols[scene]
    origin = torch.stack([torch.rand(n, generator=gen, dtype=torch.float64) * (cols - 2) + 1,
                          torch.rand(n, generator=gen, dtype=torch.float64) * (rows - 2) + 1], 1)
    phi = torch.rand(n, generator=gen, dtype=torch.float64) * (2 * math.pi)
    phi[:400] = torch.arange(400) % 4 * (math.pi / 2)  # exactly along the axes
    phi[400:800] = torch.arange(400) % 4 * (math.pi / 2) + 1e-13  # a hair off them
    direction = torch.stack([torch.sin(phi), -torch.cos(phi)], 1)
    args = (origin, direction, scene, torch.full((n,), 400.0, dtype=torch.float64), bank.table,
            bank.table_off, bank.cells, bank.cols)
    for early_exit in (False, True):
        lean = _cast_rays(*args, chunks=sim._chunks + 4, early_exit=early_exit)
        fused = _cast_rays(*args, chunks=sim._chunks + 4, early_exit=early_exit, fused=True)
        assert torch.equal(lean, fused)


def test_the_ray_chunks_cover_the_longest_ray():
    # Each chunk advances a ray at least _CHUNK - 1 cells; the count covers the farthest depth.
    from envs.pointnav import torch_sim

    sim = TorchPointNavSim(1, scenes="default", split="val", depth_size=8)
    reach = min(float(sim._t_max.max()), sim.bank.max_span_cells)
    assert sim._chunks * (torch_sim._CHUNK - 1) >= reach
    assert math.isfinite(reach)
