"""Benchmark (issue 21): following a drifting stream, today's mode against the sliding window.

Synthetic streams of d = 4 features (x uniform in the cube [-1, 1]^d / sqrt(d), so ||x|| <= 1
and no clipping happens) whose true weight vector w(i) depends on the arrival position i:

* ``jump``: w = |w| u up to arrival ``JUMP_AT``, then |w| v (u, v orthonormal, drawn per seed):
  the first step that sees a post-jump record is step ``JUMP_STEP``.
* ``rotation``: w(i) = |w| (cos(omega i) u + sin(omega i) v), a fixed angle per arrival
  (``ROTATION_DEG_PER_1000`` degrees per 1,000 arrivals, so 9 degrees per window of M).
* ``stationary``: w = |w| u throughout (for the rho_min check).

linreg: y = w.x + N(0, 0.1^2), |w| = 1 (known noise precision 100); logistic: y ~
Bernoulli(sigmoid(w.x)), |w| = 4. The issue's design: M = 10,000, a step every 1,000 arrivals,
q = 0.15 (Poisson batches of 1,500), epsilon 1 per record, delta 1e-5, the same for every
configuration:

* ``today``: ``reservoir_policy: uniform``, ``accounting: stream``, ``planned_steps`` = the
  stream's steps (epsilon 1 over the whole stream; the budget halts updates soon after), no
  step-size floor (the default);
* ``window``: ``reservoir_policy: window``, ``accounting: window``, ``rho_min`` 0.2 (the issue's
  floor for tracking); ``window_rho005``: the same with ``rho_min`` 0.05 (the floor the docs give
  for stationary accuracy; reported, no target);
* ``non_private_window`` / ``non_private_window_rho005``: ``non_private=True`` with the
  same window and schedule: the references.

After every step the posterior mean m (linreg ``posterior_mean()``, logistic ``model.mu``, read
from ``learner.model``) is compared with the true weights at the newest arrival,
``||m - w|| / |w|`` ("error"), and with the mean of the non-private window model with the same
step-size floor (today's mode: the rho_min 0.2 one), ``||m - m_ref|| / |w|`` ("vs_reference").
Means over a stream use the steps from ``BURN_IN`` on (the first steps start from the prior).

Recovery after the jump: the pre-jump level is the mean error over the ``PRE_JUMP`` steps before
``JUMP_STEP`` and the threshold is ``RECOVERY_FACTOR`` x that level. A configuration has recovered
at the first post-jump step whose error is within the threshold (the first passage, as recovery
time is measured for concept drift), provided it stays recovered on average: the mean error over
the ``HOLD`` steps from there is within the threshold too, so a lucky dip does not count (it
binds once here: logistic, rho_min 0.05, seed 14 first comes within the threshold after 115 steps
and then leaves it). Steps count from the last pre-jump step (1 = already at the first
post-jump step); ``None``: not recovered by the end of the stream. Today's mode "never recovers"
when it has not recovered by the end of the stream and, fed more post-jump arrivals until its
budget halts it (after which its model never changes), its frozen model is still outside the
threshold.

The first version of this benchmark, fixed before its first run, had the same level and
threshold but a stricter rule: recovered at the first step after which *every* step stays within
the threshold to the end of the stream. It is still computed (``strict_rule_steps``). It was
replaced after the first runs because of a control: both rules are applied to the stationary
stream, which has no jump, at the same step, where a rule that measures recovery must say
"recovered at once". The strict rule says "not recovered within 50 steps" on 1-3 of 5 seeds for
every configuration, today's mode and the non-private window model included: over 200 noisy steps
some single step exceeds 2x a 20-step mean by chance, so it measures the tail of the stationary
error, not recovery. The rule above passes that control on every configuration and seed. A control
in that direction cannot show that a rule is too lenient, so there is a negative control too: on
the jump stream, the rule must report no recovery for models that do not adapt (today's mode, and
the window model frozen at its last pre-jump mean).

Run: ``python benchmarks/bench_drift.py`` (about 15 s on 2 cores; writes
benchmarks/results/bench_drift.json).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np

from benchmarks.common import machine, write_result
from stream_vips import PrivateLearner
from stream_vips.core.data.decoding import DecodedBatch
from stream_vips.core.data.window import window_steps

DIM = 4
M = 10_000  # reservoir (window) size
EVERY = 1_000  # a step every EVERY arrivals
BATCH = 1_500  # q = 0.15
EPSILON, DELTA = 1.0, 1e-5
STEPS = 300  # steps per stream: arrivals M + (STEPS - 1) * EVERY
JUMP_STEP = 100  # first step that sees a post-jump arrival
JUMP_AT = M + (JUMP_STEP - 1) * EVERY  # first post-jump arrival
ROTATION_DEG_PER_1000 = 0.9
BURN_IN = 50  # steps left out of stream means
PRE_JUMP = 20  # steps before the jump that set the pre-jump level
HOLD = 50  # steps from the first passage over which the mean error must stay within the threshold
RECOVERY_FACTOR = 2.0
RECOVERY_TARGET = 50  # steps
EXTRA_CAP = 200  # at most this many extra post-jump steps to reach today's halt
SEEDS = (11, 12, 13, 14, 15)
RHO_TRACK, RHO_STATIONARY = 0.2, 0.05  # the issue's and the docs' step-size floors
FAMILIES: dict[str, dict[str, Any]] = {
    "linreg": {"norm": 1.0, "noise_sd": 0.1, "params": {"noise_precision": 100.0}},
    "logistic": {"norm": 4.0, "params": {}},
}
STREAMS = ("jump", "rotation", "stationary")
CONFIGS: dict[str, dict[str, Any]] = {
    "today": {"reservoir_policy": "uniform", "accounting": "stream", "planned_steps": STEPS},
    "window": {"reservoir_policy": "window", "accounting": "window", "rho_min": RHO_TRACK},
    "window_rho005": {"reservoir_policy": "window", "accounting": "window", "rho_min": RHO_STATIONARY},
    "non_private_window": {"reservoir_policy": "window", "non_private": True, "rho_min": RHO_TRACK},
    "non_private_window_rho005": {"reservoir_policy": "window", "non_private": True, "rho_min": RHO_STATIONARY},
}
REFERENCE = {"today": "non_private_window", "window": "non_private_window",
             "window_rho005": "non_private_window_rho005"}


def true_weights(stream: str, n: int, norm: float, rng: np.random.Generator) -> np.ndarray:
    """The true weight vector at each of ``n`` arrivals, shape (n, DIM)."""
    u, v = np.linalg.qr(rng.standard_normal((DIM, 2)))[0].T
    i = np.arange(n)
    if stream == "stationary":
        theta = np.zeros(n)
    elif stream == "jump":
        theta = np.where(i >= JUMP_AT, np.pi / 2, 0.0)
    elif stream == "rotation":
        theta = np.deg2rad(ROTATION_DEG_PER_1000) * i / 1000.0
    else:
        raise ValueError(f"unknown stream {stream!r}")
    return norm * (np.cos(theta)[:, None] * u + np.sin(theta)[:, None] * v)


def make_stream(family: str, stream: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Features, labels and true weights for ``n`` arrivals (fixed by ``seed``)."""
    spec = FAMILIES[family]
    rng = np.random.default_rng([seed, STREAMS.index(stream), list(FAMILIES).index(family)])
    W = true_weights(stream, n, spec["norm"], rng)
    X = rng.uniform(-1.0, 1.0, size=(n, DIM)) / np.sqrt(DIM)
    f = np.einsum("ij,ij->i", X, W)
    if family == "linreg":
        y = np.clip(f + spec["noise_sd"] * rng.standard_normal(n), -1.0, 1.0)
    else:
        y = (rng.random(n) < 1.0 / (1.0 + np.exp(-f))).astype(float)
    return X, y, W


