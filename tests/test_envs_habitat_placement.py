"""Where habitat envs run (envs.habitat.placement): each env's scenes in training (the rank rule
and the global deal) and in evaluation, and each env worker's GPU. Pure functions, no habitat."""

import pytest

from envs.habitat.placement import eval_scene_split, scene_split, worker_gpu
from envs.habitat.vector_env import HabitatVectorEnv, _placement

GIBSON = [f"gibson_{i:02d}" for i in range(72)]  # the size of Gibson's 72-scene train split
THREE = ["a", "b", "c"]
ENVS = 4


def _rank(scenes, rank, world, *, seed=0, rule="rank"):
    return [scene_split(scenes, i, ENVS, rank=rank, world_size=world, seed=seed, rule=rule)
            for i in range(ENVS)]


# ---- training: habitat-baselines' rule, every rank deals the whole split over its own envs ---
@pytest.mark.parametrize("world", [1, 4, 19, 64])
def test_every_env_holds_a_quarter_of_72_scenes_and_every_rank_all_of_them(world):
    for rank in {0, world // 2, world - 1}:
        shares = _rank(GIBSON, rank, world)
        assert [len(s) for s in shares] == [18, 18, 18, 18]
        assert sorted(sum(shares, [])) == GIBSON  # each scene on exactly one env of the rank


@pytest.mark.parametrize("world", [1, 4, 19, 64])
def test_with_3_scenes_and_4_envs_each_env_holds_one_and_every_rank_all_three(world):
    for rank in {0, world // 2, world - 1}:
        shares = _rank(THREE, rank, world)
        assert [len(s) for s in shares] == [1, 1, 1, 1]  # never all scenes in one env
        assert sorted({s[0] for s in shares}) == THREE
        assert shares[3] == shares[0]  # the deal wraps around


def test_the_deal_depends_on_the_seed_and_the_rank_and_repeats_for_both():
    deal = _rank(GIBSON, 5, 19, seed=7)
    assert _rank(list(reversed(GIBSON)), 5, 19, seed=7) == deal  # input order does not matter
    assert _rank(GIBSON, 5, 19, seed=8) != deal
    assert _rank(GIBSON, 6, 19, seed=7) != deal
    assert _rank(GIBSON, 5, 64, seed=7) == deal  # the job's size does not enter the rank rule


def test_ranks_deal_differently_so_a_scene_shares_an_env_with_different_scenes():
    firsts = {tuple(_rank(GIBSON, r, 64)[0]) for r in range(64)}
    assert len(firsts) == 64


# ---- training: the global deal (option), one deal over every env of the job -----------------
@pytest.mark.parametrize("world, sizes", [(1, {18}), (4, {4, 5}), (19, {1}), (64, {1})])
def test_the_global_deal_of_72_scenes_gives_each_env_its_own_and_never_all(world, sizes):
    shares = [s for r in range(world) for s in _rank(GIBSON, r, world, rule="global")]
    assert {len(s) for s in shares} == sizes
    held = sorted(sum(shares, []))
    if world * ENVS <= len(GIBSON):
        assert held == GIBSON  # no scene twice in the job
    else:  # past 72 envs the deal wraps around: every scene held, one per env
        assert set(held) == set(GIBSON) and len(held) == world * ENVS


@pytest.mark.parametrize("world", [1, 4, 19, 64])
def test_the_global_deal_of_3_scenes_gives_each_env_one(world):
    shares = [s for r in range(world) for s in _rank(THREE, r, world, rule="global")]
    assert [len(s) for s in shares] == [1] * (world * ENVS)
    assert [s[0] for s in shares[:4]] == ["a", "b", "c", "a"]


def test_under_the_global_deal_a_rank_covers_only_its_part_and_the_seed_is_unused():
    rank3 = sum(_rank(GIBSON, 3, 4, rule="global"), [])
    assert sorted(rank3) == [g for k, g in enumerate(GIBSON) if k % 16 >= 12]  # 18 of 72
    assert rank3 == sum(_rank(GIBSON, 3, 4, seed=99, rule="global"), [])
    assert scene_split(GIBSON, 1, 4, rank=3, world_size=4, rule="global") == GIBSON[13::16]


def test_bad_placements_are_refused_in_one_line():
    with pytest.raises(ValueError, match="names no scenes"):
        scene_split([], 0, 2)
    with pytest.raises(ValueError, match=r"env must be in \[0, num_envs\)"):
        scene_split(THREE, 2, 2)
    with pytest.raises(ValueError, match=r"shard_index \(the rank\) must be in"):
        scene_split(THREE, 0, 2, rank=2, world_size=2)
    with pytest.raises(ValueError, match=r"scene_split must be one of \['rank', 'global'\]"):
        scene_split(THREE, 0, 2, rule="sorted")
    with pytest.raises(ValueError, match=r"scene_split must be one of"):
        HabitatVectorEnv(1, env_fn=lambda i: pytest.fail("no env"), scene_split="sorted")
    with pytest.raises(ValueError, match=r"shard_index must be in \[0, num_shards\)"):
        HabitatVectorEnv(1, env_fn=lambda i: pytest.fail("no env"), shard_index=2, num_shards=2)


def test_a_worker_process_and_an_in_process_env_find_the_same_rank_and_env():
    # rank 2 of 3 with 4 envs: in process (shard 2 of 3) and as worker 1 (shard 2 * 4 + 1 of 12)
    inproc = _placement(4, 2, 3, None)
    worker = _placement(1, 2 * 4 + 1, 3 * 4, 4)
    assert inproc(1) == worker(0) == (1, 4, 2, 3)
    with pytest.raises(ValueError, match="must divide"):
        _placement(1, 0, 10, 4)


# ---- evaluation: by scene over its workers --------------------------------------------------
def test_evaluation_puts_each_scene_on_one_worker_balancing_episodes():
    scenes = ["x"] * 5 + ["y"] * 3 + ["z"] * 2 + ["w"] * 2
    # x (5) and y (3) first; then w and z (2 each, by name) to the worker with fewer
    assert eval_scene_split(scenes, 2) == [[0, 1, 2, 3, 4, 8, 9], [5, 6, 7, 10, 11]]
    assert eval_scene_split(scenes, 3) == [[0, 1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11]]


def test_evaluation_with_fewer_scenes_than_workers_uses_one_worker_per_scene():
    assert eval_scene_split(["b", "a", "b"], 8) == [[0, 2], [1]]
    assert eval_scene_split(["a", "b"], 1) == [[0, 1]]
    with pytest.raises(ValueError, match="no episodes"):
        eval_scene_split([], 2)


def test_evaluation_of_72_scenes_over_4_workers_loads_18_each():
    scenes = [s for s in GIBSON for _ in range(3)]
    shares = eval_scene_split(scenes, 4)
    assert [len({scenes[k] for k in s}) for s in shares] == [18, 18, 18, 18]
    assert sorted(sum(shares, [])) == list(range(len(scenes)))


# ---- GPUs -------------------------------------------------------------------------------------
def test_a_ranks_env_workers_render_on_its_node_local_gpu():
    assert worker_gpu(3, 1, 0) is None  # no GPU: habitat's config default
    assert [worker_gpu(r, 0, 4) for r in range(6)] == [0, 1, 2, 3, 0, 1]
    # 2 ranks on a node of 4 GPUs: rank 1 owns GPUs 1 and 3, its workers take them in turn
    assert [worker_gpu(1, w, 4, local_size=2) for w in range(4)] == [1, 3, 1, 3]


def test_the_renderer_goes_on_the_ranks_gpu_unless_the_options_choose_one():
    from envs.habitat.placement import GPU_KEY, renderer_gpu

    opts = {"episodes": "e.json.gz"}
    assert renderer_gpu(2, opts) == ({"episodes": "e.json.gz", "gpu_device_id": 2}, None)
    assert renderer_gpu(None, opts) == (opts, None)  # a CPU rank: habitat's default stays
    kept, note = renderer_gpu(2, {"overrides": [f"{GPU_KEY}=-1"]})
    assert "gpu_device_id" not in kept
    assert note == (f"env.options sets the habitat renderer's GPU ({GPU_KEY}=-1); it wins over "
                    "the rank's GPU 2, so observations are rendered on -1 and copied to the "
                    "policy's device each step")
    kept, note = renderer_gpu(0, {"gpu_device_id": 3, "overrides": ["habitat.seed=1"]})
    assert kept["gpu_device_id"] == 3 and "(gpu_device_id=3)" in note


def test_evaluation_puts_a_habitat_renderer_on_the_ranks_gpu_and_logs_an_override():
    import torch

    from wagma_rl.config import load_config
    from wagma_rl.rl.config import DDPPOConfig
    from wagma_rl.rl.evaluate import eval_env_options

    def options(*overrides):
        cfg = load_config(DDPPOConfig, "configs/quick_pointnav.yaml",
                          ["env.backend=habitat", "env.scenes=default", *overrides])
        return eval_env_options(cfg, torch.device("cuda", 1))

    got, note = options()
    assert got["gpu_device_id"] == 1 and got["workers"] == "process" and note is None
    got, note = options("env.options={overrides: ['habitat.simulator.habitat_sim_v0."
                        "gpu_device_id=0']}")
    assert "gpu_device_id" not in got and "wins over the rank's GPU 1" in note
    cfg = load_config(DDPPOConfig, "configs/quick_pointnav.yaml", [])
    assert "gpu_device_id" not in eval_env_options(cfg, torch.device("cuda", 1))[0]  # embedded
