"""``stream_vips.fit`` (module ``stream_vips.fitting``): settings from public quantities, the whole
budget spent, the baseline, and what the user sees when something is wrong."""

from __future__ import annotations

import importlib
import json
import math

import numpy as np
import pytest
from scipy.stats import norm

from stream_vips import messages
from stream_vips.client import check_message, posterior_from_message
from stream_vips.errors import FitError
from stream_vips.models import MODEL_FAMILIES, dimension
from stream_vips.privacy.accountants import make_accountant
from stream_vips.privacy.calibration import calibrate_noise_multiplier

fitmod = importlib.import_module("stream_vips.fitting")
fitcli = importlib.import_module("stream_vips.cli.fit")
fit, fit_settings = fitmod.fit, fitmod.fit_settings
RTOL = fitmod.CALIBRATION_RTOL


def test_the_public_fit_stays_the_function_after_its_module_is_imported():
    """The module is ``stream_vips.fitting``: importing it (as docs/fit.md does for fit_settings)
    must not shadow ``stream_vips.fit``, the function (it once did, when both were named fit)."""
    import stream_vips

    importlib.import_module("stream_vips.fitting")
    from stream_vips import fit as public_fit

    assert callable(public_fit) and public_fit is stream_vips.fit is fitmod.fit
    assert stream_vips.fitting.fit_settings is fit_settings


def logistic_data(n: int = 600, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = np.hstack([rng.uniform(-0.5, 0.5, (n, 2)), np.full((n, 1), 0.5)])
    y = (X @ np.array([3.0, -2.0, 0.2]) + 0.3 * rng.logistic(size=n) > 0).astype(float)
    return X, y


def linreg_data(n: int = 400, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.uniform(-0.5, 0.5, (n, 3))
    y = np.clip(X @ np.array([0.8, -0.5, 0.3]) + 0.1 * rng.standard_normal(n), -1, 1)
    return X, y


def test_private_fit_spends_the_whole_budget_in_the_planned_steps():
    X, y = logistic_data()
    res = fit((X, y), "logistic", epsilon=0.7, delta=1e-6, seed=3)
    b = res.report["budget"]
    # calibration returns z with eps(z) <= budget < eps(z / (1 + rtol)); locally eps ~ z^-k with
    # k <= 2 for the Gaussian mechanism, so the spent epsilon is at least budget / (1 + rtol)^2
    assert 0.7 / (1 + RTOL) ** 2 <= b["epsilon_spent"] <= 0.7
    assert b["fraction_spent"] == pytest.approx(b["epsilon_spent"] / 0.7)
    assert res.report["steps_taken"] == res.settings.steps == res.message["privacy"]["steps"]
    assert res.message["privacy"]["private"] is True and res.message["privacy"]["seeded"] is True
    assert res.message["privacy"]["q"] == 1.0 and res.message["hyperparameters"]["dataset_size"] == len(y)
    assert set(res.report["why"]) >= {"q", "steps", "block_weights"}


def test_the_noise_multiplier_is_the_projects_calibration_for_the_chosen_steps():
    X, y = linreg_data()
    res = fit((X, y), "linreg", epsilon=1.0, delta=1e-5, seed=0)
    p = res.message["privacy"]
    assert p["accountant"] == res.settings.accountant == "autodp"
    z = calibrate_noise_multiplier(1.0, 1e-5, 1.0, res.settings.steps, "poisson", diameter=p["diameter"], rtol=RTOL,
                                   accountant=make_accountant("autodp", "poisson"))
    assert p["noise_multiplier"] == pytest.approx(z, rel=1e-12)


def gaussian_delta(epsilon: float, mu: float) -> float:
    """Exact delta(epsilon) of mu-GDP: T Gaussian mechanisms with sensitivity D and std z compose
    to one with mu = sqrt(T) D / z (Dong, Roth & Su 2019, Corollary 2.13)."""
    return float(norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * norm.cdf(-epsilon / mu - mu / 2))


@pytest.mark.parametrize("epsilon,delta", [(1.0, 1e-5), (0.5, 1e-6), (4.0, 1e-5)])
def test_logistic_fit_noise_is_the_exact_gaussian_calibration_at_the_models_diameter(epsilon, delta):
    # q = 1: each step is a Gaussian mechanism of sensitivity D (the model's joint diameter for the
    # rule's weights) and std z, so the fit's z must (a) be private by the closed form and (b) be
    # within the calibration tolerance and the RDP conversion slack of the smallest such z
    from scipy.optimize import brentq

    from stream_vips.models.logistic import joint_diameter

    s = fit_settings("logistic", 300, 3, epsilon, delta)  # the s1 release (N < 1000, d < 6), as fitted below
    X, y = logistic_data(300)
    res = fit((X, y), "logistic", epsilon=epsilon, delta=delta, seed=0)
    p = res.message["privacy"]
    D = joint_diameter(s.block_weights["s1"], s.block_weights["s2"])
    assert p["diameter"] == pytest.approx(D, rel=1e-12) and D < 1.45
    z, T = p["noise_multiplier"], s.steps
    assert gaussian_delta(epsilon, math.sqrt(T) * D / z) <= delta
    z_exact = brentq(lambda zz: gaussian_delta(epsilon, math.sqrt(T) * D / zz) - delta, 0.1, 1e3, xtol=1e-10)
    assert z_exact <= z <= z_exact * 1.01
    # the PLD accountant counts replace-one at diameter 2: about 2 / D times more noise
    z_pld = calibrate_noise_multiplier(epsilon, delta, 1.0, T, "poisson", diameter=D, rtol=RTOL,
                                       accountant=make_accountant("pld", "poisson"))
    assert z_pld / z == pytest.approx(2.0 / D, rel=0.01)


def test_non_private_baseline_says_so_with_null_epsilon_and_strict_json():
    X, y = logistic_data()
    res = fit((X, y), "logistic", non_private=True, seed=0)
    p = res.message["privacy"]
    assert p["private"] is False and p["epsilon_spent"] is None and p["epsilon_budget"] is None
    assert p["noise_multiplier"] == 0.0 and p["accountant"] == "none"
    back = check_message(messages.loads(messages.dumps(res.message)))  # infinity would not survive
    assert posterior_from_message(back).epsilon_spent == math.inf
    assert res.report["budget"]["private"] is False


def test_non_private_linreg_fit_is_the_exact_conjugate_posterior():
    # q = 1, one step, rho = 1 and no noise: the natural parameters are the batch posterior's
    X, y = linreg_data()
    res = fit((X, y), "linreg", non_private=True, noise="gamma")
    state = messages.decode_state(res.message)
    np.testing.assert_allclose(state["precision"], np.eye(3) + X.T @ X, rtol=1e-12)
    np.testing.assert_allclose(state["shift"], X.T @ y, rtol=1e-12, atol=1e-12)
    assert float(state["quadratic"]) == pytest.approx(2.0 + y @ y, rel=1e-12)
    assert float(state["shape"]) == pytest.approx(1.0 + len(y) / 2)


def test_private_linreg_is_noisy_and_uses_the_accuracy_allocation():
    from stream_vips.models.linreg import default_block_weights

    X, y = linreg_data()
    res = fit((X, y), "linreg", seed=0, noise="gamma")
    assert res.settings.block_weights == default_block_weights(3, gamma=True)
    exact = np.eye(3) + X.T @ X
    assert not np.allclose(messages.decode_state(res.message)["precision"], exact)


def test_fit_settings_uses_public_quantities_only():
    a = fit_settings("logistic", 1000, 10, 1.0, 1e-5)
    assert a == fit_settings("logistic", 1000, 10, 1.0, 1e-5)
    assert (a.q, a.steps, a.tau0, a.kappa) == (1.0, fitmod.CENTRED_LOGISTIC["steps"], 1.0, fitmod.LOGISTIC_KAPPA)
    assert a.model_params["release"] == "centred"  # N >= CENTRED_MIN_N and d >= CENTRED_MIN_D
    for n, d in ((fitmod.CENTRED_MIN_N - 1, 10), (1000, fitmod.CENTRED_MIN_D - 1)):
        small = fit_settings("logistic", n, d, 1.0, 1e-5)
        assert (small.steps, small.block_weights) == (fitmod.LOGISTIC_STEPS, fitmod.LOGISTIC_WEIGHTS)
        assert "release" not in small.model_params and "s1" in small.why["release"]
    assert a.accountant == fitmod.accountant_for(a.q) == "autodp" and fitmod.accountant_for(0.5) == "pld"
    assert set(fitmod.RULES) == set(fitmod.FAMILIES) == set(MODEL_FAMILIES) - {"ops"}
    assert a.batch_size == 1000
    lin = fit_settings("linreg", 50, 2, 1.0, 1e-5)
    assert (lin.steps, lin.q, lin.tau0, lin.kappa) == (1, 1.0, 1.0, 1.0)
    assert fit_settings("logistic", 1000, 10, None, 1e-5, non_private=True).steps == fitmod.NON_PRIVATE_LOGISTIC_STEPS
    with pytest.raises(ValueError, match="fit refuses the ops family"):
        fit_settings("ops", 100, 3, 1.0, 1e-5)
    with pytest.raises(ValueError, match="epsilon"):
        fit_settings("logistic", 100, 3, math.inf, 1e-5)


def test_every_input_form_gives_the_same_model():
    pd = pytest.importorskip("pandas")
    X, y = logistic_data(300)
    records = [{"x": xi.tolist(), "y": int(yi)} for xi, yi in zip(X, y)]
    frame = pd.DataFrame(X, columns=["a", "b", "c"]).assign(label=y, junk=0.0)
    results = [
        fit((X, y), "logistic", seed=5),
        fit(records, "logistic", seed=5, dim=3),
        fit(iter(records), "logistic", seed=5, dim=3),
        fit([json.dumps(r) for r in records], "logistic", seed=5, dim=3),
        fit(frame, "logistic", seed=5, x_columns=["a", "b", "c"], y_column="label"),
    ]
    first = messages.decode_state(results[0].message)
    for res in results[1:]:
        for k, v in messages.decode_state(res.message).items():
            np.testing.assert_array_equal(v, first[k])


def test_invalid_records_count_in_n_and_an_all_invalid_set_gives_no_model():
    X, y = logistic_data(200)
    records = [{"x": xi.tolist(), "y": int(yi)} for xi, yi in zip(X, y)] + [{"x": [1, 2]}, b"not json"]
    res = fit(records, "logistic", seed=0, dim=3)
    assert res.report["records"] == 202 and res.report["accepted"] == 200
    assert sum(res.report["rejected"].values()) == 2
    assert res.message["hyperparameters"]["dataset_size"] == 202  # N is arrivals, valid or not (public)
    with pytest.raises(ValueError, match="no model"):
        fit([{"x": [1.0, 2.0, 3.0], "y": 7}] * 5, "logistic", seed=0, dim=3)


def test_file_ledger_holds_every_step(tmp_path):
    from stream_vips.privacy.ledger import FileLedger

    X, y = logistic_data(200)
    path = tmp_path / "ledger.jsonl"
    res = fit((X, y), "logistic", seed=0, ledger_path=str(path))
    ledger = FileLedger(str(path))
    try:
        assert len(ledger.events()) == res.settings.steps
        assert ledger.ledger_id == res.message["privacy"]["ledger_id"]
    finally:
        ledger.close()


def test_cli_writes_a_readable_model_and_a_summary(tmp_path, capsys):
    from stream_vips.cli import main

    X, y = logistic_data(300)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"x": xi.tolist(), "y": int(yi)}) + "\n" for xi, yi in zip(X, y)))
    out = tmp_path / "model.json"
    assert main(["fit", "--family", "logistic", "--dim", "3", "--epsilon", "0.5", "--delta", "1e-6", "--seed", "1",
                 "--out", str(out), str(data)]) == 0
    msg = check_message(json.loads(out.read_text()))
    assert 0.5 / (1 + RTOL) ** 2 <= msg["privacy"]["epsilon_spent"] <= 0.5
    assert msg["privacy"]["halted"] is True  # the planned steps spent the budget: a finished model
    err = capsys.readouterr().err
    assert "N = 300" in err and "epsilon spent" in err and "z = " in err
    assert "autodp accountant, diameter" in err and "accounted at" not in err  # q = 1: the proven diameter
    base = tmp_path / "base.json"
    assert main(["fit", "--family", "logistic", "--dim", "3", "--non-private", "--out", str(base), str(data)]) == 0
    baseline = posterior_from_message(check_message(json.loads(base.read_text())))
    assert baseline.private is False and "NON-PRIVATE" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"x": [1, 2, 3], "y": 5}\n')
    assert main(["fit", "--family", "logistic", "--dim", "3", "--out", str(tmp_path / "none.json"), str(empty)]) == 1
    assert not (tmp_path / "none.json").exists()