def posterior_mean(learner: PrivateLearner) -> np.ndarray:
    """The posterior mean of the weights, read from the model object."""
    model = learner.model
    return np.array(model.posterior_mean() if model.family == "linreg" else model.mu, dtype=float)


def run(family: str, config: str, X: np.ndarray, y: np.ndarray, seed: int,
        extra: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, Any]:
    """Feed the stream to one configuration; the posterior mean and position after every step.

    With ``extra`` (today's mode on the jump stream), more post-jump arrivals follow, a step at a
    time, until the budget halts updates: the model it then keeps forever is ``frozen_mean``."""
    learner = PrivateLearner(family, dim=DIM, epsilon=EPSILON, delta=DELTA, reservoir=M, batch_size=BATCH,
                             every_records=EVERY, seed=seed, **FAMILIES[family]["params"], **CONFIGS[config])
    means: list[np.ndarray] = []
    seen: list[int] = []

    def record(_: Any) -> None:
        means.append(posterior_mean(learner))
        seen.append(learner.reservoir.seen)

    n = len(y)
    learner.offer(DecodedBatch(np.ones(n, dtype=bool), {"x": X, "y": y}, []), on_step=record)
    out: dict[str, Any] = {"means": np.array(means), "seen": np.array(seen),
                           "z": learner.engine.noise_multiplier, "epsilon_spent": learner.epsilon_spent,
                           "window_steps": learner.window_steps}
    if extra is not None:
        Xe, ye = extra
        for start in range(0, len(ye), EVERY):
            if learner.halted:
                break
            learner.offer(DecodedBatch(np.ones(EVERY, dtype=bool),
                                       {"x": Xe[start:start + EVERY], "y": ye[start:start + EVERY]}, []))
        out.update(halted=learner.halted, halt_reason=learner.halt_reason, frozen_mean=posterior_mean(learner),
                   steps_total=learner.steps_taken, epsilon_spent_at_halt=learner.epsilon_spent)
    learner.close()
    return out


