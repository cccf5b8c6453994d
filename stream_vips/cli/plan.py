"""``stream-vips plan``: how much privacy a run spends, before it runs.

Given the sampling scheme, batch size S, reservoir capacity M (q = S/M), number of steps T and
delta, prints epsilon for a noise multiplier z (z = noise std / C, privacy rule 2 in
docs/privacy.md), or the smallest z whose epsilon meets a target, with epsilon after a few step
counts. The accounting is the pipeline's own (``stream_vips.privacy.accountants``): pld for
Poisson, autodp for fixed-size unless ``--accountant`` says otherwise; guarantees are under
replace-one adjacency (privacy rule 1). Every epsilon printed is what the budget monitor will
report after that many steps: with pld an upper bound that is exact at a grid of step counts
(``accounted_steps``, at most 1/256 above the count asked for). Time and memory do not grow with
the number of steps or the target: the PLD grid follows epsilon. The privacy unit is a record
(``--unit record``) or a key, i.e. all records of one person (``--unit key``, privacy rule 12:
S and M then count keys and key slots, and a key keeps at most ``--max-records-per-key``
records); the report shows what record-level privacy gives a person with k records (group
privacy: about k times epsilon). Epsilon does not depend on the number of shards
(``--shards``, ``runtime.shards``): the driver releases one noisy sum over the union of the
shards' slices, with the same q, M, C and z (privacy rule 14).

    stream-vips plan --sampling poisson --batch-size 1000 --reservoir 10000 --steps 200 \\
        --delta 1e-5 --epsilon 1.0 --json
"""

from __future__ import annotations

import argparse
import json
import math
import sys

PROG = "stream-vips plan"


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text!r}")
    return value