@pytest.mark.parametrize("family", ["sbn", "sep_bnn"])
def test_family_rules_are_the_families_own_and_account_their_sampling(family):
    """sbn and sep_bnn state their rule in their module (fit_rule); fit takes it as it is, sets the
    family's dimension parameter to d, and accounts subsampled steps with pld."""
    module = importlib.import_module({"sbn": "stream_vips.models.sbn", "sep_bnn": "stream_vips.models.sep.bnn"}[family])
    s = fit_settings(family, 5000, 12, 1.0, 1e-5)
    r = module.fit_rule(5000, 12, 1.0, 1e-5)
    assert (s.q, s.steps, s.tau0, s.kappa) == (r["q"], r["steps"], r["tau0"], r["kappa"])
    field, param = dimension(family)
    assert s.model_params[param] == 12 and field == ("y" if family == "sbn" else "x")
    assert s.accountant == fitmod.accountant_for(s.q) and set(r["why"]) <= set(s.why)
    assert "accountant" in s.why
    assert fit_settings(family, 5000, 12, None, 1e-5, non_private=True).epsilon is None


def test_sep_bnn_fit_spends_the_budget_and_predicts():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(1500, 3))
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1] + 0.1 * rng.standard_normal(1500)
    res = fit((X, y), "sep_bnn", epsilon=1.0, delta=1e-5, seed=2)
    b = res.report["budget"]
    assert 1.0 / (1 + RTOL) ** 2 <= b["epsilon_spent"] <= 1.0
    assert res.report["steps_taken"] == res.settings.steps and res.message["privacy"]["accountant"] == "pld"
    check_message(res.message)


def test_sbn_fit_takes_d_as_n_visible():
    rng = np.random.default_rng(5)
    Y = (rng.random((800, 10)) < 0.3).astype(int)
    res = fit([{"y": row.tolist()} for row in Y], "sbn", epsilon=1.0, delta=1e-5, seed=2, dim=10)
    assert res.settings.d == 10 and res.message["hyperparameters"]["n_visible"] == 10
    assert res.report["steps_taken"] == res.settings.steps
    base = fit([{"y": row.tolist()} for row in Y], "sbn", non_private=True, n_visible=10)
    assert base.message["privacy"]["private"] is False and base.report["budget"]["epsilon_spent"] is None
    # sbn proves diameter sqrt(2), but pld charges a replace-one step at 2: the report says both
    assert res.message["privacy"]["diameter"] == pytest.approx(2**0.5)
    assert "diameter 1.414, accounted at 2" in fitmod.summary(res)
    assert "accounted at 2" in res.report["budget"]["how"]


# ------------------------------------------------------------------ command line: paths and refusals


def test_lda_fit_takes_d_as_the_size_of_its_vocabulary(tmp_path, capsys):
    """lda's d is its vocabulary's size: --param vocabulary (a JSON list, or a file with one word per
    line) is required, --dim may repeat it but not contradict it, and d alone is refused clearly."""
    from stream_vips.models.lda import DocumentData

    data = tmp_path / "docs.jsonl"
    data.write_bytes(b"".join(line + b"\n" for line in DocumentData(np.random.default_rng(0), vocabulary_size=12)
                              .records(200)))
    words = [f"w{i}" for i in range(12)]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    out = str(tmp_path / "m.json")
    for vocabulary in (json.dumps(words), str(tmp_path / "vocab.txt")):
        code, _, err = cli(capsys, "--family", "lda", "--param", f"vocabulary={vocabulary}", "--dim", "12",
                           "--seed", "0", "--out", out, str(data))
        assert code == 0, err
        assert check_message(json.loads((tmp_path / "m.json").read_text()))["hyperparameters"]["vocabulary"] == words
    code, _, err = cli(capsys, "--family", "lda", "--dim", "12", "--out", out, str(data))
    assert code == 2 and ("fit needs the lda vocabulary, whose size is the dimension d: pass --param vocabulary=..."
                          in one_line_refusal(err))
    code, _, err = cli(capsys, "--family", "lda", "--dim", "5", "--param", f"vocabulary={json.dumps(words)}",
                       "--out", out, str(data))
    assert code == 2 and "the dimension is given twice, as 5 and 12" in one_line_refusal(err)
    with pytest.raises(FitError, match="pass vocabulary=..."):
        fit([{"tokens": ["w0"]}], "lda", dim=1)