def recovery(err: np.ndarray) -> dict[str, Any]:
    """Pre-jump level, threshold, steps to recover and the first version's strict rule (module docstring)."""
    level = float(err[JUMP_STEP - PRE_JUMP:JUMP_STEP].mean())
    threshold = RECOVERY_FACTOR * level
    post = err[JUMP_STEP:]
    below = np.flatnonzero(post <= threshold)
    first = int(below[0]) + 1 if below.size else None
    held = None if first is None else float(post[first - 1:first - 1 + HOLD].mean())
    above = np.flatnonzero(post > threshold)  # the first version's rule: every later step within it
    if above.size == 0:
        strict: int | None = 1
    elif above[-1] == post.size - 1:
        strict = None
    else:
        strict = int(above[-1]) + 2
    late = int(np.sum(post[first:] > threshold)) if first is not None else None
    return {"pre_jump_level": level, "threshold": threshold,
            "steps_to_recover": first if held is not None and held <= threshold else None,
            "first_within": first, "mean_error_over_hold": held,
            "strict_rule_steps": strict, "late_excursions": late,
            "post_jump_mean_error_from_step_30": float(post[30:].mean()),
            "peak": float(post.max()), "final": float(post[-1])}


def one_seed(family: str, stream: str, seed: int) -> dict[str, Any]:
    """Every configuration on one stream and seed: per-step errors and summaries."""
    n = M + (STEPS - 1) * EVERY
    X, y, W = make_stream(family, stream, n + EXTRA_CAP * EVERY, seed)
    norm = FAMILIES[family]["norm"]
    runs = {}
    for config in CONFIGS:
        extra = (X[n:], y[n:]) if (stream == "jump" and config == "today") else None
        runs[config] = run(family, config, X[:n], y[:n], seed, extra)
    seen = runs["non_private_window"]["seen"]
    assert seen.size == STEPS and all(np.array_equal(r["seen"], seen) for r in runs.values())
    truth = W[seen - 1]
    out: dict[str, Any] = {}
    for config, r in runs.items():
        err = np.linalg.norm(r["means"] - truth, axis=1) / norm
        row: dict[str, Any] = {"error": err, "mean_error": float(err[BURN_IN:].mean()),
                               "z": r["z"], "epsilon_spent": r["epsilon_spent"], "window_steps": r["window_steps"]}
        if config in REFERENCE:
            ref = runs[REFERENCE[config]]["means"]
            vs = np.linalg.norm(r["means"] - ref, axis=1) / norm
            row.update(vs_reference=vs, mean_vs_reference=float(vs[BURN_IN:].mean()))
        if stream in ("jump", "stationary"):  # the stationary stream is the rule's no-jump control
            row["recovery"] = recovery(err)
        if stream == "jump":
            row["pre_jump_mean_error"] = float(err[BURN_IN:JUMP_STEP].mean())
        if "frozen_mean" in r:
            frozen = float(np.linalg.norm(r["frozen_mean"] - W[-1]) / norm)
            rec = row["recovery"]
            row["after_stream"] = {"halted": r["halted"], "halt_reason": r["halt_reason"],
                                   "steps_total": r["steps_total"], "epsilon_spent": r["epsilon_spent_at_halt"],
                                   "frozen_error": frozen,
                                   "old_regime_share_of_reservoir": JUMP_AT / (M + (r["steps_total"] - 1) * EVERY)}
            row["never_recovers"] = bool(rec["steps_to_recover"] is None and r["halted"]
                                         and frozen > rec["threshold"])
        out[config] = row
    if stream == "jump":  # negative control: the window model frozen at its last pre-jump mean
        frozen_means = runs["window"]["means"].copy()
        frozen_means[JUMP_STEP:] = frozen_means[JUMP_STEP - 1]
        err = np.linalg.norm(frozen_means - truth, axis=1) / norm
        out["frozen_before_jump"] = {"error": err, "mean_error": float(err[BURN_IN:].mean()), "recovery": recovery(err)}
    return out


