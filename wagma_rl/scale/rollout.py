"""Per-worker, per-update compute times for the simulator: rollout collection and PPO compute.

A :class:`Workload` draws (:meth:`Workload.draw`) two ``[updates, workers]`` arrays: the time a worker needs to collect
its *full* rollout (``num_steps`` steps; DD-PPO's preemption cuts it short inside the simulator)
and its local PPO compute. Rollout specifications (``--rollout SPEC``):

* ``const:SECONDS``: every rollout takes SECONDS.
* ``exp:MEAN``: i.i.d. exponential rollout times.
* ``lognormal:MEAN,CV``: i.i.d. lognormal with that mean and coefficient of variation.
* ``stall:BASE,P,DELAY[,STEPS]``: the trainer's independent stalls (``heterogeneity.stall_prob``,
  ``heterogeneity.stall_s``): BASE seconds plus DELAY for each of the STEPS (default 64) vector steps
  that stalls, each with probability P, i.e. ``BASE + DELAY * Binomial(STEPS, P)``.
* ``trace:PATH``: replay of a trainer trace (``<run>/trace`` or one ``rank_*.csv``, see
  ``wagma_rl.rl.trace``): worker i replays rank ``i mod R``'s collection and PPO times in order,
  cycling, copies of a rank starting at different updates (so copies are not in lockstep). A
  preempted rollout's time is scaled to the full length (``collect_s * num_steps / steps``); the
  PPO time is ``update_s`` plus the loop's other per-update work (``other_s``: statistics,
  logging, checkpoints).
* ``fit:PATH``: a lognormal fitted to a trace (see :func:`fit_trace`): a persistent per-worker
  factor and a transient per-update factor, both lognormal, with the trace's mean PPO time.

Within a rollout, time is spread evenly over the steps unless ``lump_s`` > 0: then the whole
lumps of ``lump_s`` seconds that fit in the part of a rollout above the worker's base time come at
random steps (the rank's stalls; ``stall:`` sets ``lump_s`` to DELAY, ``trace:`` and ``fit:``
take each rank's fastest rollout as its base) and the rest is spread evenly. Only DD-PPO's
preemption and the within-rank layer (:mod:`.collection`) look inside a rollout: a worker stalled
when the counter fills finishes its stalled step first.

Independently of the specification, ``persistent_cv`` multiplies every worker's times by its own
lognormal factor (mean 1, that CV), and ``slow_frac`` / ``slowdown`` make that fraction of the
workers ``slowdown`` times slower (the trainer's ``heterogeneity.slow_ranks`` / ``heterogeneity.slowdown``).

The drawn times are those of a rank whose envs all step at the nominal speed. The env knobs, named
as in the trainer's ``heterogeneity:`` section, make some envs slower inside every rank: env
``i``'s step takes ``even * f_i + stall`` where ``even`` is the rank's per-step time without its
own stalls, ``f_i`` is ``env_slowdown`` for the envs in ``slow_envs`` (1 otherwise) and ``stall`` is
``env_stall_s`` with probability ``env_stall_prob`` per env and step (:meth:`Draw.env_steps`);
:mod:`.collection` turns these into lock-step or VER rollouts.

Frames per update: a trace's ``num_steps`` column and ``env.num_envs`` of the run's
``config.yaml`` (beside its ``trace/`` folder; :func:`trace_shape`) give them for ``trace:`` and
``fit:``; other specifications take them from the simulated job (``Setup``).
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

__all__ = ["Workload", "Draw", "parse_rollout", "fit_trace", "trace_shape", "lognormal_params"]


def lognormal_params(mean: float, cv: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with this mean and coefficient of variation."""
    sigma2 = math.log1p(cv * cv)
    return math.log(mean) - sigma2 / 2, math.sqrt(sigma2)