def write_jsonl(path, n: int = 200) -> list[str]:
    """A logistic data file of n records; returns its lines."""
    X, y = logistic_data(n)
    lines = [json.dumps({"x": xi.tolist(), "y": int(yi)}) for xi, yi in zip(X, y)]
    path.write_text("".join(line + "\n" for line in lines))
    return lines


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    """``stream-vips fit ARGV`` (logistic unless --family is given): exit code, stdout, stderr."""
    from stream_vips.cli import main

    args = ["fit", *argv] if "--family" in argv else ["fit", "--family", "logistic", "--dim", "3", *argv]
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line_refusal(err: str) -> str:
    """The refusal is exactly one stream-vips fit line, no traceback."""
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("stream-vips fit: "), err
    return err.strip()


def assert_nothing_spent(ledger) -> None:
    from stream_vips.privacy.ledger import FileLedger

    if ledger.exists():
        opened = FileLedger(str(ledger))
        try:
            assert opened.events() == []
        finally:
            opened.close()


def test_cli_out_in_a_new_directory_is_created_like_the_ledgers(tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    write_jsonl(data)
    out = tmp_path / "new" / "sub" / "model.json"
    code, _, _ = cli(capsys, "--seed", "0", "--out", str(out), str(data))
    assert code == 0 and check_message(json.loads(out.read_text()))["privacy"]["private"] is True
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.json"]  # no temporary file left


def test_cli_out_that_is_a_directory_is_refused_before_spending(tmp_path, capsys):
    data, ledger = tmp_path / "data.jsonl", tmp_path / "ledger.jsonl"
    write_jsonl(data)
    code, out, err = cli(capsys, "--ledger", str(ledger), "--out", str(tmp_path), str(data))
    assert code == 2 and out == "" and "is a directory" in one_line_refusal(err)
    assert_nothing_spent(ledger)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.jsonl"]


def test_cli_out_dash_is_refused_instead_of_making_a_file_named_dash(tmp_path, capsys, monkeypatch):
    data, ledger = tmp_path / "data.jsonl", tmp_path / "ledger.jsonl"
    write_jsonl(data)
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(capsys, "--ledger", str(ledger), "--out", "-", str(data))
    assert code == 2 and out == "" and "--out - is not supported" in one_line_refusal(err)
    assert_nothing_spent(ledger)
    assert not (tmp_path / "-").exists()


def test_cli_out_that_is_the_data_file_is_refused_and_the_data_kept(tmp_path, capsys):
    data = tmp_path / "copy.jsonl"
    lines = write_jsonl(data)
    before = data.read_bytes()
    code, _, err = cli(capsys, "--out", str(data), str(data))
    assert code == 2 and "data file" in one_line_refusal(err) and data.read_bytes() == before
    (tmp_path / "link.jsonl").symlink_to(data)  # another spelling of the same file
    code, _, err = cli(capsys, "--out", str(tmp_path / "link.jsonl"), str(tmp_path / "." / "copy.jsonl"))
    assert code == 2 and "data file" in one_line_refusal(err) and data.read_bytes() == before
    assert len(lines) == 200


def test_cli_out_that_is_the_ledger_is_refused_and_the_ledger_kept(tmp_path, capsys):
    data, ledger = tmp_path / "data.jsonl", tmp_path / "ledger.jsonl"
    write_jsonl(data)
    assert cli(capsys, "--seed", "0", "--ledger", str(ledger), "--out", str(tmp_path / "m.json"), str(data))[0] == 0
    before = ledger.read_bytes()
    code, _, err = cli(capsys, "--ledger", str(ledger), "--out", str(ledger), str(data))
    assert code == 2 and "--ledger" in one_line_refusal(err) and ledger.read_bytes() == before


def test_cli_out_failing_after_spending_prints_the_model_to_stdout(tmp_path, capsys, monkeypatch):
    import os

    data = tmp_path / "data.jsonl"
    write_jsonl(data)
    out = tmp_path / "model.json"

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    code, stdout, err = cli(capsys, "--seed", "0", "--out", str(out), str(data))
    assert code == fitcli.EXIT_CODES["not_written"] and not out.exists()
    assert check_message(json.loads(stdout))["privacy"]["private"] is True  # the spent budget is not lost
    assert "printed to stdout" in err.splitlines()[0] and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.jsonl"]  # no partial file


# ------------------------------------------------------------------------------ the public dimension


def test_records_need_the_dimension_which_no_record_decides():
    """d is public (replace-one): a short first record must not reject the others, and a missing
    dim is a one-line error naming the keyword (the flag on the command line)."""
    X, y = logistic_data(200)
    records = [{"x": [0.1, 0.2], "y": 1}] + [{"x": xi.tolist(), "y": int(yi)} for xi, yi in zip(X, y)]
    res = fit(records, "logistic", seed=0, dim=3)
    assert res.settings.d == 3 and res.message["hyperparameters"]["dim"] == 3
    assert res.report["accepted"] == 200 and res.report["rejected"] == {"wrong_shape": 1}
    with pytest.raises(ValueError, match=r"pass dim=D .*'x'.*never read from the data"):
        fit(records, "logistic", seed=0)
    with pytest.raises(ValueError, match=r"pass dim=D .*'y'.*n_visible"):
        fit([{"y": [0, 1]}], "sbn", seed=0)
    assert fit(records, "logistic", seed=0, **{"dim": 3}).settings.d == 3  # the family parameter's own name


def test_a_huge_first_record_is_one_rejected_record_not_the_dimension():
    X, y = logistic_data(200)
    huge = {"x": [0.0] * (fitmod.MAX_DIM + 50_000), "y": 1}
    res = fit([huge] + [{"x": xi.tolist(), "y": int(yi)} for xi, yi in zip(X, y)], "logistic", seed=0, dim=3)
    assert res.report["records"] == 201 and res.report["accepted"] == 200 and res.settings.d == 3


def test_the_dimension_is_bounded_and_must_agree_with_the_data_shape():
    X, y = logistic_data(50)
    with pytest.raises(ValueError, match="between 1 and 100,000"):
        fit([{"x": [0.1], "y": 1}], "logistic", dim=fitmod.MAX_DIM + 1)
    with pytest.raises(ValueError, match="positive integer"):
        fit([{"x": [0.1], "y": 1}], "logistic", dim=2.5)
    with pytest.raises(ValueError, match="3 columns"):
        fit((X, y), "logistic", dim=4)
    assert fit((X, y), "logistic", dim=3, seed=0).settings.d == 3  # the schema's d, given or not
    with pytest.raises(ValueError, match="twice"):
        fit([{"y": [0, 1]}], "sbn", dim=2, n_visible=3)


def test_cli_needs_dim_and_keeps_the_param_spellings(tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    write_jsonl(data)
    out = tmp_path / "m.json"
    code, _, err = cli(capsys, "--family", "logistic", "--out", str(out), str(data))
    assert code == 2 and "pass --dim D" in one_line_refusal(err) and not out.exists()
    code, _, _ = cli(capsys, "--family", "logistic", "--param", "dim=3", "--seed", "0", "--out", str(out), str(data))
    assert code == 0 and json.loads(out.read_text())["hyperparameters"]["dim"] == 3
    rng = np.random.default_rng(0)
    sbn = tmp_path / "sbn.jsonl"
    sbn.write_text("".join(json.dumps({"y": row.tolist()}) + "\n" for row in (rng.random((400, 6)) < 0.3).astype(int)))
    for flag in (["--dim", "6"], ["--param", "n_visible=6"], ["--param", "dim=6"]):
        code, _, err = cli(capsys, "--family", "sbn", *flag, "--non-private", "--out", str(out), str(sbn))
        assert code == 0 and json.loads(out.read_text())["hyperparameters"]["n_visible"] == 6, (flag, err)


def test_cli_counts_every_line_blank_or_not(tmp_path, capsys):
    """N is public: replacing a record by a blank line must not change it; the final newline
    ends the last line and is not a record."""
    lines = write_jsonl(tmp_path / "full.jsonl")
    blanked = tmp_path / "blanked.jsonl"
    blanked.write_text("\n".join(lines[:10] + ["", "   "] + lines[12:]))  # no final newline either
    out = tmp_path / "m.json"
    code, _, err = cli(capsys, "--seed", "0", "--out", str(out), str(blanked))
    assert code == 0 and "N = 200 records (198 valid)" in err
    assert json.loads(out.read_text())["hyperparameters"]["dataset_size"] == 200
    assert fitcli.json_lines(b"a\n\nb\n") == [b"a", b"", b"b"] == fitcli.json_lines(b"a\n\nb")


# ------------------------------------------------------------------------------- refusals and reasons


def test_bad_ledger_paths_are_one_line_before_anything_is_spent(tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    write_jsonl(data)
    model = tmp_path / "model.json"
    assert cli(capsys, "--seed", "0", "--out", str(model), str(data))[0] == 0
    kept = {p: p.read_bytes() for p in (data, model)}
    for ledger, says in ((tmp_path, "is a directory"), (data, "not a privacy ledger"), (model, "not a privacy ledger")):
        code, _, err = cli(capsys, "--ledger", str(ledger), "--out", str(tmp_path / "new.json"), str(data))
        assert code == fitcli.EXIT_CODES["ledger"] and says in one_line_refusal(err), err
    assert {p: p.read_bytes() for p in kept} == kept and not (tmp_path / "new.json").exists()
    one_line = tmp_path / "notes.txt"
    one_line.write_bytes(b"a note without a newline")  # opening it as a ledger would cut it as a torn line
    X, y = logistic_data(50)
    with pytest.raises(fitmod.LedgerRefused, match="ledger_path .* not a privacy ledger"):
        fit((X, y), "logistic", ledger_path=str(one_line))
    assert one_line.read_bytes() == b"a note without a newline"


def test_a_locked_ledger_is_refused_with_one_line(tmp_path, capsys):
    from stream_vips.privacy.ledger import FileLedger

    data, ledger = tmp_path / "data.jsonl", tmp_path / "ledger.jsonl"
    write_jsonl(data)
    holder = FileLedger(str(ledger))
    try:
        code, _, err = cli(capsys, "--ledger", str(ledger), "--out", str(tmp_path / "m.json"), str(data))
    finally:
        holder.close()
    assert code == fitcli.EXIT_CODES["ledger"] and "is held by" in one_line_refusal(err)
    assert err.strip().endswith("nothing was spent")


def test_no_model_says_the_real_reason(tmp_path, capsys):
    X, y = logistic_data(200)
    ledger = tmp_path / "ledger.jsonl"
    fit((X, y), "logistic", seed=0, ledger_path=str(ledger))
    with pytest.raises(fitmod.NoModelError, match=r"no model: step \d+ would spend epsilon .* > budget 1") as info:
        fit((X, y), "logistic", seed=0, ledger_path=str(ledger))  # the budget is already spent
    assert "none of the" not in str(info.value)
    half_bad = [{"x": xi.tolist(), "y": int(yi)} for xi, yi in zip(X, y)] + [{"x": [0.1, 0.2]}] * 300
    with pytest.raises(fitmod.NoModelError, match="max_rejected_fraction.*wrong_shape"):
        fit(half_bad, "logistic", dim=3, seed=0)
    with pytest.raises(fitmod.NoModelError, match="none of the 5 records was valid"):
        fit([{"x": [0.1, 0.2, 0.3], "y": 7}] * 5, "logistic", dim=3, non_private=True)
    data = tmp_path / "data.jsonl"
    write_jsonl(data)
    code, _, err = cli(capsys, "--ledger", str(ledger), "--out", str(tmp_path / "m.json"), str(data))
    assert code == 1 and "would spend epsilon" in one_line_refusal(err) and "already holds 2 earlier step(s)" in err
    with pytest.warns(fitmod.FitWarning, match=r"1 of the 2 planned steps ran: step \d would spend"):
        partial = fit((X, y), "logistic", epsilon=2.0, seed=0, ledger_path=str(ledger))  # room for one more step
    assert partial.report["steps_taken"] == 1 and partial.report["budget"]["epsilon_spent"] <= 2.0


def test_every_deliberate_fit_error_is_a_stream_vips_error_and_a_value_error():
    from stream_vips import StreamVipsError

    X, y = logistic_data(50)
    for call in (lambda: fit((X, y), "logistic", epsilon=-1.0), lambda: fit((X, y), "logistic", epsilon=math.nan),
                 lambda: fit((X, y), "logistic", delta=1.5), lambda: fit([], "logistic", dim=3),
                 lambda: fit([{"x": [0.1, 0.2, 0.3], "y": 7}] * 5, "logistic", dim=3, seed=0),
                 lambda: fit((X, y), "lda"), lambda: fit_settings("logistic", 0, 3, 1.0, 1e-5)):
        with pytest.raises(StreamVipsError) as info:
            call()
        assert isinstance(info.value, ValueError), info.value


def test_an_unknown_family_is_the_family_error_first():
    with pytest.raises(ValueError, match=r"settings rule for the families \['linreg', .*\], not 'nope'"):
        fit([{"words": [1, 2]}], "nope")
    with pytest.raises(ValueError, match="fit refuses the ops family: .* uncertified"):
        fit([{"words": [1, 2]}], "ops")


@pytest.mark.parametrize("text", [
    '[{"x": [0.1, 0.2, 0.3], "y": 1}, {"x": [0.2, 0.1, 0.3], "y": 0}]\n',
    '{\n  "x": [0.1, 0.2, 0.3],\n  "y": 1\n}\n',
    "x1,x2,x3,y\n0.1,0.2,0.3,1\n",
])
def test_other_formats_are_told_to_use_json_lines(tmp_path, capsys, text):
    data = tmp_path / "data.json"
    data.write_text(text)
    for dim in ([], ["--dim", "3"]):
        code, _, err = cli(capsys, "--family", "logistic", *dim, "--out", str(tmp_path / "m.json"), str(data))
        assert code == 2 and "fit reads JSON Lines (one JSON object per line)" in one_line_refusal(err)
    with pytest.raises(ValueError, match="JSON Lines"):
        fit(text.splitlines(), "sbn", n_visible=3)


# ------------------------------------------------------------------------------- what the user reads


def test_a_refused_step_is_one_line_on_the_command_line(tmp_path):
    """The service logs a refused step (learner and pipeline); the fit command shows only its own
    line. A subprocess: pytest's log capture would hide the lines that a terminal shows."""
    import subprocess
    import sys
    from pathlib import Path

    X, y = logistic_data(100)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"x": xi.tolist(), "y": int(yi)}) + "\n" for xi, yi in zip(X, y))
                    + '{"x": [0.1, 0.2]}\n' * 150)
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PATH": "/usr/bin:/bin",
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "stream_vips.cli", "fit", "--family", "logistic", "--dim", "3",
                           "--out", str(tmp_path / "m.json"), str(data)], capture_output=True, env=env, timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 1 and "max_rejected_fraction" in one_line_refusal(err)


