"""Benchmark: cost of the per-step budget check and of noise calibration.

For each accountant (pld on Poisson replace-one steps, autodp on fixed-size replace-one steps)
a BudgetMonitor admits a homogeneous stream of 10^5 steps (budget set so that all of them fit),
reporting the spent epsilon after every step as a model message would. The headline is the mean
cost of one step *with the warm-up included* (first check, which runs the headroom search,
amortised over the 10^5 steps; a fresh accountant, so no cache is warm); the mean and p99 after
warm-up and the warm-up itself are reported too. The peer is what a monitor without caching
would do per step: recompute epsilon of the whole ledger plus the candidate with the library
directly (dp_accounting ``PLDAccountant`` / autodp ``Composition``) at ledger length 10^5.
Earlier results are kept in ``history`` (the first entry is the accountant before issue 20).

Calibration: ``calibrate_noise_multiplier`` against dp_accounting's ``calibrate_dp_mechanism``
(Brent's method) for the same event, timing both and checking that each result meets the target.
The ledger's durable append (fsync) is timed separately for information (it is I/O, not the check).

Run: ``python benchmarks/bench_budget.py`` (writes benchmarks/results/bench_budget.json).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import dp_accounting as dpa
import numpy as np
from dp_accounting.mechanism_calibration import ExplicitBracketInterval, calibrate_dp_mechanism
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant as DpaRdp

from benchmarks.common import RESULTS, machine, write_result
from stream_vips.privacy.accountants import PldAccountant, RdpAccountant
from stream_vips.privacy.budget import BudgetMonitor
from stream_vips.privacy.calibration import calibrate_noise_multiplier
from stream_vips.privacy.events import SubsampledGaussianEvent
from stream_vips.privacy.ledger import FileLedger, MemoryLedger

STEPS = 100_000
DELTA = 1e-5
CHECK_TARGET_MS = 1.0
NR = dpa.NeighboringRelation


def peer_check_seconds(event: SubsampledGaussianEvent, ledger_len: int, reps: int = 3) -> float:
    """Median time of one uncached check: epsilon of ledger + candidate, straight from the library."""
    times = []
    for _ in range(reps):
        if event.sampling == "poisson":
            t = time.perf_counter()
            acct = PLDAccountant(NR.REPLACE_ONE)
            acct.compose(dpa.PoissonSampledDpEvent(event.sampling_rate, dpa.GaussianDpEvent(event.noise_multiplier)),
                         ledger_len + 1)
            acct.get_epsilon(DELTA)
        else:
            from autodp.mechanism_zoo import ExactGaussianMechanism
            from autodp.transformer_zoo import AmplificationBySampling, Composition

            mech = ExactGaussianMechanism(event.noise_multiplier / 2)
            mech.neighboring = "replace_one"
            mech = AmplificationBySampling(PoissonSampling=False)(mech, event.sampling_rate, improved_bound_flag=True)
            t = time.perf_counter()  # mechanism construction excluded: only the per-step work
            Composition()([mech], [ledger_len + 1]).get_approxDP(DELTA)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench_checks(name: str, accountant, event: SubsampledGaussianEvent) -> dict:
    # budget from a separate instance, so the warm-up below includes building the caches
    budget = type(accountant)().epsilon([event.with_count(STEPS + 10)], DELTA)
    monitor = BudgetMonitor(budget, DELTA, accountant, MemoryLedger())
    t = time.perf_counter()
    assert monitor.admit(event) == 0
    monitor.spent()
    warmup = time.perf_counter() - t
    per = np.empty(STEPS - 1)
    reports = np.empty(STEPS - 1)
    for i in range(STEPS - 1):
        t = time.perf_counter()
        step = monitor.admit(event)
        reports[i] = monitor.spent()  # what a message per step reports
        per[i] = time.perf_counter() - t
        assert step == i + 1
    assert np.all(np.diff(reports) >= 0)
    mean_ms = float(per.mean() * 1e3)
    amortised_ms = (warmup + float(per.sum())) / STEPS * 1e3
    peer_ms = peer_check_seconds(event, STEPS) * 1e3
    return {
        "accountant": name, "event": event.to_dict(), "steps": STEPS, "epsilon_budget": budget,
        "epsilon_spent": monitor.spent(), "warmup_s": warmup,
        "accountant_evaluations": getattr(accountant, "evaluations", None),
        "per_step_check_and_report_ms_incl_warmup": {
            "mean": amortised_ms, "target": f"< {CHECK_TARGET_MS} ms", "met": amortised_ms < CHECK_TARGET_MS},
        "per_step_check_ms": {"mean": mean_ms, "p99": float(np.percentile(per, 99) * 1e3),
                              "max": float(per.max() * 1e3), "note": "after warm-up"},
        "peer": "uncached recompute per step ("
        + ("dp_accounting PLDAccountant" if name == "pld" else "autodp Composition") + ")",
        "peer_check_ms": peer_ms,
        "speedup_vs_peer_incl_warmup": peer_ms / amortised_ms,
    }


def bench_calibration(name: str, accountant, q: float, steps: int, sampling: str, target: float) -> dict:
    def ours_eps(z: float) -> float:
        return accountant.epsilon([SubsampledGaussianEvent(z, q, sampling, count=steps)], DELTA)

    t = time.perf_counter()
    z = calibrate_noise_multiplier(target, DELTA, q, steps, sampling, accountant=accountant)
    ours_s = time.perf_counter() - t

    if sampling == "poisson":
        def fresh():
            return PLDAccountant(NR.REPLACE_ONE)

        def make_event(zz):
            return dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(zz)), steps)
        peer = "dp_accounting calibrate_dp_mechanism (PLDAccountant REPLACE_ONE)"
    else:
        m = 1000

        def fresh():
            return DpaRdp(neighboring_relation=NR.REPLACE_ONE)

        def make_event(zz):  # without-replacement noise_multiplier is std / diameter = z/2
            return dpa.SelfComposedDpEvent(
                dpa.SampledWithoutReplacementDpEvent(m, round(q * m), dpa.GaussianDpEvent(zz / 2)), steps)
        peer = "dp_accounting calibrate_dp_mechanism (RdpAccountant REPLACE_ONE, without replacement)"
    t = time.perf_counter()
    z_peer = calibrate_dp_mechanism(fresh, make_event, target, DELTA,
                                    ExplicitBracketInterval(1.0, 50.0), tol=z * 1e-3)
    peer_s = time.perf_counter() - t
    eps_z = ours_eps(z)
    return {
        "accountant": name, "sampling": sampling, "q": q, "steps": steps, "target_epsilon": target,
        "noise_multiplier": z, "epsilon_at_z": eps_z, "epsilon_at_0.99z": ours_eps(0.99 * z),
        "calibration_s": ours_s,
        "meets_target": {"target": "epsilon(z) <= target epsilon", "met": eps_z <= target},
        "peer": peer, "peer_s": peer_s, "peer_noise_multiplier": z_peer,
        "peer_epsilon_at_its_z": ours_eps(z_peer),
        "time_ratio_peer_over_ours": peer_s / ours_s,
    }


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (VmHWM), MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def bench_fsync(n: int = 200) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        with FileLedger(Path(tmp) / "ledger.jsonl") as led:
            event = SubsampledGaussianEvent(1.0, 0.01, "poisson")
            t = time.perf_counter()
            for _ in range(n):
                led.append(event)
            return {"appends": n, "mean_ms": (time.perf_counter() - t) / n * 1e3}


def main() -> dict:
    warnings.simplefilter("ignore")
    checks = [
        bench_checks("pld", PldAccountant(), SubsampledGaussianEvent(1.0, 0.01, "poisson")),
        bench_checks("autodp", RdpAccountant(), SubsampledGaussianEvent(2.0, 0.01, "fixed")),
    ]
    calibration = [
        bench_calibration("pld", PldAccountant(), 0.01, 10_000, "poisson", 1.0),
        bench_calibration("autodp", RdpAccountant(), 0.01, 10_000, "fixed", 1.0),
    ]
    result = {
        "benchmark": "bench_budget",
        "machine": machine(),
        "budget_checks": checks,
        "calibration": calibration,
        "ledger_fsync_append": bench_fsync(),
        "peak_rss_mb": peak_rss_mb(),
        "targets_met": all(c["per_step_check_and_report_ms_incl_warmup"]["met"] for c in checks)
        and all(c["meets_target"]["met"] for c in calibration),
    }
    path = RESULTS / "bench_budget.json"
    previous = json.loads(path.read_text()) if path.exists() else None
    history = previous.pop("history", []) if previous else []
    if previous:
        previous.setdefault("label", "before issue 20 (accountant at 60cf813; warm-up excluded from the mean)"
                            if not history else "earlier run")
        history.insert(0, previous)
    result["history"] = history
    write_result("bench_budget", result)
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
