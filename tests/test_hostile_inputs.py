"""Hostile inputs to ``fit``, ``inspect`` and ``report``: each ends in a clear one-line refusal (or a
rejected record), quickly, with nothing spent and no traceback."""

from __future__ import annotations

import contextlib
import importlib
import json
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from stream_vips.cli import main
from stream_vips.cli.report import dead_letter_counts
from stream_vips.errors import FitError
from stream_vips.privacy.accountants import make_accountant
from stream_vips.privacy.calibration import MIN_CALIBRATION_RTOL, calibrate_noise_multiplier

fitmod = importlib.import_module("stream_vips.fitting")
fitcli = importlib.import_module("stream_vips.cli.fit")


@contextlib.contextmanager
def within(seconds: float) -> Iterator[None]:
    """Fail (instead of hanging the suite) when the block runs longer than ``seconds``."""
    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"did not finish within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def linreg_file(path: Path, n: int = 20) -> Path:
    rng = np.random.default_rng(0)
    path.write_text("".join(json.dumps({"x": rng.uniform(-1, 1, 2).tolist(), "y": float(rng.uniform(-1, 1))}) + "\n"
                            for _ in range(n)))
    return path


# --- 1. a calibration tolerance below double precision -------------------------------------------

@pytest.mark.parametrize("rtol", [1e-300, 1e-17, MIN_CALIBRATION_RTOL / 2])
def test_calibration_refuses_a_tolerance_finer_than_doubles(rtol):
    with within(5), pytest.raises(ValueError, match="rtol"):
        calibrate_noise_multiplier(1.0, 1e-5, 1.0, 1, "fixed", accountant=make_accountant("autodp", "fixed"), rtol=rtol)


def test_calibration_at_the_smallest_tolerance_ends_and_brackets_the_root():
    acct = make_accountant("autodp", "fixed")
    with within(5):
        z = calibrate_noise_multiplier(0.3, 1e-5, 1.0, 2, "fixed", accountant=acct, rtol=MIN_CALIBRATION_RTOL)

    def eps(v: float) -> float:
        from stream_vips.privacy.events import SubsampledGaussianEvent

        return acct.epsilon([SubsampledGaussianEvent(v, 1.0, "fixed", "replace_one", 2.0, count=2)], 1e-5)
    assert eps(z) <= 0.3 < eps(z / (1 + 2 * MIN_CALIBRATION_RTOL))