def summarise(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """Seed means of the scalar summaries, per-seed values, and the seed-mean error curve."""
    out: dict[str, Any] = {}
    for config in per_seed[0]:
        rows = [s[config] for s in per_seed]
        keep = ["mean_error", "mean_vs_reference", "pre_jump_mean_error"]
        summary: dict[str, Any] = {k: float(np.mean([r[k] for r in rows])) for k in keep if k in rows[0]}
        summary["per_seed"] = {k: [round(r[k], 5) for r in rows] for k in keep if k in rows[0]}
        if "z" in rows[0]:  # a learner's run (not the frozen negative control)
            summary["z"] = rows[0]["z"]
            summary["window_steps"] = rows[0]["window_steps"]
            spent = [r["epsilon_spent"] for r in rows]
            summary["epsilon_spent"] = max(spent) if np.isfinite(spent[0]) else None
        if "recovery" in rows[0]:
            summary["recovery_per_seed"] = [
                {k: (round(v, 5) if isinstance(v, float) else v) for k, v in r["recovery"].items()} for r in rows]
        if "after_stream" in rows[0]:
            summary["after_stream_per_seed"] = [r["after_stream"] for r in rows]
            summary["never_recovers_per_seed"] = [r["never_recovers"] for r in rows]
        summary["error_curve_seed_mean"] = np.round(np.mean([r["error"] for r in rows], axis=0), 4).tolist()
        out[config] = summary
    return out


def targets(results: dict[str, Any]) -> dict[str, Any]:
    """The issue's three targets, per family (and drift stream), with target and met."""
    out: dict[str, Any] = {}
    for family, streams in results.items():
        for stream in ("jump", "rotation"):
            res = streams[stream]
            ratio = res["window"]["mean_error"] / res["non_private_window"]["mean_error"]
            per_seed = [w / r for w, r in zip(res["window"]["per_seed"]["mean_error"],
                                             res["non_private_window"]["per_seed"]["mean_error"])]
            out[f"{family}_{stream}_window_within_2x_non_private"] = {
                "value": round(ratio, 4), "per_seed": [round(v, 4) for v in per_seed],
                "target": "seed-mean error of window mode / of the non-private window model <= 2 "
                          f"(mean over steps >= {BURN_IN})",
                "met": bool(ratio <= 2.0), "met_every_seed": bool(max(per_seed) <= 2.0)}
        jump = streams["jump"]
        recs = jump["window"]["recovery_per_seed"]
        steps = [r["steps_to_recover"] for r in recs]
        out[f"{family}_window_recovers"] = {
            "value": steps, "target": f"steps to recover < {RECOVERY_TARGET} on every seed",
            "met": all(s is not None and s < RECOVERY_TARGET for s in steps),
            "seeds_met": sum(s is not None and s < RECOVERY_TARGET for s in steps),
            "mean_error_over_hold": [round(r["mean_error_over_hold"], 4) for r in recs],
            "threshold": [round(r["threshold"], 4) for r in recs],
            "strict_rule_steps": [r["strict_rule_steps"] for r in recs],
            "late_excursions": [r["late_excursions"] for r in recs],
            "non_private_window_steps": [r["steps_to_recover"]
                                         for r in jump["non_private_window"]["recovery_per_seed"]]}
        control = {}
        for config in CONFIGS:
            ctrl = streams["stationary"][config]["recovery_per_seed"]
            control[config] = {
                rule: {"steps": [r[key] for r in ctrl],
                       "seeds_not_within_target": sum(r[key] is None or r[key] >= RECOVERY_TARGET for r in ctrl)}
                for rule, key in (("rule", "steps_to_recover"), ("strict_rule", "strict_rule_steps"))}
        out[f"{family}_recovery_rule_no_jump_control"] = {
            "value": control,
            "target": "the recovery rule reports every stationary (no-jump) stream recovered within "
                      f"{RECOVERY_TARGET} steps, for every configuration and seed (a rule that fails this "
                      "measures noise, not recovery)",
            "met": all(c["rule"]["seeds_not_within_target"] == 0 for c in control.values())}
        negative = {name: [r["steps_to_recover"] for r in jump[name]["recovery_per_seed"]]
                    for name in ("today", "frozen_before_jump")}
        out[f"{family}_recovery_rule_negative_control"] = {
            "value": negative,
            "target": "the recovery rule reports no recovery on the jump stream for models that do not adapt: "
                      "today's mode and the window model frozen at its last pre-jump mean, on every seed",
            "met": all(v is None for steps in negative.values() for v in steps)}
        ratio_st = (streams["stationary"]["window"]["mean_error"]
                    / streams["stationary"]["non_private_window"]["mean_error"])
        ratio_pre = jump["window"]["pre_jump_mean_error"] / jump["non_private_window"]["pre_jump_mean_error"]
        out[f"{family}_stationary_window_vs_non_private"] = {
            "value": {"stationary_stream": round(ratio_st, 4), "jump_stream_before_the_jump": round(ratio_pre, 4)},
            "target": "none (information): the issue's 2x target is on the drift streams",
            "met": None}
        never = jump["today"]["never_recovers_per_seed"]
        out[f"{family}_today_never_recovers"] = {
            "value": {"steps_to_recover": [r["steps_to_recover"] for r in jump["today"]["recovery_per_seed"]],
                      "frozen_error": [round(a["frozen_error"], 4) for a in jump["today"]["after_stream_per_seed"]],
                      "threshold": [r["threshold"] for r in jump["today"]["recovery_per_seed"]]},
            "target": "today's mode not recovered by the end of the stream, and its model frozen by the budget "
                      "halt still outside the threshold, on every seed",
            "met": all(never)}
    return out


def _git_head() -> str | None:
    """The checkout's HEAD commit (None outside a git checkout)."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main() -> dict[str, Any]:
    """Run every family, stream, configuration and seed; write the results."""
    started = time.perf_counter()
    results: dict[str, Any] = {}
    for family in FAMILIES:
        results[family] = {}
        for stream in STREAMS:
            per_seed = [one_seed(family, stream, seed) for seed in SEEDS]
            results[family][stream] = summarise(per_seed)
            print(f"{family:8s} {stream:10s} " + "  ".join(
                f"{c}={s['mean_error']:.4f}" for c, s in results[family][stream].items()), flush=True)
    stationary = {f: {c: results[f]["stationary"][c]["mean_error"] for c in CONFIGS} for f in FAMILIES}
    report: dict[str, Any] = {
        "benchmark": "bench_drift",
        "issue": 21,
        "machine": machine(),
        "git_head": _git_head(),
        "settings": {
            "dim": DIM, "reservoir_M": M, "every_records": EVERY, "batch_size": BATCH, "q": BATCH / M,
            "sampling": "poisson", "epsilon": EPSILON, "delta": DELTA, "steps_per_stream": STEPS,
            "arrivals_per_stream": M + (STEPS - 1) * EVERY, "window_steps_L": window_steps(M, EVERY),
            "today_planned_steps": STEPS, "schedule": {"tau0": 100.0, "kappa": 0.7},
            "jump": {"first_post_jump_arrival": JUMP_AT, "first_post_jump_step": JUMP_STEP,
                     "change": "w turns by 90 degrees (same norm) at once"},
            "rotation_degrees_per_1000_arrivals": ROTATION_DEG_PER_1000,
            "features": "x uniform in [-1, 1]^d / sqrt(d) (||x|| <= 1, no clipping)",
            "families": {f: {k: v for k, v in s.items()} for f, s in FAMILIES.items()},
            "configs": CONFIGS, "seeds": list(SEEDS),
            "stream_length_rule": "300 steps per stream: the jump 100 steps in (a converged pre-jump level), "
                                  "200 steps after it (4x the 50-step target); with the issue's M, q and k the "
                                  "whole run takes about 30 s on 2 cores, well within the 5-minute limit",
        },
        "definitions": {
            "error": "||posterior mean - true weights at the newest arrival|| / ||w||, after every step",
            "vs_reference": "||posterior mean - non-private window model's mean (same rho_min; today's mode: "
                            "rho_min 0.2)|| / ||w||",
            "mean_error": f"mean over steps >= {BURN_IN} (burn-in from the prior left out)",
            "recovery": f"pre-jump level = mean error over the {PRE_JUMP} steps before the first post-jump step; "
                        f"threshold = {RECOVERY_FACTOR:g} x that level; recovered at the first post-jump step "
                        f"within the threshold (first passage) if the mean error over the {HOLD} steps from "
                        "there is within the threshold too; counted from the last pre-jump step (1 = at "
                        "once); null = not recovered by the end of the stream",
            "strict_rule_steps": "the first version's rule (same level and threshold), kept for comparison: "
                                 "the first step after which every step stays within the threshold to the end "
                                 "of the stream; the no-jump control (both rules on the stationary stream at "
                                 "the same step) shows it fails on streams without a jump",
            "today_never_recovers": "not recovered by the end of the stream, and after more post-jump arrivals "
                                    "until the budget halts updates (the model then never changes) the frozen "
                                    "model's error is still above the threshold",
        },
        "rho_min_rule": {
            "used": {"drift": RHO_TRACK, "stationary_check": RHO_STATIONARY},
            "source": "the issue fixes rho_min 0.2 for tracking; ScheduleConfig's docstring gives about 0.2 to "
                      "track drift and 0.05 for a stationary stream in a window; no value was tuned here",
            "stationary_mean_error": stationary,
        },
        "results": results,
        "targets": None,
        "runtime_s": None,
    }
    report["targets"] = targets(results)
    report["runtime_s"] = round(time.perf_counter() - started, 1)
    path = write_result("bench_drift", report)
    for name, t in report["targets"].items():
        print(f"{name}: {t['value']} met={t['met']}")
    print(f"wrote {path} in {report['runtime_s']} s")
    return report


if __name__ == "__main__":
    main()