def test_why_lines_say_which_choices_the_caller_overrode(capsys, tmp_path):
    s = fitmod.overridden(fit_settings("sep_bnn", 1000, 3, 1.0, 1e-5), {"clip": None, "hidden": 7}, "--param")
    assert s.why["clip"] == "set by --param (clip = null); the rule would give clip = 1.0"
    assert s.why["hidden"].startswith("set by --param (hidden = 7); the rule would give hidden = ")
    X, y = logistic_data(200)
    res = fit((X, y), "logistic", seed=0, steps=3, floor_factor=2.0)
    assert res.report["why"]["steps"] == "set by the caller (steps = 3); the rule would give 2"
    assert res.report["why"]["floor_factor"] == ("set by the caller (floor_factor = 2.0); "
                                                 "the rule would give floor_factor = 1.0")
    data = tmp_path / "data.jsonl"
    write_jsonl(data)
    code, _, err = cli(capsys, "--seed", "0", "--param", "floor_factor=2", "--steps", "3", "--out",
                       str(tmp_path / "m.json"), str(data))
    assert code == 0 and ("why floor_factor: set by --param (floor_factor = 2); "
                          "the rule would give floor_factor = 1.0") in err
    assert "why steps: set by --steps (steps = 3); the rule would give 2" in err


def test_many_rejected_records_give_one_warning_with_the_likely_fix(tmp_path, capsys):
    """-1/+1 labels: about half the records are out of range for logistic (0/1). What counts as
    valid does not change; the user is told, once."""
    X, y = logistic_data(300)
    data = tmp_path / "pm.jsonl"
    data.write_text("".join(json.dumps({"x": xi.tolist(), "y": int(2 * yi - 1)}) + "\n" for xi, yi in zip(X, y)))
    code, _, err = cli(capsys, "--seed", "0", "--out", str(tmp_path / "m.json"), str(data))
    rejected = int((y == 0).sum())
    warnings_ = [line for line in err.splitlines() if "warning" in line]
    assert code == 0 and len(warnings_) == 1, err
    assert warnings_[0].startswith(f"stream-vips fit: warning: {rejected} of the 300 records")
    assert "out_of_range" in warnings_[0] and "labels must be 0 or 1" in warnings_[0]
    records = [{"x": xi.tolist(), "y": int(2 * yi - 1)} for xi, yi in zip(X, y)]
    with pytest.warns(fitmod.FitWarning, match="labels must be 0 or 1"):
        res = fit(records, "logistic", dim=3, seed=0)
    assert res.report["accepted"] == 300 - rejected and len(res.report["warnings"]) == 1
    few_bad = records[:280] + [{"x": [0.1, 0.2, 0.3], "y": 5}] * 20  # 6.7%: no warning
    assert fit([{**r, "y": max(r["y"], 0)} for r in few_bad], "logistic", dim=3, seed=0).report["warnings"] == []


