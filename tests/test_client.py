"""The read side without a broker: posterior reconstruction and the river wrappers."""

from __future__ import annotations

import numpy as np
import pytest
from river import evaluate, metrics

from stream_vips import messages
from stream_vips.client import (
    RiverClassifier,
    RiverRegressor,
    SchemaVersionError,
    check_message,
    posterior_from_message,
)
from stream_vips.models.linreg import LinearRegression
from stream_vips.models.logistic import BayesianLogisticRegression


def _report(steps: int = 1) -> dict:
    return messages.privacy_report(epsilon_spent=0.5, delta=1e-5, epsilon_budget=1.0, accountant="pld",
                                   sampling="poisson", q=0.1, noise_multiplier=2.0, steps=steps,
                                   halted=False, seeded=True)


def _fitted_logistic(X: np.ndarray, y: np.ndarray) -> BayesianLogisticRegression:
    """A logistic model after a few M-steps on exact (non-noisy) means: a stand-in for a release."""
    model = BayesianLogisticRegression(dim=X.shape[1], dataset_size=len(y))
    objs = [{"x": xi.tolist(), "y": int(yi)} for xi, yi in zip(X, y)]
    rows = model.parse_batch(objs).rows
    for _ in range(5):
        sums = model.clipped_sum(rows)
        model.update({k: v / len(y) for k, v in sums.items()}, rho=1.0)
    return model


def test_published_logistic_model_evaluates_with_river_exactly_like_the_model():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 3)) / 2
    y = (X @ np.array([2.0, -1.0, 0.5]) + 0.1 * rng.normal(size=400) > 0).astype(int)
    model = _fitted_logistic(X, y)
    msg = messages.loads(messages.dumps(messages.build_message(
        "clf", "logistic", model.hyperparameters(), 4, model.state(), _report(5))))
    published = posterior_from_message(msg)
    assert published.version == 4 and published.family == "logistic"
    np.testing.assert_allclose(published.model.predict_proba(X), model.predict_proba(X), rtol=1e-12)

    clf = RiverClassifier(published, ["a", "b", "c"])
    stream = [({"a": a, "b": b, "c": c}, bool(t)) for (a, b, c), t in zip(X.tolist(), y)]
    acc = evaluate.progressive_val_score(stream, clf, metrics.Accuracy())
    expected = float(np.mean((model.predict_proba(X) >= 0.5) == y))
    assert acc.get() == pytest.approx(expected, abs=1e-12)
    assert expected > 0.85  # the fitted direction separates this data
    proba = clf.predict_proba_one(stream[0][0])
    assert proba[True] + proba[False] == pytest.approx(1.0)
    with pytest.raises(KeyError, match="features missing"):
        clf.predict_one({"a": 1.0})


def test_regressor_wrapper_returns_the_posterior_predictive_mean():
    model = LinearRegression(dim=2, dataset_size=10)
    model.load_state({"precision": np.array([[4.0, 1.0], [1.0, 3.0]]), "shift": np.array([1.0, -2.0])})
    msg = messages.build_message("r", "linreg", model.hyperparameters(), 0, model.state(), _report())
    reg = RiverRegressor(posterior_from_message(msg), ["u", "v"])
    mean = np.linalg.solve([[4.0, 1.0], [1.0, 3.0]], [1.0, -2.0])
    assert reg.predict_one({"u": 0.3, "v": -0.4}) == pytest.approx(mean @ [0.3, -0.4], rel=1e-12)


def test_schema_version_and_schema_errors_are_named():
    model = LinearRegression(dim=2, dataset_size=10)
    msg = messages.build_message("r", "linreg", model.hyperparameters(), 0, model.state(), _report())
    with pytest.raises(SchemaVersionError, match="schema_version 7"):
        check_message({**msg, "schema_version": 7})
    with pytest.raises(messages.MessageError, match="privacy"):
        check_message({k: v for k, v in msg.items() if k != "privacy"})


def test_client_reads_non_private_messages_with_null_epsilon():
    import math

    model = LinearRegression(dim=2, dataset_size=10)
    report = messages.privacy_report(epsilon_spent=math.inf, delta=1e-5, epsilon_budget=math.inf,
                                     accountant="none", sampling="poisson", q=1.0, noise_multiplier=0.0,
                                     steps=1, halted=False, seeded=True, private=False)
    msg = messages.loads(messages.dumps(messages.build_message("np", "linreg", model.hyperparameters(), 0,
                                                               model.state(), report)))
    published = posterior_from_message(check_message(msg))
    assert published.private is False and published.epsilon_spent == math.inf
    private = posterior_from_message(messages.build_message("p", "linreg", model.hyperparameters(), 0,
                                                            model.state(), _report()))
    assert private.private is True and private.epsilon_spent == 0.5
    legacy = dict(private.message, privacy={k: v for k, v in private.privacy.items() if k != "private"})
    assert posterior_from_message(check_message(legacy)).private is True


