"""Benchmark: private LDA steps on 2 Ray shards against one process (target: >= 1.6x).

Same configuration for both (K topics over a V-word vocabulary, documents resampled to N words,
a full reservoir of M documents, Poisson sampling of S = q M expected documents per step, one
calibrated z): the one-process run times ``PrivateLearner.step()``; the sharded run times
``ShardedLearner.step()`` with the shards as Ray actors, each holding M / 2 documents. A step's
cost is the E-step over the sampled documents, which the shards run in parallel; the driver adds
a K x V sum per shard, draws the noise and runs the M-step. Both reservoirs are filled first
(untimed); reps are interleaved and the median seconds per step are compared. The speed-up is
bounded by the cores: on a machine with fewer than 2 free cores it cannot reach 2x. An earlier
recorded run shared the development machine's 2 cores with other work (load average about 2) and
measured 0.82x, the machine rather than the runtime. On the same machine otherwise idle (load
average 0.5 to 0.9, 2026-11-28) six runs gave 1.59x (3 reps of 2 steps), 1.55x and 1.65x (5 of
3), 1.66x twice and 1.595x (9 of 3, the recorded setting); then the driver put the model state in
Ray's object store once per step instead of sending it to each shard, and two runs gave 1.64x and
1.67x, against a ceiling of 1.75x to 1.80x measured as below: most of the way to 2x is lost to the
machine, about 0.1x to Ray. The target is near this machine's edge. The recorded result (1.60x,
ceiling 1.77x) is the run that added the records/s and logistic parts, with the machine's other
work paused (load average 1.5 at the start, falling).

The same run also measures what the machine allows, without Ray: the two shards' contributions
computed at the same time by two plain forked processes (the same slices, state and plans as the
sharded step). ``ceiling_speedup`` is the one-process step over that concurrent time plus the
driver's release; the gap between it and ``speedup`` is Ray's (its worker threads, raylet and
object transfers), the gap between it and 2 is the machine's (two cores sharing caches and memory
bandwidth, or one core's two hyperthreads).

The same run measures, without a target, what the issue also asks for:

- records/s through ``feed`` at the defaults, after the reservoirs are full, for lda and logistic:
  JSON lines decoded and offered by one process, against the same lines split between 2 Ray
  shards (each shard decodes its half), handed over by the driver and, closer to a deployment
  whose shards poll their own partitions, taken from Ray's object store where they were put
  before the clock started;
- seconds per private logistic step, one process against 2 Ray shards (a large batch, so that the
  clipped gradients are worth splitting): logistic's step is one matrix product over the batch,
  so Ray's round trip takes a larger share than for lda.

Run: ``OMP_NUM_THREADS=1 python benchmarks/bench_ray.py`` (writes benchmarks/results/bench_ray.json).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import numpy as np

from benchmarks.common import machine, write_result
from stream_vips.core.learner import PrivateLearner
from stream_vips.distributed import RayPool, ShardedLearner
from stream_vips.models.lda import DocumentData
from stream_vips.models.logistic import LogisticData
from stream_vips.service.build import config_from_dict

K, V, N = 50, 5000, 500
M, S = 4000, 1000
REPS, STEPS = 9, 3
TARGET = 1.6
#: The logistic runs: features (with the bias), reservoir and expected batch; records fed per rate.
D_LOG, M_LOG, S_LOG = 100, 200_000, 50_000
FED = {"lda": 20_000, "logistic": 100_000}
#: Lines per consumer per call: runtime.poll_max_records's default, what one poll round hands each.
FEED_BATCH = 5000


def settings(shards: int, vocabulary: list[str]) -> dict:
    return {
        "model": {"family": "lda", "params": {"vocabulary": vocabulary, "n_topics": K, "doc_length": N,
                                              "alpha": 0.1, "seed": 0}},
        **_common(shards, M, S),
    }


def logistic_settings(shards: int) -> dict:
    return {"model": {"family": "logistic", "params": {"dim": D_LOG}}, **_common(shards, M_LOG, S_LOG)}


def _common(shards: int, reservoir: int, batch: int) -> dict:
    return {
        "sampling": {"reservoir": reservoir, "batch_size": batch},
        "schedule": {"every_records": 10**9},
        "privacy": {"epsilon": 10.0, "seed": 1, "ledger": {"type": "memory"}, "planned_steps": 1000},
        "runtime": {"shards": shards},
    }


def concurrent_contributions(cfg_shards: Any, docs: list[dict], steps: int) -> float:
    """Median seconds per step of the two shards' contributions computed at the same time by two
    plain forked processes (no Ray): the machine's own limit on running the shards in parallel."""
    import multiprocessing as mp

    from stream_vips.distributed import LocalPool

    pool = LocalPool(cfg_shards, 2)
    local = ShardedLearner(cfg_shards, pool)
    local.feed([docs[0::2], docs[1::2]])
    state, plans = local.model.state(), local.plan()
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(2), ctx.Queue()

    def work(i: int) -> None:
        shard = pool.members[i]
        shard.contribution(state, plans[i])  # warm
        times = []
        for _ in range(steps):
            barrier.wait()
            started = time.perf_counter()
            shard.contribution(state, plans[i])
            times.append(time.perf_counter() - started)
        out.put(times)

    procs = [ctx.Process(target=work, args=(i,)) for i in range(2)]
    for proc in procs:
        proc.start()
    per_shard = [out.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join()
    local.close()
    pool.close()
    return statistics.median(max(pair) for pair in zip(*per_shard, strict=True))


#: Sizes D (floats per contribution) and shard counts of the driver's cost model.
SIZES = (10_000, 100_000, 250_000, 1_000_000)
COUNTS = (1, 2, 4, 8)


def driver_costs() -> dict[str, Any]:
    """The driver's per-step cost against the contribution's size D and the number of shards N,
    measured and fitted (docs/deploy.md, "Where more shards stop helping"): gathering N
    contributions of D floats from N Ray actors (the round trip, the transfer, the driver's sum)
    as a + N (b + c D), and the one noise draw of D normals. The actors return a stored array
    at once, so only the driver's side and the transport are timed."""
    import ray

    @ray.remote(num_cpus=0)
    class Holder:
        def __init__(self, size: int) -> None:
            self.sums = {"block": np.ones(size)}

        def contribution(self) -> dict[str, np.ndarray]:
            return self.sums

    points = []
    for size in SIZES:
        holders = [Holder.remote(size) for _ in range(max(COUNTS))]
        ray.get([h.contribution.remote() for h in holders])  # started
        for n in COUNTS:
            runs = []
            for _ in range(7):
                started = time.perf_counter()
                total = np.zeros(size)
                for answer in ray.get([h.contribution.remote() for h in holders[:n]]):
                    total = total + np.asarray(answer["block"], dtype=float)
                runs.append(time.perf_counter() - started)
            points.append({"D": size, "N": n, "seconds": statistics.median(runs)})
        for h in holders:
            ray.kill(h)
    A = np.array([[1.0, p["N"], p["N"] * p["D"]] for p in points])
    y = np.array([p["seconds"] for p in points])
    (a, b, c), *_ = np.linalg.lstsq(A, y, rcond=None)
    rng = np.random.default_rng(0)
    noise = {}
    for size in SIZES:
        runs = []
        for _ in range(7):
            started = time.perf_counter()
            rng.standard_normal(size)
            runs.append(time.perf_counter() - started)
        noise[str(size)] = statistics.median(runs)
    worst = max(abs(float(A[i] @ (a, b, c)) - y[i]) / y[i] for i in range(len(y)))
    return {"gather_points": points, "gather_fit": {"a_s": float(a), "b_s_per_shard": float(b),
                                                    "c_s_per_shard_per_float": float(c),
                                                    "worst_relative_error": float(worst)},
            "noise_draw_s": noise}


def records_per_second(feed: Any, lines: list[bytes], per_call: int) -> float:
    """Records per second through ``feed`` (``per_call`` JSON lines a call)."""
    started = time.perf_counter()
    for i in range(0, len(lines), per_call):
        feed(lines[i:i + per_call])
    return len(lines) / (time.perf_counter() - started)


def split(lines: list[bytes]) -> list[list[bytes]]:
    """Records for 2 shards (as partitions p mod 2 would split them)."""
    return [lines[0::2], lines[1::2]]


def rates(one: PrivateLearner, sharded: ShardedLearner, pool: RayPool, lines: list[bytes]) -> dict[str, float]:
    """Records/s of one process and of 2 Ray shards on the same lines (full reservoirs), each
    consumer taking :data:`FEED_BATCH` lines a call, as one poll round gives it: through the
    driver, and from Ray's object store, where the lines were put before the clock started, as a
    broker holds them for shards that poll their own partitions."""
    import ray

    per_round = 2 * FEED_BATCH
    stored = [[ray.put(half) for half in split(lines[i:i + per_round])] for i in range(0, len(lines), per_round)]
    started = time.perf_counter()
    for halves in stored:
        sharded.observe(pool.call("feed", [(half, None) for half in halves], 600.0))
    from_store = len(lines) / (time.perf_counter() - started)
    out = {"one_process": records_per_second(one.feed, lines, FEED_BATCH),
           "ray_2_shards_through_driver": records_per_second(lambda batch: sharded.feed(split(batch)), lines,
                                                             per_round),
           "ray_2_shards_from_object_store": from_store}
    return {**out, "ratio_through_driver": out["ray_2_shards_through_driver"] / out["one_process"],
            "ratio_from_object_store": from_store / out["one_process"]}


def logistic_run() -> dict[str, Any]:
    """Records/s and seconds per step of private logistic regression, one process against 2 Ray shards."""
    data = LogisticData(np.random.default_rng(0), dimension=D_LOG)
    fill, fed = data.records(M_LOG), data.records(FED["logistic"])
    one = PrivateLearner.from_config(config_from_dict(logistic_settings(1), env={}))
    one.feed(fill)
    cfg = config_from_dict(logistic_settings(2), env={})
    pool = RayPool(cfg, 2)
    sharded = ShardedLearner(cfg, pool)
    for i in range(0, M_LOG, 20_000):
        sharded.feed(split(fill[i:i + 20_000]))
    assert one.reservoir.full and sharded.slices.full
    times: dict[str, list[float]] = {"one_process": [], "ray_2_shards": []}
    for _ in range(REPS):
        for name, learner in (("one_process", one), ("ray_2_shards", sharded)):
            started = time.perf_counter()
            for _ in range(STEPS):
                learner.step()
            times[name].append((time.perf_counter() - started) / STEPS)
    assert sharded.engine.event() == one.engine.event()
    median = {k: statistics.median(v) for k, v in times.items()}
    result = {"settings": {"d": D_LOG, "M": M_LOG, "S": S_LOG, "fed": FED["logistic"]},
              "seconds_per_step": median, "all": times,
              "step_speedup": median["one_process"] / median["ray_2_shards"],
              "records_per_second": rates(one, sharded, pool, fed)}
    sharded.close()
    pool.close()
    return result


def main() -> None:
    import ray

    data = DocumentData(np.random.default_rng(0), n_topics=K, vocabulary_size=V, doc_length=N, alpha=0.1)
    docs = [{"tokens": d} for d in data.documents(M)]
    one = PrivateLearner.from_config(config_from_dict(settings(1, data.vocabulary), env={}))
    one.feed(docs)
    fed = data.records(FED["lda"])
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    cfg = config_from_dict(settings(2, data.vocabulary), env={})
    parallel = concurrent_contributions(cfg, docs, REPS * STEPS)
    pool = RayPool(cfg, 2)
    sharded = ShardedLearner(cfg, pool)
    sharded.feed([docs[0::2], docs[1::2]])
    assert one.reservoir.full and sharded.slices.full
    times: dict[str, list[float]] = {"one_process": [], "ray_2_shards": []}
    sharded_release: list[float] = []
    load = [os.getloadavg()[0]]
    for _ in range(REPS):
        started = time.perf_counter()
        for _ in range(STEPS):
            one.step()
        times["one_process"].append((time.perf_counter() - started) / STEPS)
        started = time.perf_counter()
        for _ in range(STEPS):
            sharded.step()
            sharded_release.append(sharded.last_phases["release"])
        times["ray_2_shards"].append((time.perf_counter() - started) / STEPS)
    load.append(os.getloadavg()[0])
    assert sharded.engine.event() == one.engine.event()  # the same release, the same epsilon per step
    median = {k: statistics.median(v) for k, v in times.items()}
    speedup = median["one_process"] / median["ray_2_shards"]
    release = statistics.median(sharded_release)
    ceiling = median["one_process"] / (parallel + release)
    result = {
        "what": "seconds per private LDA step (median of reps), one process vs 2 Ray shards",
        "peer": "PrivateLearner.step() in one process: the same LDA (K, V, N), reservoir M, Poisson rate, "
                "schedule, float64 and decoder, with the noise multiplier calibrated for the same event",
        "why_fair": "both release the same event (same q, M, C and z: privacy rule 14) and run the same "
                    "E-step over the same expected S documents per step; the sharded run only splits it",
        "settings": {"K": K, "V": V, "N": N, "M": M, "S": S, "reps": REPS, "steps_per_rep": STEPS},
        "seconds_per_step": median, "all": times, "speedup": speedup,
        "ceiling": {"what": "the two shards' contributions at the same time in two plain processes (no Ray), "
                            "plus the driver's release: what this machine allows",
                    "concurrent_contributions_s": parallel, "release_s": release, "ceiling_speedup": ceiling},
        "target": TARGET,
        "met": speedup >= TARGET, "load_average_before_after": load, "machine": machine(),
    }
    result["records_per_second"] = {"what": f"JSON lines through feed, {FEED_BATCH} per consumer a call "
                                            "(runtime.poll_max_records's default), reservoirs full, "
                                            "defaults; through the driver (it hands each shard its half) and from "
                                            "Ray's object store (put before the clock, as a broker holds records for "
                                            "shards that poll their own partitions)",
                                    "lda": {"fed": FED["lda"], **rates(one, sharded, pool, fed)}}
    sharded.close()
    pool.close()
    result["logistic"] = logistic_run()
    result["records_per_second"]["logistic"] = result["logistic"].pop("records_per_second")
    result["driver"] = driver_costs()
    ray.shutdown()
    path = write_result("bench_ray", result)
    print(f"one process {median['one_process']:.3f} s/step, 2 Ray shards {median['ray_2_shards']:.3f} s/step: "
          f"{speedup:.2f}x (target {TARGET}x; this machine's ceiling without Ray {ceiling:.2f}x); logistic step "
          f"{result['logistic']['step_speedup']:.2f}x; records/s from the object store lda "
          f"{result['records_per_second']['lda']['ratio_from_object_store']:.2f}x, logistic "
          f"{result['records_per_second']['logistic']['ratio_from_object_store']:.2f}x -> {path}")


if __name__ == "__main__":
    main()
