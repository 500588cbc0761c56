"""PPO's update on rollouts of uneven per-env lengths (VER's) against an even one (lock-step's).

    python benchmarks/ppo_update.py --lengths 64,64,64,64 77,77,77,25 90,90,40,36 --depth 32 64

Every row times ``ppo_update`` (the trainer's defaults for configs/wagma_pointnav.yaml: 2 epochs x
2 mini-batches, a GRU of 128, a ResNet over the depth image) on one rollout of the given env
lengths, one thread, repeats interleaved over the rows so machine load hits them alike. Padding
(the steps a shorter env lacks) is the update's overhead on uneven rollouts: the last column
compares each row with the first (even) row of its depth, measured in the same run. It times the
installed ``wagma_rl``, or with ``--code DIR`` that of a git worktree of an older commit; the raw
file records which.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when imported as benchmarks.ppo_update
import provenance  # noqa: E402

__all__ = ["main"]


def use_checkout(folder: Path) -> None:
    """Import ``wagma_rl`` from ``folder`` (an older commit's worktree) from now on: the editable
    install's import hook, which would answer first, is dropped and the folder put first."""
    sys.meta_path[:] = [f for f in sys.meta_path if "_editable_" not in type(f).__module__]
    sys.path.insert(0, str(Path(folder).resolve()))
    for name in [m for m in sys.modules if m == "wagma_rl" or m.startswith("wagma_rl.")]:
        del sys.modules[name]


def _rollout(lengths: list[int], depth: int, base_planes: int, seed: int):
    from wagma_rl.rl.policy import PointNavPolicy
    from wagma_rl.rl.storage import RolloutStorage

    torch.manual_seed(seed)
    pol = PointNavPolicy(depth_size=depth, hidden_size=128, base_planes=base_planes,
                         resnet_layers=(1, 1, 1))
    st = RolloutStorage(num_steps=2 * max(lengths), num_envs=len(lengths),
                        depth_shape=(depth, depth, 1),
                        num_recurrent_layers=pol.num_recurrent_layers, hidden_size=128)
    st.depth.uniform_()
    st.goal.uniform_()
    st.masks.fill_(1.0)
    st.masks[::20] = 0.0  # an episode start every 20 steps
    st.lengths[:] = torch.tensor(lengths)
    return pol, torch.optim.Adam(pol.parameters(), lr=1e-4), st


def _update(pol, opt, st, seed: int) -> float:
    from wagma_rl.rl.ppo import ppo_update

    t0 = time.perf_counter()
    ppo_update(pol, opt, st, gamma=0.99, lam=0.95, clip=0.2, ppo_epoch=2, num_mini_batch=2,
               value_coef=0.5, entropy_coef=0.01, max_grad_norm=0.2, normalize_advantage=False,
               generator=torch.Generator().manual_seed(seed))
    return time.perf_counter() - t0


def _code() -> dict:
    """Which ``wagma_rl`` was timed: its folder and that checkout's commit (an older worktree's
    when run against one with PYTHONPATH, which the run's own commit does not show)."""
    import wagma_rl

    folder = Path(wagma_rl.__file__).resolve().parents[1]
    return {"path": str(folder), "commit": provenance.checkout(folder)[0] or "?"}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lengths", nargs="+", default=["64,64,64,64", "77,77,77,25", "90,90,40,36"],
                   help="one rollout per value: its envs' lengths, comma-separated")
    p.add_argument("--depth", nargs="+", type=int, default=[32, 64], help="depth image sizes")
    p.add_argument("--base-planes", type=int, default=8)
    p.add_argument("--repeats", type=int, default=12, help="updates timed per row")
    p.add_argument("--out", default=None, help="raw JSON file (the run's facts and every row)")
    p.add_argument("--code", type=Path, default=None,
                   help="time the wagma_rl of this checkout (e.g. `git worktree add DIR <commit>`) "
                        "instead of the installed one")
    args = p.parse_args(argv)
    if args.code:
        use_checkout(args.code)
    facts = provenance.facts(config=vars(args))
    facts["code"] = _code()
    raw = []
    torch.set_num_threads(1)
    rows = [(ls, d) for d in args.depth for ls in args.lengths]
    setups = {row: _rollout([int(x) for x in row[0].split(",")], row[1], args.base_planes, 0)
              for row in rows}
    times: dict = {row: [] for row in rows}
    for rep in range(args.repeats):
        for row in rows:
            times[row].append(_update(*setups[row], seed=rep))
    print(f"{args.repeats} updates a row, 2 epochs x 2 mini-batches, 1 thread, base planes "
          f"{args.base_planes}\n")
    print("| env lengths | frames | depth px | update s (median) | vs the first row of its depth |")
    print("|---|---|---|---|---|")
    for ls, d in rows:
        frames = sum(int(x) for x in ls.split(","))
        med = statistics.median(times[(ls, d)])
        first = statistics.median(times[(args.lengths[0], d)])
        print(f"| {ls} | {frames} | {d} | {med:.3f} | {med / first:.2f}x |")
        raw.append(dict(lengths=ls, frames=frames, depth=d, update_s=times[(ls, d)]))
    if args.out:
        provenance.write_raw(args.out, facts, rows=raw)


if __name__ == "__main__":
    main()