@pytest.mark.parametrize("family,data", [("logistic", logistic_data(300)), ("linreg", linreg_data(300))])
def test_the_stated_budget_range_holds_at_a_tiny_epsilon(family, data):
    """At epsilon 1e-6 (below delta) epsilon is steep in z (k = 21.6 where it is 1.1 at epsilon 1),
    so a tolerance of 1e-3 on z left only 0.997 of the budget spent; the fit's tolerance on z is
    scaled by that steepness so that [budget / (1 + rtol)^2, budget] holds at every epsilon."""
    res = fit(data, family, epsilon=1e-6, delta=1e-5, seed=0)
    b = res.report["budget"]
    assert 1e-6 / (1 + RTOL) ** 2 <= b["epsilon_spent"] <= 1e-6
    assert b["calibration_rtol"] == pytest.approx(fitmod.calibration_rtol(1e-6, 1e-5)) and b["calibration_rtol"] < RTOL


def test_the_calibration_steepness_is_the_gaussian_curves():
    """k from the closed form against a finite difference of the exact mu-GDP epsilon(mu)."""
    from scipy.optimize import brentq

    R = RTOL
    for epsilon, delta in [(1e-6, 1e-5), (1e-5, 1e-5), (1.0, 1e-5), (4.0, 1e-6)]:
        mu = brentq(lambda m, epsilon=epsilon, delta=delta: gaussian_delta(epsilon, m) - delta, 1e-9, 50,
                    xtol=1e-15, rtol=1e-13)

        def eps_at(m: float, delta: float = delta) -> float:
            return brentq(lambda e: gaussian_delta(e, m) - delta, 1e-12, 100, xtol=1e-16, rtol=1e-13)

        k = math.log(eps_at(mu * (1 + 1e-4)) / eps_at(mu)) / math.log(1 + 1e-4)
        rtol = fitmod.calibration_rtol(epsilon, delta)
        assert rtol == pytest.approx(min(R, 2 * math.log1p(R) / (1.25 * k)), rel=0.01), (epsilon, k)
        assert (1 + rtol) ** k <= (1 + R) ** 2


def test_sbn_fits_a_numpy_array_of_images():
    """A lone array is the family's vector: images (the ``y`` field) for sbn, with d its columns;
    it was sent as ``x`` and every image was rejected."""
    Y = (np.random.default_rng(7).random((500, 9)) < 0.3).astype(np.uint8)
    with pytest.warns(fitmod.FitWarning, match="sbn_figure8"):  # 500 images of 9 pixels at epsilon 1
        res = fit(Y, "sbn", epsilon=1.0, delta=1e-5, seed=3)
    assert res.report["accepted"] == 500 and res.message["hyperparameters"]["n_visible"] == 9


# ------------------------------------------------------------------- failures after spending keep the model


