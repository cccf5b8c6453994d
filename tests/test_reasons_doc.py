"""docs/reasons.md lists every reason code once, and the answers it claims are the ones each door
gives: the same code for NaN and for strings through fit's records and arrays, the learner and the
estimators, and mistyped names with their close match."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from stream_vips import PrivateLearner, fit
from stream_vips.errors import ConfigError, FitError
from stream_vips.models.registry import MODEL_FAMILIES, model_class
from stream_vips.records import REASONS

DOC = Path(__file__).resolve().parents[1] / "docs" / "reasons.md"


def _table() -> dict[str, list[str]]:
    rows = [line for line in DOC.read_text().splitlines() if re.match(r"\| `[a-z_]+` \|", line)]
    return {re.match(r"\| `([a-z_]+)`", r).group(1): [c.strip() for c in r.strip("|").split("|")] for r in rows}


def test_every_reason_code_has_one_row_and_every_hint_a_code():
    table = _table()
    assert sorted(table) == sorted(REASONS)
    assert all(len(cells) == 7 for cells in table.values())
    for family in MODEL_FAMILIES:
        assert set(model_class(family).rejection_hints) <= set(REASONS), family


def _data(n: int = 200) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = rng.uniform(-0.5, 0.5, (n, 3))
    return X, (X[:, 0] > 0).astype(float)


def test_nan_is_non_finite_at_every_door():
    X, y = _data()
    X[:4, 1] = np.nan
    assert _table()["non_finite"][2:] == ["yes", "yes", "yes", "yes", "refused"]
    assert fit((X, y), "logistic", seed=0).report["rejected"] == {"non_finite": 4}
    records = [{"x": row.tolist(), "y": label} for row, label in zip(X, y)]
    assert fit(records, "logistic", dim=3, seed=0).report["rejected"] == {"non_finite": 4}
    learner = PrivateLearner("logistic", dim=3, reservoir=100, batch_size=50)
    with pytest.warns(UserWarning, match="without a released model"):  # too few records for a step: not tested here
        learner.learn_many((X, y))
    assert dict(learner.rejected) == {"non_finite": 4}
    from stream_vips.estimators import PrivateLogisticRegression

    with pytest.raises(FitError, match="^non_finite: X contains NaN or infinity in 4 row"):
        PrivateLogisticRegression().fit(X, y)


def test_strings_are_wrong_type_at_every_door():
    X, y = _data()
    text = X.astype(str)
    with pytest.raises(FitError, match="^wrong_type: "):
        fit((text, y), "logistic")
    with pytest.raises(FitError, match="^wrong_type: "):
        fit((X, y.astype(str)), "logistic")
    pd = pytest.importorskip("pandas")
    with pytest.raises(FitError, match="^wrong_type: DataFrame column 'a'"):
        fit(pd.DataFrame({"a": text[:, 0], "y": y}), "logistic")
    assert fit([{"x": ["0.1", 0.2, 0.3], "y": 1}] * 3 + [{"x": [0.1, 0.2, 0.3], "y": 1}] * 30, "logistic", dim=3,
               seed=0).report["rejected"] == {"wrong_type": 3}
    from stream_vips.estimators import PrivateLinearRegression

    with pytest.raises(FitError, match="^wrong_type: X holds strings"):
        PrivateLinearRegression().fit(text, y)


def test_a_typo_is_named_where_it_belongs():
    with pytest.raises(ConfigError, match=r"^batchsize: neither a learner option nor a logistic model parameter; "
                                          r"did you mean batch_size \(a learner option\)\?$"):
        PrivateLearner("logistic", dim=3, batchsize=10)
    with pytest.raises(ConfigError, match=r"did you mean floor_factor \(a logistic model parameter\)"):
        PrivateLearner("logistic", dim=3, floor_facter=1.0)
    X, y = _data()
    with pytest.raises(FitError, match=r"^batchsize=\.\.\.: .*did you mean batch_size \(a learner option\)"):
        fit((X, y), "logistic", batchsize=10)
    with pytest.raises(FitError, match=r"^batch_size=\.\.\.: batch_size is a learner option, which fit sets"):
        fit((X, y), "logistic", batch_size=10)


def test_logistic_labels_get_the_hint_and_a_new_ledger_is_not_blamed(tmp_path, caplog):
    import logging

    from stream_vips.fitting import FitWarning, NoModelError

    X, y = _data(300)
    with pytest.warns(FitWarning, match=r"logistic labels must be 0 or 1 \(a -1/\+1 label is out of range\)"):
        fit((X, 2 * y - 1), "logistic", seed=0)
    bad = y.copy()
    bad[:200] = 3  # two thirds rejected: no step is taken
    with caplog.at_level(logging.INFO), pytest.raises(NoModelError) as info:
        fit((X, bad), "logistic", seed=0, ledger_path=str(tmp_path / "new.jsonl"))
    assert "logistic labels must be 0 or 1" in str(info.value)
    assert "already holds" not in str(info.value)
    # one line per event: the refusal is raised, not also logged
    assert not [r for r in caplog.records if "halted before spending" in r.getMessage()]