@pytest.mark.parametrize("epsilon", ["1e-20", "1e-300"])
def test_fit_refuses_an_epsilon_too_small_to_calibrate(tmp_path, capsys, epsilon):
    data = linreg_file(tmp_path / "d.jsonl")
    out, ledger = tmp_path / "m.json", tmp_path / "ledger.jsonl"
    with within(5):
        code = main(["fit", "--family", "linreg", "--dim", "2", "--seed", "0", "--epsilon", epsilon,
                     "--ledger", str(ledger), "--out", str(out), str(data)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert "--epsilon" in err and "smallest budget" in err
    assert not out.exists() and not (ledger.exists() and ledger.read_text().strip())  # nothing spent
    smallest = float(err.rsplit(" ", 1)[1])
    assert fitmod.calibration_rtol(smallest, 1e-5) >= MIN_CALIBRATION_RTOL  # the stated budget is supported
    assert fitmod.calibration_rtol(smallest / 1.1, 1e-5) < MIN_CALIBRATION_RTOL  # and close to the smallest


def test_python_fit_names_epsilon_for_a_too_small_budget():
    X = np.zeros((5, 2))
    with within(5), pytest.raises(FitError, match=r"^epsilon 1e-20 is too small.*smallest budget"):
        fitmod.fit((X, np.zeros(5)), "linreg", epsilon=1e-20, delta=1e-5)


# --- 2. JSON nested deeper than the parser's stack -----------------------------------------------

DEEP = '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}"


def test_fit_rejects_a_deeply_nested_record_like_a_malformed_one(tmp_path, capsys):
    data = linreg_file(tmp_path / "d.jsonl", n=40)
    data.write_text(DEEP + "\n" + data.read_text())
    out = tmp_path / "m.json"
    assert main(["fit", "--family", "linreg", "--dim", "2", "--seed", "0", "--out", str(out), str(data)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    assert json.loads(out.read_text())["privacy"]["epsilon_spent"] > 0


def test_fit_refuses_data_of_deeply_nested_lines_only(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text((DEEP + "\n") * 2)
    out = tmp_path / "m.json"
    assert main(["fit", "--family", "linreg", "--dim", "2", "--seed", "0", "--out", str(out), str(data)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no record is a JSON object" in err and not out.exists()


def test_a_deeply_nested_param_is_taken_as_text(tmp_path, capsys):
    data = linreg_file(tmp_path / "d.jsonl")
    code = main(["fit", "--family", "linreg", "--dim", "2", "--param", "x_bound=" + "[" * 100_000,
                 "--out", str(tmp_path / "m.json"), str(data)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> dict[str, Path]:
    """A model message and its ledger from a small private fit."""
    tmp = tmp_path_factory.mktemp("fitted")
    rng = np.random.default_rng(0)
    X = rng.uniform(-0.5, 0.5, (200, 2))
    res = fitmod.fit((X, X @ np.array([1.0, -1.0])), "linreg", epsilon=1.0, delta=1e-5, seed=0,
                     ledger_path=str(tmp / "ledger.jsonl"))
    (tmp / "model.json").write_text(json.dumps(res.message))
    return {"ledger": tmp / "ledger.jsonl", "model": tmp / "model.json"}


@pytest.mark.parametrize("order", ["deep_last", "deep_first"])
def test_inspect_skips_a_deeply_nested_line(fitted, tmp_path, capsys, order):
    good = fitted["model"].read_text()
    lines = [good, DEEP] if order == "deep_last" else [DEEP, good]
    path = tmp_path / "models.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert main(["inspect", "--file", str(path)]) == 0
    err = capsys.readouterr().err
    assert "skipped 1 invalid line" in err and "nested too deeply" in err and "Traceback" not in err


def test_inspect_of_only_a_deeply_nested_line_finds_no_model(tmp_path, capsys):
    path = tmp_path / "models.jsonl"
    path.write_text(DEEP + "\n")
    assert main(["inspect", "--file", str(path)]) == 1
    assert "no model" in capsys.readouterr().err


def test_report_skips_deeply_nested_model_and_dead_letter_lines(fitted, tmp_path, capsys):
    models, dead = tmp_path / "models.jsonl", tmp_path / "dead.jsonl"
    models.write_text(fitted["model"].read_text() + "\n" + DEEP + "\n")
    dead.write_text(DEEP + "\n" + json.dumps({"reason": "invalid_json"}) + "\n")
    code = main(["report", "--ledger", str(fitted["ledger"]), "--models", str(models), "--dead-letters", str(dead),
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "Traceback" not in err and (tmp_path / "out" / "report.html").exists()
    assert sorted(dead_letter_counts(dead)) == ["(unreadable)", "invalid_json"]


# --- 3. Python data that orjson or numpy refuse --------------------------------------------------

def good_records(n: int = 60) -> list[dict]:
    rng = np.random.default_rng(1)
    return [{"x": rng.uniform(-0.5, 0.5, 2).tolist(), "y": float(rng.uniform(-1, 1))} for _ in range(n)]

def good_records_array(n: int) -> list[list[float]]:
    return [r["x"] for r in good_records(n)]


def test_records_orjson_refuses_are_rejected_one_by_one_not_the_whole_fit():
    """Under replace-one adjacency one hostile record must not decide whether the fit runs: each
    is rejected and counted like a malformed line of a file."""
    hostile = [{"x": {1.0, 2.0}, "y": 0.5},            # a set: not JSON at all
               {"x": [10**30, 1.0], "y": 0.5},           # an int beyond 64 bits
               {"x": [0.1, 0.2], "y": 0.5, 1: "key"},    # a non-string key (json writes it as "1")
               {"x": [0.1, 0.2], "y": 0.5, "note": "\ud800"},  # a lone surrogate
               '{"x": [0.1, 0.2], "y": 0.5, "note": "\ud800"}']  # the same as a line
    res = fitmod.fit(good_records() + hostile, "linreg", dim=2, epsilon=1.0, seed=0)
    assert res.report["records"] == 65
    assert res.report["rejected"] == {"invalid_json": 1, "out_of_range": 1}  # the set; the int beyond x_bound
    assert res.message["privacy"]["epsilon_spent"] > 0


def test_an_unencodable_record_becomes_a_line_naming_no_value():
    assert fitmod.encode_records([{"x": {"SECRET"}}])[0] == [fitmod.UNENCODABLE_RECORD]
    assert b"SECRET" not in fitmod.UNENCODABLE_RECORD


@pytest.mark.parametrize("data", [None, 5, 2.5])
def test_data_that_is_not_a_collection_is_a_fit_error(data):
    with pytest.raises(FitError, match=f"not {type(data).__name__}$"):
        fitmod.fit(data, "linreg", dim=2, seed=0)


def test_an_integer_beyond_doubles_in_an_object_array_rejects_its_row_only():
    X = np.array(good_records_array(60), dtype=object)
    X[0, 1] = 10**400
    X[1, 0] = -(10**400)
    res = fitmod.fit((X, np.full(60, 0.5)), "linreg", epsilon=1.0, seed=0)
    assert res.report["records"] == 60 and sum(res.report["rejected"].values()) == 2
    images = np.random.default_rng(2).integers(0, 2, (60, 4)).astype(object)
    images[0, 0] = 10**400
    res = fitmod.fit(images, "sbn", epsilon=1.0, seed=0, steps=1)
    assert res.report["records"] == 60 and sum(res.report["rejected"].values()) == 1


def test_an_integer_beyond_doubles_in_a_dataframe_rejects_its_row_only():
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"a": pd.Series([10**400] + [0.5] * 59, dtype=object),
                       "b": np.linspace(-1, 1, 60), "y": np.full(60, 0.5)})
    res = fitmod.fit(df, "linreg", epsilon=1.0, seed=0)
    assert res.report["records"] == 60 and sum(res.report["rejected"].values()) == 1


def test_complex_data_is_refused_not_truncated_to_its_real_part():
    pd = pytest.importorskip("pandas")
    X = np.ones((50, 2)) * (0.5 + 0.5j)
    with pytest.raises(FitError, match="X is not a numeric array"):
        fitmod.fit((X, np.ones(50)), "linreg", seed=0)
    with pytest.raises(FitError, match="X must be numeric, got an array of kind 'c'"):
        fitmod.fit(X, "sbn", seed=0)
    df = pd.DataFrame({"a": X[:, 0], "b": np.ones(50), "y": np.ones(50)})
    with pytest.raises(FitError, match="DataFrame column 'a' is not numeric"):
        fitmod.fit(df, "linreg", seed=0)