def test_a_failure_after_spending_keeps_the_last_released_model(tmp_path, capsys, monkeypatch):
    """An error once a step was paid is not bad input: the CLI saves the last released message to
    --out and exits 5 with one line; Python raises SpentError carrying it."""
    import stream_vips.models.posterior

    data, ledger, out = tmp_path / "data.jsonl", tmp_path / "ledger.jsonl", tmp_path / "model.json"
    write_jsonl(data)

    def broken(message):
        raise np.linalg.LinAlgError("Singular matrix")

    monkeypatch.setattr(stream_vips.models.posterior, "posterior_from_message", broken)
    code, stdout, err = cli(capsys, "--seed", "0", "--ledger", str(ledger), "--out", str(out), str(data))
    assert code == fitcli.EXIT_CODES["spent"] == 5 and stdout == ""
    line = one_line_refusal(err)
    assert "LinAlgError: Singular matrix" in line and f"saved to {out}" in line
    assert check_message(json.loads(out.read_text()))["privacy"]["epsilon_spent"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.jsonl", "ledger.jsonl", "model.json"]
    X, y = logistic_data(200)
    with pytest.raises(fitmod.SpentError, match="LinAlgError") as info:
        fit((X, y), "logistic", seed=0)
    assert info.value.message["privacy"]["private"] is True and isinstance(info.value, ValueError)


def test_an_os_error_during_the_run_keeps_the_last_paid_step(tmp_path, capsys, monkeypatch):
    """The ledger write of step 3 of 4 fails (disk full) inside the run: no traceback, exit 5, and
    the saved model is the one of the last paid step (step 2), not the first published version
    (the fit holds versions back until the loop ends): its steps and epsilon are the ledger's."""
    from stream_vips.privacy.accountants import make_accountant
    from stream_vips.privacy.ledger import FileLedger

    original, calls = FileLedger.append_many, []

    def full_at_step_3(self, entries):
        calls.append(len(entries))
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return original(self, entries)

    monkeypatch.setattr(FileLedger, "append_many", full_at_step_3)
    data, ledger, out = tmp_path / "data.jsonl", tmp_path / "ledger.jsonl", tmp_path / "model.json"
    write_jsonl(data)
    code, _, err = cli(capsys, "--seed", "0", "--steps", "4", "--ledger", str(ledger), "--out", str(out), str(data))
    assert code == 5 and "No space left on device" in one_line_refusal(err) and "saved to" in err
    monkeypatch.setattr(FileLedger, "append_many", original)
    p = check_message(json.loads(out.read_text()))["privacy"]
    with FileLedger(str(ledger)) as opened:
        events = opened.events()
    assert p["private"] is True and p["steps"] == len(events) == 2
    paid = make_accountant(p["accountant"], "poisson").epsilon(events, p["delta"])
    assert p["epsilon_spent"] == pytest.approx(paid, rel=1e-9)


def test_a_run_failing_before_any_step_was_paid_says_nothing_was_spent(tmp_path, capsys, monkeypatch):
    """Whether budget was spent is the ledger's step count before and after the run: the first
    ledger write failing pays nothing, so this is an ordinary failure (exit 1), not exit 5."""
    from stream_vips.privacy.ledger import FileLedger

    def disk_full(self, entries):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(FileLedger, "append_many", disk_full)
    data, ledger, out = tmp_path / "data.jsonl", tmp_path / "ledger.jsonl", tmp_path / "model.json"
    write_jsonl(data)
    code, _, err = cli(capsys, "--seed", "0", "--ledger", str(ledger), "--out", str(out), str(data))
    line = one_line_refusal(err)
    assert code == fitcli.EXIT_CODES["no_model"] and "nothing was spent" in line and "budget" not in line
    assert "No space left on device" in line and not out.exists()
    monkeypatch.undo()
    assert_nothing_spent(ledger)


def test_a_non_private_fit_failing_mid_run_does_not_speak_of_budget(tmp_path, capsys, monkeypatch):
    import stream_vips.fitting.api as api

    original = api._run

    def run_then_fail(*args, **kwargs):
        original(*args, **kwargs)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(api, "_run", run_then_fail)
    data, out = tmp_path / "data.jsonl", tmp_path / "model.json"
    write_jsonl(data)
    code, _, err = cli(capsys, "--non-private", "--out", str(out), str(data))
    line = one_line_refusal(err)
    assert code == 5 and "budget" not in line and "non-private fit failed" in line and "saved to" in line
    assert check_message(json.loads(out.read_text()))["privacy"]["steps"] == fitmod.NON_PRIVATE_LOGISTIC_STEPS
    X, y = logistic_data(200)
    with pytest.raises(fitmod.SpentError) as info:
        fit((X, y), "logistic", non_private=True)
    assert "budget" not in str(info.value) and info.value.message is not None


def test_settings_made_for_another_fit_are_refused_before_spending():
    """settings= must not replace the call's budget (epsilon 0.1 spent as 4.0), n, d or privacy."""
    X, y = linreg_data(100)
    good = fit_settings("linreg", 100, 3, 0.1, 1e-6)
    for other, field in ((fit_settings("linreg", 100, 3, 4.0, 1e-6), "epsilon = 4.0"),
                         (fit_settings("linreg", 100, 3, 0.1, 1e-5), "delta = 1e-05"),
                         (fit_settings("linreg", 100, 4, 0.1, 1e-6), "d = 4"),
                         (fit_settings("linreg", 500, 3, 0.1, 1e-6), "n = 500"),
                         (fit_settings("logistic", 100, 3, 0.1, 1e-6), "family = 'logistic'"),
                         (fit_settings("linreg", 100, 3, None, 1e-6, non_private=True), "a non-private fit")):
        with pytest.raises(FitError, match=f"settings= are for {field}") as info:
            fit((X, y), "linreg", epsilon=0.1, delta=1e-6, settings=other, seed=0)
        assert "\n" not in str(info.value)
    res = fit((X, y), "linreg", epsilon=0.1, delta=1e-6, settings=good, seed=0)
    assert res.report["budget"]["epsilon_budget"] == 0.1 and res.message["privacy"]["delta"] == 1e-6


def test_cli_out_that_is_the_data_on_stdin_is_refused_and_the_data_kept(tmp_path, capsys):
    """``fit --out d.jsonl - < d.jsonl`` would overwrite the data it reads."""
    import os

    data = tmp_path / "d.jsonl"
    write_jsonl(data)
    before = data.read_bytes()
    saved = os.dup(0)
    try:
        with open(data, "rb") as fh:
            os.dup2(fh.fileno(), 0)
        code, _, err = cli(capsys, "--out", str(data), "-")
    finally:
        os.dup2(saved, 0)
        os.close(saved)
    assert code == 2 and "data read from stdin" in one_line_refusal(err) and data.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.jsonl"]


def test_cli_out_onto_another_privacy_ledger_is_refused_and_the_ledger_kept(tmp_path, capsys):
    data, ledger, model = tmp_path / "data.jsonl", tmp_path / "old-ledger.jsonl", tmp_path / "m.json"
    write_jsonl(data)
    assert cli(capsys, "--seed", "0", "--ledger", str(ledger), "--out", str(model), str(data))[0] == 0
    before = ledger.read_bytes()
    code, _, err = cli(capsys, "--seed", "0", "--out", str(ledger), str(data))
    assert code == 2 and "is a privacy ledger" in one_line_refusal(err) and ledger.read_bytes() == before
    assert cli(capsys, "--seed", "0", "--out", str(model), str(data))[0] == 0  # a model file is overwritten


def test_cli_out_that_cannot_be_read_is_refused_not_replaced(tmp_path, capsys, monkeypatch):
    """An existing --out whose first line cannot be read may be a ledger (root reads a 0000 file, so
    the unreadable probe is simulated): one line, the file kept, nothing spent."""
    data, ledger = tmp_path / "data.jsonl", tmp_path / "ledger.jsonl"
    write_jsonl(data)
    assert cli(capsys, "--seed", "0", "--ledger", str(ledger), "--out", str(tmp_path / "m.json"), str(data))[0] == 0
    before, inode = ledger.read_bytes(), ledger.stat().st_ino

    def unreadable(path):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(fitcli, "read_first_line", unreadable)
    code, _, err = cli(capsys, "--seed", "0", "--out", str(ledger), str(data))
    assert code == 2 and "cannot be read (Permission denied)" in one_line_refusal(err)
    assert ledger.read_bytes() == before and ledger.stat().st_ino == inode


@pytest.mark.parametrize("damage", ["genesis_checksum", "torn_genesis", "legacy_event"])
def test_cli_out_onto_a_damaged_or_legacy_ledger_is_refused_whether_or_not_its_checksum_passes(
        tmp_path, capsys, damage):
    """A ledger whose genesis fails its checksum (or is torn, or which starts with an event line as
    before geneses) still records spent budget: --out must not replace it."""
    from stream_vips.privacy.events import SubsampledGaussianEvent
    from stream_vips.privacy.ledger import encode_genesis, encode_line, new_genesis

    data, ledger = tmp_path / "data.jsonl", tmp_path / "ledger.jsonl"
    write_jsonl(data)
    event = encode_line(0, SubsampledGaussianEvent(1.0, 1.0, "poisson"))
    genesis = encode_genesis(new_genesis())
    ledger.write_bytes({"genesis_checksum": genesis.replace(b'"ledger_id":"', b'"ledger_id":"0', 1) + event,
                        "torn_genesis": genesis[:30], "legacy_event": event}[damage])
    before = ledger.read_bytes()
    code, _, err = cli(capsys, "--seed", "0", "--out", str(ledger), str(data))
    assert code == 2 and "is a privacy ledger" in one_line_refusal(err) and ledger.read_bytes() == before


def test_the_ledgers_warning_about_a_cut_torn_line_reaches_the_cli_user(tmp_path, capsys):
    """The command line silences the service's refused-step logs, not the ledger's warnings."""
    from stream_vips.privacy.events import SubsampledGaussianEvent
    from stream_vips.privacy.ledger import FileLedger, encode_line

    data, ledger = tmp_path / "data.jsonl", tmp_path / "ledger.jsonl"
    write_jsonl(data)
    FileLedger(str(ledger)).close()
    ledger.write_bytes(ledger.read_bytes() + encode_line(0, SubsampledGaussianEvent(1.0, 1.0, "poisson"))[:20])
    code, _, err = cli(capsys, "--seed", "0", "--ledger", str(ledger), "--out", str(tmp_path / "m.json"), str(data))
    assert code == 0 and err.startswith("stream-vips fit: warning: ledger ") and "torn last line 2" in err


def test_a_ledger_holding_only_a_torn_genesis_is_accepted_and_cut(tmp_path, capsys):
    """A crash while the genesis was written leaves a prefix of it, which opening the ledger cuts:
    the --ledger probe must accept it too (it refused such a file as not a ledger)."""
    from stream_vips.privacy.ledger import FileLedger, encode_genesis, new_genesis

    data, ledger = tmp_path / "data.jsonl", tmp_path / "ledger.jsonl"
    write_jsonl(data)
    ledger.write_bytes(encode_genesis(new_genesis())[:30])
    code, _, err = cli(capsys, "--seed", "0", "--ledger", str(ledger), "--out", str(tmp_path / "m.json"), str(data))
    assert code == 0 and "torn last line 1" in err.splitlines()[0]
    with FileLedger(str(ledger)) as opened:
        assert len(opened.events()) == fitmod.LOGISTIC_STEPS


@pytest.mark.parametrize("param", ["x_bound=[1]", "x_bound=null", "y_bound=\"a\"", "y_bound=-1"])
def test_a_bad_linreg_bound_is_one_line_naming_the_key_before_spending(tmp_path, capsys, param):
    data, ledger = tmp_path / "data.jsonl", tmp_path / "ledger.jsonl"
    X, y = linreg_data(50)
    data.write_text("".join(json.dumps({"x": xi.tolist(), "y": float(yi)}) + "\n" for xi, yi in zip(X, y)))
    code, _, err = cli(capsys, "--family", "linreg", "--dim", "3", "--param", param, "--ledger", str(ledger),
                       "--out", str(tmp_path / "m.json"), str(data))
    assert code == 2 and f"--param: linreg {param.split('=')[0]} must be a positive number" in one_line_refusal(err)
    assert not ledger.exists() and not (tmp_path / "m.json").exists()
    with pytest.raises(FitError, match="x_bound"):
        fit((X, y), "linreg", x_bound=[1])


def test_a_huge_epsilon_is_calibrated_not_an_overflow():
    """e^800 overflows a float: the steepness is computed in log space, and its limit 2 above 1e6."""
    for epsilon in (800.0, 1e5, 1e300):
        rtol = fitmod.calibration_rtol(epsilon, 1e-5)
        assert 2 * math.log1p(RTOL) / (1.25 * 2.002) <= rtol <= 2 * math.log1p(RTOL) / (1.25 * 1.8)
    X, y = linreg_data(100)
    res = fit((X, y), "linreg", epsilon=800.0, seed=0)
    assert 800 / (1 + RTOL) ** 2 <= res.report["budget"]["epsilon_spent"] <= 800


def test_a_refused_or_modelless_fit_leaves_no_directory_it_created_for_out(tmp_path, capsys):
    from stream_vips.privacy.ledger import FileLedger

    data, ledger = tmp_path / "data.jsonl", tmp_path / "ledger.jsonl"
    write_jsonl(data)
    out = tmp_path / "new" / "sub" / "m.json"
    code, _, err = cli(capsys, "--epsilon", "-1", "--out", str(out), str(data))  # refused before reserving
    assert code == 2 and not (tmp_path / "new").exists()
    holder = FileLedger(str(ledger))
    try:  # refused while building the pipeline, after --out was reserved
        code, _, err = cli(capsys, "--ledger", str(ledger), "--out", str(out), str(data))
    finally:
        holder.close()
    assert code == fitcli.EXIT_CODES["ledger"] and not (tmp_path / "new").exists()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"x": [0.1, 0.2, 0.3], "y": 7}\n' * 5)
    code, _, err = cli(capsys, "--out", str(out), str(bad))  # ran, no model
    assert code == 1 and not (tmp_path / "new").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "data.jsonl", "ledger.jsonl"]