def _probability(text: str) -> float:
    value = _positive_float(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"expected a probability in (0, 1), got {text!r}")
    return value


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``plan`` subcommand on an ``add_subparsers()`` object."""
    from stream_vips.cli import plain  # the module docstring without its RST markup

    p = subparsers.add_parser(
        "plan", help="epsilon for a noise multiplier, or the noise multiplier for a target epsilon",
        description=plain(__doc__.split("\n\n")[1]), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--sampling", required=True, choices=("poisson", "fixed"),
                   help="minibatch sampling: poisson (rate q) or fixed-size without replacement")
    p.add_argument("--batch-size", required=True, type=_positive_int, metavar="S",
                   help="batch size (expected batch size for poisson)")
    p.add_argument("--reservoir", required=True, type=_positive_int, metavar="M",
                   help="reservoir capacity; the sampling rate is q = S/M")
    p.add_argument("--steps", required=True, type=_positive_int, metavar="T", help="number of updates")
    p.add_argument("--delta", required=True, type=_probability, metavar="D", help="target delta")
    knob = p.add_mutually_exclusive_group(required=True)
    knob.add_argument("--noise-multiplier", type=_positive_float, metavar="Z",
                      help="noise std / C; prints the epsilon it spends")
    knob.add_argument("--epsilon", type=_positive_float, metavar="E",
                      help="target epsilon; prints the calibrated noise multiplier")
    p.add_argument("--unit", choices=("record", "key"), default="record",
                   help="privacy unit: one record, or one key (all records of one person)")
    p.add_argument("--max-records-per-key", type=_positive_int, default=None, metavar="K",
                   help="with --unit key: most records of one key in the reservoir (default 1)")
    p.add_argument("--shards", type=_positive_int, default=1, metavar="N",
                   help="shards of a sharded run (runtime.shards); epsilon is the same for every N")
    p.add_argument("--accountant", choices=("pld", "autodp"), default=None,
                   help="default: pld for poisson, autodp for fixed")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def checkpoints(steps: int) -> list[int]:
    """A few step counts up to (and including) ``steps`` to show how epsilon grows."""
    return sorted({max(1, steps * k // 10) for k in (1, 2, 5)} | {steps})


def group_privacy(epsilon: float, delta: float, sizes: list[int]) -> list[dict]:
    """What an (epsilon, delta) record-level guarantee gives a group of k records (one person's):
    (k epsilon, k e^((k - 1) epsilon) delta), the standard group-privacy bound.

    >>> [(g["records"], g["epsilon"]) for g in group_privacy(0.5, 1e-6, [1, 4])]
    [(1, 0.5), (4, 2.0)]
    """
    out = []
    for k in sizes:
        with_delta = k * math.exp(min((k - 1) * epsilon, 700.0)) * delta
        out.append({"records": k, "epsilon": k * epsilon, "delta": min(with_delta, 1.0), "vacuous": with_delta >= 1.0})
    return out


def plan(sampling: str, batch_size: int, reservoir: int, steps: int, delta: float,
         noise_multiplier: float | None = None, epsilon: float | None = None,
         accountant: str | None = None, unit: str = "record", max_records_per_key: int | None = None,
         shards: int = 1) -> dict:
    """The planning report as a dict (what ``--json`` prints)."""
    from stream_vips.privacy.accountants import UnsupportedEvent, make_accountant
    from stream_vips.privacy.calibration import calibrate_noise_multiplier
    from stream_vips.privacy.events import SubsampledGaussianEvent

    if batch_size > reservoir:
        raise ValueError(f"--batch-size {batch_size} exceeds --reservoir {reservoir} (q = S/M must be <= 1)")
    if shards > reservoir:
        raise ValueError(f"--shards {shards} exceeds --reservoir {reservoir} (every shard holds a slice of M)")
    if (noise_multiplier is None) == (epsilon is None):
        raise ValueError("give exactly one of --noise-multiplier and --epsilon")
    if unit not in ("record", "key"):
        raise ValueError(f"--unit must be record or key, got {unit!r}")
    if unit == "record" and max_records_per_key is not None:
        raise ValueError("--max-records-per-key needs --unit key")
    per_key = (max_records_per_key or 1) if unit == "key" else None
    q = batch_size / reservoir
    acct = make_accountant(accountant or "auto", sampling)
    why = acct.why_unsupported(SubsampledGaussianEvent(1.0, q, sampling))
    if why is not None:
        raise UnsupportedEvent(f"--sampling {sampling} with --accountant {acct.name}: {why}")
    z = noise_multiplier
    if z is None:
        z = calibrate_noise_multiplier(epsilon, delta, q, steps, sampling, accountant=acct)
    event = SubsampledGaussianEvent(z, q, sampling)
    by_steps = {t: acct.epsilon([event.with_count(t)], delta) for t in checkpoints(steps)}
    grid = getattr(acct, "grid", None)
    sizes = sorted({2, 10, 100} | ({per_key} if per_key and per_key > 1 else set()))
    return {
        "unit": unit, **({"max_records_per_key": per_key} if per_key else {}),
        "group_privacy": group_privacy(by_steps[steps], delta, sizes),
        "epsilon": by_steps[steps], "delta": delta, "noise_multiplier": z, "paper_sigma": event.paper_sigma,
        "q": q, "steps": steps, "accounted_steps": grid(steps) if grid is not None else steps,
        "sampling": sampling, "accountant": acct.name,
        "adjacency": event.adjacency, "batch_size": batch_size, "reservoir": reservoir,
        "target_epsilon": epsilon, "epsilon_by_steps": {str(t): e for t, e in by_steps.items()},
        # the sharded release is the one-process mechanism (privacy rule 14): nothing above reads N
        "shards": shards, "epsilon_depends_on_shards": False,
    }


def _render(report: dict) -> str:
    mode = (f"calibrated for epsilon <= {report['target_epsilon']:g}" if report["target_epsilon"] is not None
            else "given")
    lines = [
        f"sampling:         {report['sampling']}, q = S/M = {report['batch_size']}/{report['reservoir']}"
        f" = {report['q']:.6g}",
        f"accountant:       {report['accountant']} ({report['adjacency']} adjacency), delta = {report['delta']:g}",
        f"noise multiplier: z = {report['noise_multiplier']:.6g} ({mode}); paper sigma = z/2 = "
        f"{report['paper_sigma']:.6g}",
        f"epsilon:          {report['epsilon']:.6g} after {report['steps']} steps"
        + (f" (an upper bound: accounted as {report['accounted_steps']} steps)"
           if report["accounted_steps"] != report["steps"] else ""),
        "",
        f"{'steps':>10}  epsilon",
    ]
    lines += [f"{t:>10}  {e:.6g}" for t, e in report["epsilon_by_steps"].items()]
    return "\n".join(lines + [""] + _shard_lines(report) + _unit_lines(report))


def _shard_lines(report: dict) -> list[str]:
    """Why the number of shards is not in the plan (privacy rule 14)."""
    n = report["shards"]
    return [f"shards:           {n}: epsilon does not depend on the number of shards. Each shard sends its",
            "                  clipped sums over its slice of the M slots; the driver adds them and releases",
            "                  once, with the same q, M, C and z as one process (one ledger event per step)."]


def _unit_lines(report: dict) -> list[str]:
    """What the guarantee is for, and the trade-off between the two units (privacy rule 12)."""
    eps = report["epsilon"]
    if report["unit"] == "key":
        k = report["max_records_per_key"]
        lines = [
            f"unit:             key: epsilon {eps:.6g} protects all records of one key (one person), however",
            f"                  many it sends. S and M count keys and key slots; each key keeps at most {k}",
            f"                  record(s) (memory: M x {k} records), and a key's records are summed and clipped",
            "                  to one record's bound C, so heavy keys count as much as light ones.",
            "trade-off:        the same noise at record level would protect a person with k records only at",
            "                  the group-privacy bound:",
        ]
    else:
        lines = [
            f"unit:             record: epsilon {eps:.6g} protects each record. A person with k records is",
            "                  protected at the group-privacy bound below; --unit key protects every person",
            "                  at epsilon whatever k (each key's records are summed and clipped to C).",
        ]
    lines.append(f"{'k records':>10}  {'epsilon':>9}  delta")
    lines += [f"{g['records']:>10}  {g['epsilon']:>9.4g}  "
              + ("1 (no guarantee)" if g["vacuous"] else f"{g['delta']:.3g}")
              for g in report["group_privacy"]]
    return lines


def run(args: argparse.Namespace) -> int:
    """Execute ``stream-vips plan`` for parsed ``args``; returns the exit status."""
    from stream_vips.privacy.accountants import UnsupportedEvent

    try:
        report = plan(args.sampling, args.batch_size, args.reservoir, args.steps, args.delta,
                      noise_multiplier=args.noise_multiplier, epsilon=args.epsilon, accountant=args.accountant,
                      unit=args.unit, max_records_per_key=args.max_records_per_key, shards=args.shards)
    except UnsupportedEvent as exc:
        print(f"{PROG}: error: unsupported sampling/accountant pair: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report) if args.json else _render(report))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stream-vips")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return run(parser.parse_args(["plan", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    sys.exit(main())