class _Whole:
    """Stands in for the Kafka reassembler: every record is a whole message."""

    def add(self, key, value, headers):
        return key, value


class _Record:
    def __init__(self, msg: dict) -> None:
        self.key, self.value, self.headers = "default", messages.dumps(msg), []


def _reader():
    """A ModelReader without a broker (its consumer is never used by ``_handle``/``posterior``)."""
    from stream_vips.client import ModelReader

    reader = ModelReader.__new__(ModelReader)
    reader.topic, reader._reassembler, reader._latest, reader.invalid = "t", _Whole(), {}, []
    return reader


def _linreg_message(version: int) -> dict:
    model = LinearRegression(dim=2, dataset_size=10)
    model.load_state({"precision": np.array([[4.0, 1.0], [1.0, 3.0]]), "shift": np.array([1.0, -2.0])})
    return messages.build_message("default", "linreg", model.hyperparameters(), version, model.state(), _report())


def _array(values, shape=None) -> dict:
    enc = messages.encode_array(np.asarray(values, dtype=float))
    return enc if shape is None else {**enc, "shape": shape}


_MALFORMED = {
    "bytes do not match the shape": lambda m: m["natural_parameters"].update(shift=_array([1, 2], shape=[3])),
    "wrong shape for dim 2": lambda m: m["natural_parameters"].update(shift=_array([1, 2, 3])),
    "NaN in a natural parameter": lambda m: m["natural_parameters"].update(shift=_array([np.nan, 1])),
    "shape [2**32, 2**32] with no data": lambda m: m["natural_parameters"].update(
        shift=_array([], shape=[2**32, 2**32])),
    "an extra natural parameter": lambda m: m["natural_parameters"].update(junk=_array([1])),
    "dim = -1": lambda m: m["hyperparameters"].update(dim=-1),
    "unknown family": lambda m: m.update(family="nope"),
    "private without noise or accountant": lambda m: m["privacy"].update(
        noise_multiplier=0.0, paper_sigma=0.0, accountant="none"),
    "legacy form (no flag, finite epsilon) without noise": lambda m: (
        m["privacy"].pop("private"), m["privacy"].update(noise_multiplier=0.0, paper_sigma=0.0)),
    "epsilon_spent over the budget": lambda m: m["privacy"].update(epsilon_spent=50.0),
}


@pytest.mark.parametrize("case", sorted(_MALFORMED))
def test_reader_counts_and_skips_a_malformed_newer_message_keeping_the_last_good_model(case, caplog):
    reader = _reader()
    assert reader._handle(_Record(_linreg_message(2))) == 1
    bad = _linreg_message(3)
    _MALFORMED[case](bad)
    assert reader._handle(_Record(bad)) == 0
    assert reader.latest()["default"]["version"] == 2 and len(reader.invalid) == 1
    key, reason = reader.invalid[0]
    assert key == "default" and "\n" not in reason and len(reason) <= 300
    data = bad["natural_parameters"]["shift"]["data"]
    # only the reader's own records: a Kafka client thread left by an earlier broker test may log here too
    assert [r.levelname for r in caplog.records if r.name.startswith("stream_vips")] == ["WARNING"]
    assert not data or data not in caplog.text  # logged without raw content
    published = reader.posterior("default")  # still answers, from version 2
    assert published.version == 2 and published.private and published.epsilon_spent == 0.5
    mean, _ = published.model.predictive(np.array([[0.3, -0.4]]))
    assert np.isfinite(mean).all()


@pytest.mark.parametrize("change", [dict(noise_multiplier=0.0, paper_sigma=0.0, accountant="none"),
                                    dict(epsilon_spent=50.0)])
def test_posterior_from_message_refuses_an_unbacked_privacy_claim(change):
    msg = _linreg_message(0)
    msg["privacy"].update(change)
    with pytest.raises(messages.MessageError, match="claims privacy it does not have"):
        posterior_from_message(msg)


def test_reader_skips_a_message_whose_sizes_its_arrays_do_not_back_and_keeps_serving():
    """dim = 10**6 asks the logistic constructor for a 7.3 TiB matrix: MemoryError, which used to
    escape ``_handle`` and stop every reader of the topic (and again after each restart); sizes
    are now checked against the message's arrays before anything is built."""
    model = BayesianLogisticRegression(dim=2, dataset_size=10)
    good = messages.build_message("default", "logistic", model.hyperparameters(), 1, model.state(), _report())
    hostile = messages.build_message("default", "logistic", {**model.hyperparameters(), "dim": 10**6}, 2,
                                     model.state(), _report())
    reader = _reader()
    assert reader._handle(_Record(good)) == 1 and reader._handle(_Record(hostile)) == 0
    assert "natural parameter 'h' has shape [2], but the hyperparameters give [1000000]" in reader.invalid[0][1]
    assert reader.posterior("default").version == 1