def test_out_directories_made_before_a_mkdir_failure_are_removed(tmp_path, capsys):
    """mkdir -p failing partway (a component too long) left the directories it had made."""
    data = tmp_path / "data.jsonl"
    write_jsonl(data)
    code, _, err = cli(capsys, "--out", str(tmp_path / "new" / ("x" * 300) / "m.json"), str(data))
    assert code == 2 and "cannot be written" in one_line_refusal(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.jsonl"]


def test_the_out_rename_is_made_durable_by_fsyncing_its_directory(tmp_path, capsys, monkeypatch):
    import os
    import stat

    data, out = tmp_path / "data.jsonl", tmp_path / "models" / "m.json"
    write_jsonl(data)
    out.parent.mkdir()
    synced, real_fsync = [], os.fsync

    def recording_fsync(fd):
        st = os.fstat(fd)
        synced.append((stat.S_ISDIR(st.st_mode), st.st_ino, os.path.exists(out)))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    assert cli(capsys, "--seed", "0", "--out", str(out), str(data))[0] == 0
    assert (True, out.parent.stat().st_ino, True) in synced  # the directory, after the rename


def test_a_directory_that_cannot_be_synced_still_counts_as_written(tmp_path, capsys, monkeypatch):
    """The file is whole once renamed: a directory fsync the file system refuses is a warning,
    not "cannot write --out" with exit 4 and the model also dumped on stdout."""
    import stream_vips.privacy.ledger as ledger_module

    def refuse(path):
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(ledger_module, "fsync_dir", refuse)
    data, out = tmp_path / "data.jsonl", tmp_path / "m.json"
    write_jsonl(data)
    code, stdout, err = cli(capsys, "--seed", "0", "--out", str(out), str(data))
    assert code == 0 and stdout == "" and "could not be synced" in err
    assert check_message(json.loads(out.read_text()))["privacy"]["private"] is True


@pytest.mark.parametrize("flag", ["--out", "--ledger"])
def test_a_symlink_loop_is_one_line_before_spending(tmp_path, capsys, flag):
    data, a, b = tmp_path / "data.jsonl", tmp_path / "a.json", tmp_path / "b.json"
    write_jsonl(data)
    a.symlink_to(b)
    b.symlink_to(a)
    other = "--ledger" if flag == "--out" else "--out"
    code, _, err = cli(capsys, flag, str(a), other, str(tmp_path / "c.json"), str(data))
    assert code == 2 and f"{flag} {a} cannot be resolved" in one_line_refusal(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json", "data.jsonl"]


def test_cli_out_keeps_an_existing_files_mode_and_a_symlink(tmp_path, capsys):
    import os
    import stat

    data, out = tmp_path / "data.jsonl", tmp_path / "model.json"
    write_jsonl(data)
    out.write_text("old model\n")
    out.chmod(0o600)
    assert cli(capsys, "--seed", "0", "--out", str(out), str(data))[0] == 0
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600 and check_message(json.loads(out.read_text()))
    (tmp_path / "models").mkdir()
    target, link = tmp_path / "models" / "current.json", tmp_path / "link.json"
    target.write_text("old model\n")
    link.symlink_to(target)
    assert cli(capsys, "--seed", "0", "--out", str(link), str(data))[0] == 0
    assert link.is_symlink() and check_message(json.loads(target.read_text()))["privacy"]["private"] is True
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["current.json"]  # no temporary file left


def _bad_shapes():
    pd = pytest.importorskip("pandas")
    secret = "secret-4711"
    frame = pd.DataFrame({"a": [0.1, 0.2], "b": [0.3, 0.4], "y": [0.0, 1.0]})
    return secret, [
        (({"x": [0.1, 0.2, 0.3], "y": 1}, {"x": [0.3, 0.2, 0.1], "y": 0}), {}, "2-tuple"),  # two records
        ((np.zeros((2, 3)), [0.0, secret]), {}, "y is not a numeric array"),
        (pd.DataFrame({"a": [0.1, secret], "b": [0.3, 0.4], "y": [0.0, 1.0]}), {}, "column 'a' is not numeric"),
        (frame, {"x_columns": ["a", "missing"]}, "no column 'missing'"),
        (frame, {"y_column": "label"}, "no column 'label'"),
        (np.array([["0.1", secret, "0.3"]]), {}, "X must be numeric"),
        ((np.zeros(3), np.zeros(3)), {}, "shaped (n, d) and (n,)"),
    ]


def test_data_shape_errors_are_fit_errors_that_never_quote_a_value():
    """docs/fit.md promises FitError for bad input; the shape checks of records.tabular raised
    DataError (and a 2-tuple of records, a non-numeric cell or a missing column a bare TypeError,
    ValueError or KeyError quoting the data)."""
    secret, cases = _bad_shapes()
    for data, kwargs, says in cases:
        with pytest.raises(FitError) as info:
            fit(data, "logistic", dim=3, **kwargs)
        assert says in str(info.value) and secret not in str(info.value) and "\n" not in str(info.value)
        assert info.value.__cause__ is None and info.value.__suppress_context__


@pytest.mark.parametrize("steps", [2.5, True, 0, -1, "2"])
def test_steps_must_be_a_positive_integer(steps):
    X, y = logistic_data(50)
    with pytest.raises(FitError, match=f"steps must be a positive integer, got {steps!r}"):
        fit((X, y), "logistic", steps=steps)


@pytest.mark.parametrize("exc", [ValueError, RuntimeError, MemoryError])
def test_a_failure_rebuilding_the_message_after_spending_is_still_exit_5(tmp_path, capsys, monkeypatch, exc):
    """The accountant failing once 3 steps are paid: rebuilding the learner's message fails again
    in the error path, which exited 2 ("bad input") or said no model had been made. The ledger
    decides that budget was spent, and the last published version is kept."""
    from stream_vips.privacy.budget import BudgetMonitor

    original = BudgetMonitor.spent

    def spent(self):
        if self._steps >= 3:
            raise exc("accountant failed")
        return original(self)

    monkeypatch.setattr(BudgetMonitor, "spent", spent)
    data, ledger, out = tmp_path / "data.jsonl", tmp_path / "ledger.jsonl", tmp_path / "model.json"
    write_jsonl(data)
    code, _, err = cli(capsys, "--seed", "0", "--steps", "6", "--ledger", str(ledger), "--out", str(out), str(data))
    line = one_line_refusal(err)
    assert code == 5 and "accountant failed" in line and "budget was spent" in line
    assert check_message(json.loads(out.read_text()))["privacy"]["private"] is True


def test_a_failed_model_update_after_paying_keeps_the_last_whole_model(tmp_path, capsys, monkeypatch):
    """Step 3's update raises after the ledger paid for it: the learner's model may then mix two
    steps, so the kept model is the last whole published version, and the line says how many
    steps the ledger holds."""
    from stream_vips.models.logistic import BayesianLogisticRegression
    from stream_vips.privacy.ledger import FileLedger

    original, calls = BayesianLogisticRegression.update, []

    def fail_third(self, noisy_mean, rho):
        calls.append(rho)
        if len(calls) == 3:
            raise np.linalg.LinAlgError("Matrix is not positive definite")
        return original(self, noisy_mean, rho)

    monkeypatch.setattr(BayesianLogisticRegression, "update", fail_third)
    data, ledger, out = tmp_path / "data.jsonl", tmp_path / "ledger.jsonl", tmp_path / "model.json"
    write_jsonl(data)
    code, _, err = cli(capsys, "--seed", "0", "--steps", "6", "--ledger", str(ledger), "--out", str(out), str(data))
    line = one_line_refusal(err)
    monkeypatch.undo()
    with FileLedger(str(ledger)) as opened:
        paid = len(opened.events())
    kept = check_message(json.loads(out.read_text()))
    assert code == 5 and paid == 3 and "the last whole one" in line and f"holds {paid} paid steps" in line
    assert kept["privacy"]["steps"] < paid


def test_logistic_release_switch_is_the_validated_one():
    """The constants of the release switch are the ones benchmarks/fit_release_validation.py chose on
    the tuning sets and validated (its criterion met), with the centred candidate of stage D."""
    from pathlib import Path

    result = json.loads((Path(__file__).resolve().parents[1] / "benchmarks/results/fit_release_validation.json")
                        .read_text())
    chosen, cand = result["tuning_rule"]["chosen"], result["tuning_rule"]["centred_candidate"]
    assert (chosen["n0"], chosen["d0"]) == (fitmod.CENTRED_MIN_N, fitmod.CENTRED_MIN_D)
    assert result["met"] and result["paired_diff"] < -2 * result["paired_diff_se"]
    c = fitmod.CENTRED_LOGISTIC
    assert (cand["steps"], cand["residual_clip"], cand["averaged_share"]) == (
        c["steps"], c["residual_clip"], c["averaged_share"])
    assert cand["s2_over_s1"] == c["weights"]["s2"] / c["weights"]["g"]


def test_no_neighbour_of_the_centred_default_beat_it_on_the_tuning_sets():
    """Stage E of benchmarks/fit_rule_evidence.py evaluated the neighbours of the centred release's
    defaults: its reference is CENTRED_LOGISTIC, and no neighbour passed the adoption criterion
    (paired difference below -2 SE), so the defaults stand on their own tuning evidence."""
    from pathlib import Path

    result = json.loads((Path(__file__).resolve().parents[1] / "benchmarks/results/fit_rule_evidence.json")
                        .read_text())
    stage = result["stage_e_centred_neighbours"]
    rule = fitmod.fit_settings("logistic", 5000, 20, 1.0, 1e-5)  # a shape where the rule is centred
    p, w = rule.model_params, rule.block_weights
    assert p["release"] == "centred"
    assert stage["default"] == {"steps": rule.steps, "s2_over_g": w["s2"] / w["g"],
                                "residual_clip": p["residual_clip"],
                                "averaged_share": 1 - p["average_from"] / rule.steps,
                                "step_size": p["step_size"], "floor_factor": p["floor_factor"], "kappa": rule.kappa}
    rows = stage["neighbours"]
    assert len(rows) == 13 and stage["centred_default_holds"]
    assert all(r["paired_diff"] >= -2 * r["paired_diff_se"] and not r["adopt"] for r in rows)
    assert result["rule"] == fitmod.RULE_VERSION


# -- regime warnings: public quantities only, thresholds from the family's benchmark ------------


def test_sbn_warns_in_the_regime_its_benchmark_measured_and_only_there():
    from stream_vips.models import model_class

    sbn = model_class("sbn")
    assert "sbn_figure8.json" in sbn.regime_warning(60_000, 784, 1.0)  # the benchmark's own regime
    assert sbn.regime_warning(60_000, 784, 1.01) is None  # no benchmark measured a larger epsilon
    assert sbn.regime_warning(60_000 + 784, 784, 1.0) is None  # nor more records per pixel
    assert sbn.regime_warning(1_400, 784, 0.5) is not None


def test_lda_warns_in_the_regime_its_benchmark_measured_and_only_there():
    from stream_vips.models import model_class

    lda = model_class("lda")
    assert "lda_eval.json" in lda.regime_warning(2_677, 1_000, 4.0)  # the news corpus at its largest epsilon
    assert lda.regime_warning(2_677, 1_000, 4.01) is None  # no benchmark measured a larger epsilon
    assert lda.regime_warning(2_678, 1_000, 1.0) is None  # nor more documents per word
    assert lda.regime_warning(1_000, 2_000, 0.5) is not None
    for family in ("logistic", "linreg", "sep_probit", "dpvi", "sgld", "sep_mixture"):
        assert model_class(family).regime_warning(100, 1_000, 0.01) is None, family


def test_fit_warns_once_for_a_weak_regime_and_reports_the_line_and_the_movement():
    FitWarning, summary = fitmod.FitWarning, fitmod.api.summary

    Y = (np.random.default_rng(0).random((200, 10)) < 0.3).astype(float)
    with pytest.warns(FitWarning, match="sbn_figure8.json") as caught:
        result = fit(Y, "sbn", epsilon=1.0, seed=0)
    assert sum("sbn_figure8" in str(w.message) for w in caught) == 1
    assert result.report["regime"] == result.report["warnings"][0]
    assert result.report["movement"]["known"] is False  # a network summary has no coefficient means
    base = fit(Y, "sbn", non_private=True, seed=0)  # no noise: the regime does not apply
    assert base.report["regime"] is None
    r = fit(logistic_data(), "logistic", epsilon=1.0, seed=0)
    assert r.report["regime"] is None and r.report["movement"]["known"] is True
    assert "  moved: the posterior mean moved" in summary(r)


def test_the_command_prints_the_regime_warning_and_how_far_the_model_moved(tmp_path, capsys):
    Y = (np.random.default_rng(2).random((200, 10)) < 0.3).astype(int)
    data = tmp_path / "images.jsonl"
    data.write_text("".join(json.dumps({"y": row.tolist()}) + "\n" for row in Y))
    code, _, err = cli(capsys, "--family", "sbn", "--dim", "10", "--epsilon", "1", "--seed", "0",
                       "--out", str(tmp_path / "m.json"), str(data))
    assert code == 0
    assert sum(line.startswith("stream-vips fit: warning: sbn at epsilon 1") for line in err.splitlines()) == 1
    assert "  moved: how far the model moved from its prior cannot be said" in err
    X, y = logistic_data(300)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"x": xi.tolist(), "y": int(yi)}) + "\n" for xi, yi in zip(X, y)))
    code, _, err = cli(capsys, "--seed", "0", "--out", str(tmp_path / "l.json"), str(rows))
    assert code == 0 and "warning" not in err and "  moved: the posterior mean moved" in err
