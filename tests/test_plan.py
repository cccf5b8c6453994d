"""`stream-vips plan`: flags, JSON report, defaults, calibration and clear errors."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stream_vips.cli import plan as plan_mod
from stream_vips.privacy.accountants import PldAccountant, RdpAccountant
from stream_vips.privacy.events import SubsampledGaussianEvent as E

ROOT = Path(__file__).resolve().parents[1]
BASE = ["--batch-size", "50", "--reservoir", "1000", "--steps", "200", "--delta", "1e-5"]


def cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "stream_vips.cli.plan", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)


def run_inprocess(argv: list[str], capsys) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="stream-vips")
    plan_mod.add_parser(parser.add_subparsers(dest="command"))
    code = plan_mod.run(parser.parse_args(["plan", *argv]))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_report_for_a_noise_multiplier():
    res = cli("--sampling", "poisson", *BASE, "--noise-multiplier", "3.2", "--json")
    assert res.returncode == 0, res.stderr
    rep = json.loads(res.stdout)
    assert {"epsilon", "delta", "noise_multiplier", "paper_sigma", "q", "steps", "sampling", "accountant"} <= set(rep)
    assert rep["accountant"] == "pld" and rep["sampling"] == "poisson" and rep["steps"] == 200
    assert rep["q"] == 0.05 and rep["delta"] == 1e-5
    assert rep["noise_multiplier"] == 3.2 and rep["paper_sigma"] == pytest.approx(1.6)
    assert rep["epsilon"] == pytest.approx(PldAccountant().epsilon([E(3.2, 0.05, "poisson", count=200)], 1e-5))
    by = [rep["epsilon_by_steps"][k] for k in sorted(rep["epsilon_by_steps"], key=int)]
    assert by == sorted(by) and by[-1] == rep["epsilon"]


def test_fixed_defaults_to_autodp(capsys):
    code, out, _ = run_inprocess(["--sampling", "fixed", *BASE, "--noise-multiplier", "4", "--json"], capsys)
    assert code == 0
    rep = json.loads(out)
    assert rep["accountant"] == "autodp" and rep["target_epsilon"] is None
    assert rep["epsilon"] == RdpAccountant().epsilon([E(4.0, 0.05, "fixed", count=200)], 1e-5)


def test_calibrates_for_a_target_epsilon(capsys):
    code, out, _ = run_inprocess(["--sampling", "poisson", *BASE, "--epsilon", "1.0", "--json"], capsys)
    assert code == 0
    rep = json.loads(out)
    assert rep["accountant"] == "pld" and rep["target_epsilon"] == 1.0
    z = rep["noise_multiplier"]
    acct = PldAccountant()
    assert acct.epsilon([E(z, 0.05, "poisson", count=200)], 1e-5) == rep["epsilon"] <= 1.0
    assert acct.epsilon([E(0.99 * z, 0.05, "poisson", count=200)], 1e-5) > 1.0
    assert rep["paper_sigma"] == pytest.approx(z / 2)


def test_explicit_accountant_and_human_output(capsys):
    code, out, _ = run_inprocess(["--sampling", "poisson", "--batch-size", "1000", "--reservoir", "1000",
                                  "--steps", "4", "--delta", "1e-5", "--noise-multiplier", "3",
                                  "--accountant", "autodp"], capsys)
    assert code == 0  # q = 1 is a plain Gaussian: autodp can account it
    assert "accountant:       autodp" in out and "paper sigma = z/2 = 1.5" in out
    assert "after 4 steps" in out


@pytest.mark.parametrize("argv, message", [
    (["--sampling", "fixed", *BASE, "--noise-multiplier", "1", "--accountant", "pld"],
     "unsupported sampling/accountant pair: --sampling fixed with --accountant pld: .*without replacement"),
    (["--sampling", "poisson", *BASE, "--noise-multiplier", "1", "--accountant", "autodp"],
     "unsupported sampling/accountant pair: .*add/remove"),
    (["--sampling", "poisson", "--batch-size", "50", "--reservoir", "10", "--steps", "5", "--delta", "1e-5",
      "--noise-multiplier", "1"], "--batch-size 50 exceeds --reservoir 10"),
])
def test_semantic_errors_exit_nonzero_with_a_reason(argv, message, capsys):
    code, out, err = run_inprocess(argv, capsys)
    assert code == 2 and out == ""
    assert re.search(message, err), err


@pytest.mark.parametrize("argv, message", [
    (["--sampling", "poisson", *BASE], "one of the arguments --noise-multiplier --epsilon is required"),
    (["--sampling", "poisson", *BASE, "--noise-multiplier", "1", "--epsilon", "1"], "not allowed with"),
    (["--sampling", "shuffle", *BASE, "--noise-multiplier", "1"], "invalid choice: 'shuffle'"),
    (["--sampling", "poisson", *BASE, "--noise-multiplier", "-1"], "--noise-multiplier: expected a positive"),
    (["--sampling", "poisson", "--batch-size", "50", "--reservoir", "1000", "--steps", "0", "--delta", "1e-5",
      "--noise-multiplier", "1"], "--steps: expected a positive integer"),
    (["--sampling", "poisson", "--batch-size", "50", "--reservoir", "1000", "--steps", "10",
      "--noise-multiplier", "1"], "the following arguments are required: --delta"),
])
def test_bad_arguments_exit_nonzero(argv, message):
    res = cli(*argv)
    assert res.returncode == 2 and res.stdout == ""
    assert message in res.stderr, res.stderr


def test_checkpoints():
    assert plan_mod.checkpoints(1) == [1]
    assert plan_mod.checkpoints(200) == [20, 40, 100, 200]


@pytest.mark.parametrize("argv", [
    ["--steps", "1000000", "--epsilon", "1.0"],      # calibration over 10^6 steps
    ["--steps", "1000000", "--noise-multiplier", "1.0"],  # epsilon ~ 2e4 after 10^6 steps
    ["--steps", "500", "--epsilon", "10000"],        # tiny noise: losses beyond e^-745
])
def test_plans_at_a_million_steps_and_huge_targets(argv, capsys):
    """The runs that took minutes and gigabytes (or a MemoryError) on a fixed 1e-4 PLD grid: the
    report is the accountant's, the calibration meets its target and is tight (time and memory
    are measured by benchmarks/bench_accounting_memory.py)."""
    code, out, err = run_inprocess(["--sampling", "poisson", "--batch-size", "1000", "--reservoir", "10000",
                                    "--delta", "1e-5", *argv, "--json"], capsys)
    assert code == 0, err
    rep = json.loads(out)
    steps, z = rep["steps"], rep["noise_multiplier"]
    assert steps <= rep["accounted_steps"] <= steps * (1 + 1 / 256) + 1
    acct = PldAccountant()
    assert rep["epsilon"] == acct.epsilon([E(z, 0.1, "poisson", count=steps)], 1e-5)
    by = [rep["epsilon_by_steps"][k] for k in sorted(rep["epsilon_by_steps"], key=int)]
    assert by == sorted(by)
    if rep["target_epsilon"] is not None:
        assert rep["epsilon"] <= rep["target_epsilon"]
        assert acct.epsilon([E(z / (1 + 1e-3), 0.1, "poisson", count=steps)], 1e-5) > rep["target_epsilon"]


def test_human_output_says_when_the_epsilon_is_an_upper_bound(capsys):
    code, out, _ = run_inprocess(["--sampling", "poisson", "--batch-size", "100", "--reservoir", "1000",
                                  "--steps", "1000", "--delta", "1e-5", "--noise-multiplier", "2"], capsys)
    assert code == 0
    assert "after 1000 steps (an upper bound: accounted as 1002 steps)" in out