SIZES = ("dim", "hidden", "n_latent", "n_visible", "n_components", "n_topics")


def test_every_family_states_the_shapes_its_state_has():
    """``state_shapes`` is what a reader checks a message against before building the model."""
    from stream_vips.models import model_class
    from test_records import FAMILY_PARAMS

    variants = [(family, params) for family, params in FAMILY_PARAMS.items()]
    variants += [("linreg", {"dim": 2, "noise": "gamma"}), ("sep_probit", {"dim": 2, "clip": 1.0, "intercept": False}),
                 ("sbn", {"n_visible": 2, "n_latent": 2, "dtype": "float32"})]
    for family, params in variants:
        cls = model_class(family)
        for scale in (1, 3):
            sized = {k: v * scale if k in SIZES else v for k, v in params.items()}
            model = cls(dataset_size=100, **sized)
            shapes = cls.state_shapes(model.hyperparameters())
            assert set(shapes) == set(model.state()), family
            for name, arr in model.state().items():
                assert len(shapes[name]) == arr.ndim and all(
                    n is None or n == m for n, m in zip(shapes[name], arr.shape)), (family, name)


def test_hostile_sizes_are_refused_before_anything_is_allocated():
    """n_latent 40000 in a small sbn message made the reader allocate 14 GB before load_state
    refused it (an OOM kill under a container limit); every size hyperparameter of every family,
    set far above what the message's arrays hold, is refused with little memory used."""
    import tracemalloc

    from stream_vips.models import model_class
    from test_records import FAMILY_PARAMS

    for family, params in FAMILY_PARAMS.items():
        model = model_class(family)(dataset_size=100, **params)
        for size in [k for k in model.hyperparameters() if k in SIZES]:
            msg = messages.build_message("m", family, {**model.hyperparameters(), size: 40_000}, 1, model.state(),
                                         _report())
            tracemalloc.start()
            with pytest.raises(messages.MessageError, match="hyperparameters give"):
                posterior_from_message(msg)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            assert peak < 5_000_000, (family, size, peak)


def test_sizes_the_arrays_do_not_show_are_refused_too():
    """sgld's ``keep`` rows were filled by broadcasting one sent row (3 GB resident from a few
    hundred bytes), an lda vocabulary given as a path made the reader open it, and an extra
    array counted as carried elements."""
    from stream_vips.models.baselines.sgld import DPSGLD
    from stream_vips.models.lda import LDA

    sgld = DPSGLD(dim=2, dataset_size=100, step_size=0.01)
    state = {**sgld.state(), "counters": np.array([0.0, 1e9])}
    hostile = messages.build_message("m", "sgld", {**sgld.hyperparameters(), "keep": 10**8}, 1, state, _report())
    with pytest.raises(ValueError, match="holds 1 samples but counts 1000000000"):
        posterior_from_message(hostile)
    lda = LDA(vocabulary=["apple", "pear"], dataset_size=100, doc_length=4, n_topics=1)
    path = messages.build_message("m", "lda", {**lda.hyperparameters(), "vocabulary": "/dev/zero"}, 1,
                                  {"lambda": np.ones((1, 9))}, _report())
    with pytest.raises(messages.MessageError, match="vocabulary must be a list of words"):
        posterior_from_message(path)
    extra = messages.build_message("m", "lda", lda.hyperparameters(), 1, {**lda.state(), "junk": np.ones(5)},
                                   _report())
    with pytest.raises(messages.MessageError, match=r"natural parameters \['junk'\] are not the family's"):
        posterior_from_message(extra)


def test_an_sgld_message_with_a_huge_keep_is_read_with_memory_for_the_rows_it_holds():
    """``keep`` bounds how many samples are kept; a 1 KB message with keep = 10**9 reserved room
    for 10**9 rows (47 GB of address space) although it held one."""
    import tracemalloc

    from stream_vips.models.baselines.sgld import DPSGLD

    sgld = DPSGLD(dim=3, dataset_size=100, step_size=0.01)
    for _ in range(3):
        sgld.update({"grad": np.full(3, 0.01)}, rho=1.0)
    msg = messages.build_message("m", "sgld", {**sgld.hyperparameters(), "keep": 10**9}, 1, sgld.state(), _report())
    tracemalloc.start()
    published = posterior_from_message(msg)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1_000_000 and published.model.samples().shape == (3, 3)
    published.model.update({"grad": np.zeros(3)}, rho=1.0)  # keeps sampling after the restore
    assert published.model.samples().shape == (4, 3)