def fit_trace(trace: dict) -> dict:
    """Fit ``log(collect + ppo)`` (``ppo``: ``update_s`` plus ``other_s``) per worker-update as ``m + p_worker + e_update`` (one-way random
    effects): the persistent variance is the variance of the worker means less the part their
    sampling noise explains (within variance / updates), clipped at 0; the transient variance is
    the within-worker variance. Returns ``{"mean", "transient_cv", "persistent_cv", "ppo_s"}``
    where ``mean`` is the mean full-rollout collection time."""
    collect = _full_collect(trace)
    ppo = trace["update_s"] + trace.get("other_s", 0.0)
    x = np.log(collect + ppo)
    n = x.shape[1]
    within = float(x.var(axis=1, ddof=1).mean()) if n > 1 else 0.0
    between = float(x.mean(axis=1).var(ddof=1)) if x.shape[0] > 1 else 0.0
    persistent = max(0.0, between - within / n)
    return {"mean": float(collect.mean()), "transient_cv": math.sqrt(math.expm1(within)),
            "persistent_cv": math.sqrt(math.expm1(persistent)),
            "ppo_s": float(np.mean(ppo))}


def _full_collect(trace: dict) -> np.ndarray:
    steps = np.maximum(trace["steps"], 1.0)
    return trace["collect_s"] * trace["num_steps"] / steps


@dataclasses.dataclass
class Draw:
    """Drawn compute times: ``collect`` (full rollouts at nominal env speed) and ``ppo``, both
    ``[updates, workers]``; ``base`` (per worker, or per update and worker) and ``lump_s``
    describe the inside of a rollout,
    the ``env_*`` fields and ``slow_envs`` the envs inside every rank (see the module doc);
    ``env_seed`` seeds the env stalls of each update, so every mode and collection mode simulated
    on this draw meets the same ones."""

    collect: np.ndarray
    ppo: np.ndarray
    base: np.ndarray | None = None
    lump_s: float = 0.0
    rng: np.random.Generator | None = None
    slow_envs: tuple[int, ...] = ()
    env_slowdown: float = 1.0
    env_stall_prob: float = 0.0
    env_stall_s: float = 0.0
    env_seed: int = 0

    @property
    def envs_differ(self) -> bool:
        """Whether any env is slower than the rank's nominal step (the env knobs are on)."""
        return bool(self.slow_envs and self.env_slowdown > 1.0) or (
            self.env_stall_prob > 0 and self.env_stall_s > 0)

    def step_parts(self, u: int, num_steps: int) -> tuple[np.ndarray, np.ndarray]:
        """Update ``u``'s full rollouts split into ``even`` (``[workers]``, every step's share)
        and ``lumps`` (``[workers, num_steps]``, the rank's stalls: ``lump_s`` at some steps)."""
        total = self.collect[u]
        p = total.shape[0]
        if self.lump_s <= 0 or self.base is None:
            return total / num_steps, np.zeros((p, num_steps))
        base = self.base[u] if self.base.ndim == 2 else self.base
        excess = np.maximum(total - base, 0.0)
        # whole lumps only (they never exceed the excess, so no step time is negative); the
        # 1e-9 keeps stall: specs' exact multiples of DELAY from rounding down
        lumps = np.minimum(np.floor(excess / self.lump_s + 1e-9), num_steps).astype(int)
        even = (total - lumps * self.lump_s) / num_steps
        at = np.zeros((p, num_steps))
        if lumps.any():
            r = self.rng.random((p, num_steps))
            kth = np.sort(r, axis=1)[np.arange(p), np.maximum(lumps - 1, 0)]
            at = self.lump_s * ((r <= kth[:, None]) & (lumps[:, None] > 0))
        return even, at

    def step_ends(self, u: int, num_steps: int) -> np.ndarray:
        """``[workers, num_steps]`` end times of every step of update ``u``'s full rollouts."""
        even, lumps = self.step_parts(u, num_steps)
        return np.cumsum(even[:, None] + lumps, axis=1)

    def env_factors(self, num_envs: int) -> np.ndarray:
        """``[num_envs]``: how much slower each env of a rank steps than the nominal speed."""
        f = np.ones(num_envs)
        f[[e for e in self.slow_envs if e < num_envs]] = self.env_slowdown
        return f

    def env_steps(self, u: int, even: np.ndarray, num_envs: int, count: int) -> np.ndarray:
        """``[workers, num_envs, count]``: how long each env's next ``count`` steps of update
        ``u`` take, ``even * f_i`` plus its stalls (the same stalls at any ``count``: step ``j``'s
        draw does not depend on how many are drawn)."""
        d = even[:, None, None] * self.env_factors(num_envs)[None, :, None]
        d = np.repeat(d, count, axis=2)
        if self.env_stall_prob > 0 and self.env_stall_s > 0:
            rng = np.random.default_rng([self.env_seed, u])
            r = rng.random((count, even.shape[0], num_envs)).transpose(1, 2, 0)
            d += self.env_stall_s * (r < self.env_stall_prob)
        return d


