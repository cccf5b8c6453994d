"""``stream-vips plan``: how much privacy a run spends, before it runs.

Given the sampling scheme, batch size S, reservoir capacity M (q = S/M), number of steps T and
delta, prints epsilon for a noise multiplier z (z = noise std / C, privacy rule 2 in
docs/privacy.md), or the smallest z whose epsilon meets a target, with epsilon after a few step
counts. The accounting is the pipeline's own (``stream_vips.privacy.accountant``): pld for
Poisson, autodp for fixed-size unless ``--accountant`` says otherwise; guarantees are under
replace-one adjacency (privacy rule 1). Every epsilon printed is what the budget monitor will
report after that many steps: with pld an upper bound that is exact at a grid of step counts
(``accounted_steps``, at most 1/256 above the count asked for). Time and memory do not grow with
the number of steps or the target: the PLD grid follows epsilon.

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
    p.add_argument("--accountant", choices=("pld", "autodp"), default=None,
                   help="default: pld for poisson, autodp for fixed")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def checkpoints(steps: int) -> list[int]:
    """A few step counts up to (and including) ``steps`` to show how epsilon grows."""
    return sorted({max(1, steps * k // 10) for k in (1, 2, 5)} | {steps})


def plan(sampling: str, batch_size: int, reservoir: int, steps: int, delta: float,
         noise_multiplier: float | None = None, epsilon: float | None = None,
         accountant: str | None = None) -> dict:
    """The planning report as a dict (what ``--json`` prints)."""
    from .privacy.accountant import UnsupportedEvent, calibrate_noise_multiplier, make_accountant
    from .privacy.events import SubsampledGaussianEvent

    if batch_size > reservoir:
        raise ValueError(f"--batch-size {batch_size} exceeds --reservoir {reservoir} (q = S/M must be <= 1)")
    if (noise_multiplier is None) == (epsilon is None):
        raise ValueError("give exactly one of --noise-multiplier and --epsilon")
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
    return {
        "epsilon": by_steps[steps], "delta": delta, "noise_multiplier": z, "paper_sigma": event.paper_sigma,
        "q": q, "steps": steps, "accounted_steps": grid(steps) if grid is not None else steps,
        "sampling": sampling, "accountant": acct.name,
        "adjacency": event.adjacency, "batch_size": batch_size, "reservoir": reservoir,
        "target_epsilon": epsilon, "epsilon_by_steps": {str(t): e for t, e in by_steps.items()},
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
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Execute ``stream-vips plan`` for parsed ``args``; returns the exit status."""
    from .privacy.accountant import UnsupportedEvent

    try:
        report = plan(args.sampling, args.batch_size, args.reservoir, args.steps, args.delta,
                      noise_multiplier=args.noise_multiplier, epsilon=args.epsilon, accountant=args.accountant)
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