@dataclasses.dataclass
class Workload:
    """Draws compute times (see the module docstring). Build it with :func:`parse_rollout`."""

    kind: str
    params: tuple = ()
    ppo_s: float = 0.0
    """Local PPO compute per update (trace specifications use the trace's own)."""
    persistent_cv: float = 0.0
    slow_frac: float = 0.0
    slowdown: float = 1.0
    lump_s: float = 0.0
    slow_envs: tuple[int, ...] = ()
    """Env indices (within every rank) that step ``env_slowdown`` times slower."""
    env_slowdown: float = 1.0
    env_stall_prob: float = 0.0
    """Each env stalls ``env_stall_s`` at each of its steps with this probability."""
    env_stall_s: float = 0.0
    trace: dict | None = None
    num_steps: int | None = None
    """Steps per env and full rollout of the traced run (trace specifications; None otherwise)."""
    num_envs: int | None = None
    """Envs per rank of the traced run, from its config.yaml (None: not known)."""

    def draw(self, rng: np.random.Generator, updates: int, workers: int, *,
             env_seed: int = 0) -> Draw:
        """The compute times of ``updates`` updates of ``workers`` workers (``env_seed``: the
        env stalls' seed)."""
        collect, ppo, factor = self._sample(rng, updates, workers)
        base = None
        if self.kind == "stall":
            base = np.full(workers, self.params[0]) * factor
        elif self.kind in ("trace", "fit"):
            fastest = _full_collect(self.trace).min(axis=1)
            base = fastest[np.arange(workers) % len(fastest)] * factor
        lump = self.params[2] if self.kind == "stall" and not self.lump_s else self.lump_s
        return Draw(collect, ppo, base=base, lump_s=lump, rng=rng, slow_envs=tuple(self.slow_envs),
                    env_slowdown=self.env_slowdown, env_stall_prob=self.env_stall_prob,
                    env_stall_s=self.env_stall_s, env_seed=env_seed)

    def _sample(self, rng, updates, workers):
        shape = (updates, workers)
        ppo = np.full(shape, self.ppo_s)
        if self.kind == "const":
            collect = np.full(shape, self.params[0])
        elif self.kind == "exp":
            collect = rng.exponential(self.params[0], size=shape)
        elif self.kind == "lognormal":
            mu, sigma = lognormal_params(*self.params)
            collect = rng.lognormal(mu, sigma, size=shape)
        elif self.kind == "stall":
            base, p, delay, steps = self.params
            collect = base + delay * rng.binomial(int(steps), p, size=shape)
        elif self.kind == "trace":
            collect, ppo = self._replay(updates, workers)
        elif self.kind == "fit":
            collect, ppo = self._fitted(rng, shape)
        else:  # pragma: no cover - parse_rollout only builds the kinds above
            raise ValueError(self.kind)
        factor = np.ones(workers)
        if self.persistent_cv > 0:
            mu, sigma = lognormal_params(1.0, self.persistent_cv)
            factor *= rng.lognormal(mu, sigma, size=workers)
        if self.slow_frac > 0:
            factor[: int(round(self.slow_frac * workers))] *= self.slowdown
        return collect * factor, ppo * factor, factor

    def _replay(self, updates: int, workers: int) -> tuple[np.ndarray, np.ndarray]:
        collect = _full_collect(self.trace)
        ppo = self.trace["update_s"] + self.trace.get("other_s", 0.0)
        ranks, length = collect.shape
        w = np.arange(workers)
        src = w % ranks
        offset = (w // ranks) * 7919 % length  # copies of one rank start at different updates
        idx = (np.arange(updates)[:, None] + offset[None, :]) % length
        return collect[src[None, :], idx], ppo[src[None, :], idx]

    def _fitted(self, rng: np.random.Generator, shape) -> tuple[np.ndarray, np.ndarray]:
        fit = fit_trace(self.trace)
        mu, sigma = lognormal_params(1.0, fit["transient_cv"])
        transient = rng.lognormal(mu, sigma, size=shape)
        mu, sigma = lognormal_params(1.0, fit["persistent_cv"])
        persistent = rng.lognormal(mu, sigma, size=shape[1])
        scale = transient * persistent[None, :]
        return fit["mean"] * scale, fit["ppo_s"] * scale


def _numbers(spec: str, body: str, count: tuple[int, ...]) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in body.split(","))
    except ValueError:
        values = ()
    if len(values) not in count or any(not math.isfinite(v) or v < 0 for v in values):
        raise ValueError(f"--rollout {spec!r}: expected {'/'.join(map(str, count))} non-negative "
                         "numbers after the colon (e.g. const:1.0, exp:1.0, lognormal:1.0,0.3, "
                         "stall:0.3,0.01,1.0)")
    return values


def trace_shape(path: str | Path, trace: dict) -> tuple[int, int | None]:
    """``(num_steps, num_envs)`` of a traced run: the trace's ``num_steps`` column and
    ``env.num_envs`` of the ``config.yaml`` the trainer wrote beside the ``trace/`` folder (None
    when there is none). ValueError when the trace mixes rollout lengths."""
    steps = np.unique(trace["num_steps"])
    if steps.size != 1:
        raise ValueError(f"{path}: the trace mixes rollouts of "
                         f"{sorted(steps.astype(int).tolist())} steps (ppo.num_steps changed on "
                         "resume); replay one setting at a time")
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    config = folder.parent / "config.yaml"
    num_envs = None
    if config.is_file():
        import yaml

        num_envs = (yaml.safe_load(config.read_text()) or {}).get("env", {}).get("num_envs")
    return int(steps[0]), (int(num_envs) if num_envs is not None else None)


def parse_rollout(spec: str, *, ppo_s: float = 0.0, persistent_cv: float = 0.0,
                  slow_frac: float = 0.0, slowdown: float = 1.0, lump_s: float = 0.0,
                  slow_envs=(), env_slowdown: float = 1.0, env_stall_prob: float = 0.0,
                  env_stall_s: float = 0.0) -> Workload:
    """Build the :class:`Workload` of a ``--rollout`` specification (ValueError when malformed)."""
    from wagma_rl.rl.trace import read_trace

    kind, _, body = spec.partition(":")
    extra = dict(ppo_s=ppo_s, persistent_cv=persistent_cv, slow_frac=slow_frac, slowdown=slowdown,
                 lump_s=lump_s, slow_envs=tuple(int(e) for e in slow_envs),
                 env_slowdown=env_slowdown, env_stall_prob=env_stall_prob, env_stall_s=env_stall_s)
    if kind == "const":
        return Workload("const", _numbers(spec, body, (1,)), **extra)
    if kind == "exp":
        (mean,) = _numbers(spec, body, (1,))
        return Workload("exp", (mean,), **extra)
    if kind == "lognormal":
        mean, cv = _numbers(spec, body, (2,))
        if mean <= 0:
            raise ValueError(f"--rollout {spec!r}: the mean must be > 0")
        return Workload("lognormal", (mean, cv), **extra)
    if kind == "stall":
        values = _numbers(spec, body, (3, 4))
        base, p, delay = values[:3]
        steps = values[3] if len(values) == 4 else 64
        if p > 1:
            raise ValueError(f"--rollout {spec!r}: the stall probability must be in [0, 1]")
        return Workload("stall", (base, p, delay, steps), **extra)
    if kind in ("trace", "fit"):
        if not body or not Path(body).exists():
            raise ValueError(f"--rollout {spec!r}: no trace at {body!r} (give a run's trace/ folder "
                             "or one of its rank_*.csv files)")
        trace = read_trace(body)
        num_steps, num_envs = trace_shape(body, trace)
        return Workload(kind, (body,), trace=trace, num_steps=num_steps, num_envs=num_envs, **extra)
    raise ValueError(f"--rollout {spec!r}: unknown kind {kind!r}; use const:S, exp:MEAN, "
                     "lognormal:MEAN,CV, stall:BASE,P,DELAY[,STEPS], trace:PATH or fit:PATH")
