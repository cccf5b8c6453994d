"""Mutation testing of the privacy wall: mutmut over the modules that enforce the privacy rules.

A mutant is a small change to one line (a flipped comparison, an off-by-one constant, a dropped
argument); a mutant that no test notices is a privacy rule that no test pins. This driver runs
mutmut (the ``mutation`` extra: ``pip install -e '.[mutation]'``) module by module and records the outcome per module in
``benchmarks/results/mutation.json``, with a hash of each module's source and target so that
``tests/test_mutation.py`` can tell, without mutmut, whether the record is current.

Why mutmut and not cosmic-ray: mutmut forks one worker per mutant from a server process that has
already imported the code and collected the tests, and runs only the tests that executed the mutated
function (it records that mapping itself), so a mutant costs seconds instead of a fresh pytest;
its mutant names carry the function (``module.xǁClassǁmethod__mutmut_7``), so ``mutmut run`` with
name globs restricts the model files to their clipping functions. cosmic-ray starts a new test
command per mutant and has no function-level selection. mutmut does not mutate functions with a
decorator other than ``@staticmethod``/``@classmethod`` (``@property``, ``@lru_cache``); the JSON
lists those per module under ``not_mutated`` so the gap is visible.

Each module runs in a scratch copy of the repository (mutmut rewrites the copy, never the checkout)
against its own test files (``TARGETS``), so a mutant runs in seconds. Lines that raise or log are
not mutated (their message text is not a rule; the condition that raises is on its own line and is
mutated), nor are lines that are only prose in a string literal.

Usage: ``python tools/mutation.py`` re-runs the modules whose hash changed (incremental, the
default, ``--changed``); ``--all`` re-runs every module; ``--module PATH`` re-runs the given ones;
``--check`` only verifies the record (what CI does). ``--module PATH --survivors`` re-runs only the
recorded survivors of a module whose source is unchanged (after tests were added for them).
``--results PATH`` reads and writes another record (runs at once), which ``--merge PATH`` takes into
the main one; ``--rescore`` recounts the survivors after the lists changed.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "mutation.json"
EQUIVALENT = ROOT / "tests" / "mutation" / "equivalent.txt"
UNTRIAGED = ROOT / "tests" / "mutation" / "untriaged.txt"
PENDING = "pending: "
#: Not mutated: raise statements and logging (message text), and lines that are only prose in a string.
SKIP_LINES = (r"^\s*raise\b", r"^\s*(log|logger)\.\w+\(", r"^\s*warnings\.warn\(", r'^\s*f?"[^"]*\s[^"]*"')
#: The functions of a model that bound a record's influence (clip bounds, norms, diameters).
MODEL_FUNCTIONS = ("clipped_sum", "group_clipped_sum", "diameter", "group_diameter", "blocks",
                   "clip_bound", "clip_bounds", "_clip_factors", "_clip_site")
PYTEST_ARGS = ("-p", "no:cacheprovider", "-q", "-m", "not slow and not kafka and not prometheus")
#: mutmut settings. Workers fork from a server that has run no test, so a cache that a test fills
#: (the calibration memo) is empty in every worker, as in a fresh pytest. A mutant is timed out
#: after 4 (est + 2) CPU seconds, est = the clean run of its tests: mutmut's default (30 (est + 1))
#: spends up to half an hour on one mutant that never ends a search loop.
MUTMUT = {"process_isolation": "forkserver", "timeout_multiplier": 2.0, "timeout_constant": 2.0}


@dataclass(frozen=True)
class Target:
    """One mutated module: the test files that pin it, and the functions mutated (None: all)."""

    tests: tuple[str, ...]
    functions: tuple[str, ...] | None = None


_BUDGET_TESTS = ("tests/test_privacy_budget.py", "tests/test_window.py", "tests/test_window_life.py",
                 "tests/test_key_privacy.py", "tests/test_privacy_events.py", "tests/test_strong_composition.py")
_MODEL_TESTS = ("tests/test_model_validate.py", "tests/test_audit.py")
_ACCOUNTANT_AND_BUDGET = ("tests/test_privacy_accountant.py", "tests/test_privacy_budget.py")
TARGETS: dict[str, Target] = {
    # headroom is pinned by the budget monitor's tests, grouping and refusal by the accountant's
    "stream_vips/privacy/accountants/base.py": Target(_ACCOUNTANT_AND_BUDGET),
    "stream_vips/privacy/accountants/rdp.py": Target(("tests/test_privacy_accountant.py",)),
    # the incremental loss distribution is pinned through the monitor's restarts too
    "stream_vips/privacy/accountants/pld.py": Target(_ACCOUNTANT_AND_BUDGET),
    "stream_vips/privacy/accountants/registry.py": Target(("tests/test_privacy_accountant.py",)),
    "stream_vips/privacy/calibration.py": Target(("tests/test_privacy_accountant.py",)),
    "stream_vips/privacy/budget.py": Target(_BUDGET_TESTS),
    "stream_vips/privacy/accountants/strong.py": Target(("tests/test_strong_composition.py",
                                                         "tests/test_privacy_events.py")),
    "stream_vips/privacy/events.py": Target(("tests/test_privacy_events.py", "tests/test_privacy_ledger.py")),
    "stream_vips/privacy/ledger.py": Target(("tests/test_privacy_ledger.py", "tests/test_privacy_budget.py")),
    "stream_vips/privacy/mechanisms.py": Target(("tests/test_privacy_mechanisms.py", "tests/test_engine.py")),
    "stream_vips/core/engine.py": Target(("tests/test_engine.py", "tests/test_window_life.py",
                                          "tests/test_key_privacy.py")),
    "stream_vips/core/data/reservoir.py": Target(("tests/test_reservoir.py", "tests/test_admission.py",
                                                  "tests/test_sampling.py", "tests/test_engine.py")),
    "stream_vips/core/data/key_reservoir.py": Target(("tests/test_key_privacy.py", "tests/test_admission.py")),
    "stream_vips/core/data/window.py": Target(("tests/test_window.py", "tests/test_window_life.py",
                                               "tests/test_admission.py")),
    "stream_vips/core/data/sampling.py": Target(("tests/test_sampling.py", "tests/test_engine.py",
                                                 "tests/test_reservoir.py")),
    "stream_vips/models/base.py": Target(("tests/test_engine.py",) + _MODEL_TESTS, MODEL_FUNCTIONS),
    "stream_vips/models/logistic.py": Target(("tests/test_logistic.py", "tests/test_logistic_centred.py")
                                             + _MODEL_TESTS, MODEL_FUNCTIONS),
    "stream_vips/models/linreg.py": Target(("tests/test_linreg.py",) + _MODEL_TESTS, MODEL_FUNCTIONS),
    "stream_vips/models/lda.py": Target(("tests/test_lda.py",) + _MODEL_TESTS, MODEL_FUNCTIONS),
    "stream_vips/models/sbn.py": Target(("tests/test_sbn.py",) + _MODEL_TESTS, MODEL_FUNCTIONS),
    "stream_vips/models/sep/core.py": Target(("tests/test_sep_core.py",) + _MODEL_TESTS, MODEL_FUNCTIONS),
    "stream_vips/models/sep/bnn.py": Target(("tests/test_sep_bnn.py",) + _MODEL_TESTS, MODEL_FUNCTIONS),
    "stream_vips/models/sep/probit.py": Target(("tests/test_sep_probit.py",) + _MODEL_TESTS, MODEL_FUNCTIONS),
    "stream_vips/models/sep/mixture.py": Target(("tests/test_sep_mixture.py",) + _MODEL_TESTS, MODEL_FUNCTIONS),
    "stream_vips/models/baselines/dpvi.py": Target(("tests/test_baselines_dpvi.py",) + _MODEL_TESTS, MODEL_FUNCTIONS),
    "stream_vips/models/baselines/sgld.py": Target(("tests/test_baselines_sgld.py",) + _MODEL_TESTS, MODEL_FUNCTIONS),
}
# models/baselines/ops.py is not a target: it releases one posterior sample as an uncertified event,
# and its clipped_sum and blocks only refuse (the Gaussian protocol does not apply to it).


def module_hash(path: str) -> str:
    """sha256 of a module's code and its target: changing either makes the recorded result stale.

    The code is the module's syntax tree without its imports, docstrings and type annotations
    (mutmut mutates none of them, and the tests that run decide the rest), so a comment, a
    docstring, a type hint, an import moved or a line moved does not invalidate a pass; any
    change to a function, a class or a module-level value does."""
    target = TARGETS[path]
    digest = hashlib.sha256(_code_of((ROOT / path).read_text()).encode())
    digest.update(repr((target.tests, target.functions, SKIP_LINES, PYTEST_ARGS, MUTMUT)).encode())
    return digest.hexdigest()


def _code_of(source: str) -> str:
    """``ast.dump`` of ``source`` without imports, docstrings and annotations."""
    tree = ast.parse(source)
    tree.body = [node for node in tree.body if not isinstance(node, (ast.Import, ast.ImportFrom))]
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.returns = None
            for arg in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs,
                        *filter(None, (node.args.vararg, node.args.kwarg))):
                arg.annotation = None
        if isinstance(node, ast.AnnAssign):
            node.annotation = ast.Constant(None)
    return ast.dump(tree)


def function_label(mutant: str) -> str:
    """``pkg.mod.xǁClassǁmethod__mutmut_3`` -> ``Class.method``; ``pkg.mod.x_func__mutmut_3`` -> ``func``."""
    mangled = mutant.rpartition(".")[2].rpartition("__mutmut_")[0]
    if mangled.startswith("xǁ"):
        return ".".join(mangled[2:].split("ǁ"))
    return mangled[2:]


def mutant_key(path: str, function: str, diff: str) -> str:
    """A survivor's name that outlives line shifts: module, function and the mutated source text
    (the removed text, marked ``deleted:``, when the mutant only drops a line such as an argument)."""
    def lines(sign: str) -> list[str]:
        return [" ".join(line[1:].split("  # ")[0].split()) for line in diff.splitlines()
                if line.startswith(sign) and not line.startswith(sign * 3)]

    added = lines("+")
    return f"{path} | {function} | {' / '.join(added) if added else 'deleted: ' + ' / '.join(lines('-'))}"


def read_equivalent(path: Path = EQUIVALENT) -> dict[str, str]:
    """The allow-list: ``module | function | mutated text | reason`` per line, keyed without the reason."""
    entries: dict[str, str] = {}
    for line in _entries(path):
        key, _, reason = line.rpartition(" | ")
        if key.count(" | ") < 2 or not reason.strip():
            raise ValueError(f"{path}: not 'module | function | mutated text | reason': {line!r}")
        entries[key] = reason.strip()
    return entries


def read_untriaged(path: Path = UNTRIAGED) -> set[str]:
    """The backlog: survivors found but not yet triaged (``module | function | mutated text``), and
    modules whose pass has not run yet (``pending: module``). Tolerated by the check so that only
    new survivors and changed modules fail it; the target is not met while the backlog has a line."""
    keys = set(_entries(path))
    bad = [key for key in keys
           if key.count(" | ") < 2 and not (key.startswith(PENDING) and key[len(PENDING):] in TARGETS)]
    if bad:
        raise ValueError(f"{path}: not 'module | function | mutated text' nor 'pending: <target module>': {bad}")
    return keys


def _entries(path: Path) -> list[str]:
    """The non-blank, non-comment lines of a list file (none if it does not exist)."""
    if not path.exists():
        return []
    lines = (raw.strip() for raw in path.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def decorated_functions(path: str, functions: tuple[str, ...] | None) -> list[str]:
    """Functions mutmut skips (a decorator other than staticmethod/classmethod), named like mutants."""
    skipped = []

    def visit(body: list[ast.stmt], owner: str | None) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef) and owner is None:
                visit(node.body, node.name)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.decorator_list:
                plain = len(node.decorator_list) == 1 and isinstance(node.decorator_list[0], ast.Name) \
                    and node.decorator_list[0].id in ("staticmethod", "classmethod")
                if not plain and (functions is None or node.name in functions):
                    skipped.append(f"{owner}.{node.name}" if owner else node.name)

    visit(ast.parse((ROOT / path).read_text(encoding="utf-8")).body, None)
    return skipped


def _scratch_copy(path: str, target: Target) -> Path:
    """A copy of the repository with a [tool.mutmut] section for this one module."""
    scratch = Path(tempfile.mkdtemp(prefix="stream-vips-mutation-"))
    shutil.copytree(ROOT, scratch / "repo", ignore=shutil.ignore_patterns(
        ".git", "mutants", "__pycache__", ".pytest_cache", ".hypothesis", "*.egg-info"))
    repo = scratch / "repo"
    config = {"source_paths": ["stream_vips"], "only_mutate": [path], "also_copy": ["connectors", "benchmarks"],
              "pytest_add_cli_args_test_selection": list(target.tests), "pytest_add_cli_args": list(PYTEST_ARGS),
              "do_not_mutate_patterns": list(SKIP_LINES), "use_git_change_detection": False, **MUTMUT}
    lines = ["", "[tool.mutmut]"] + [f"{key} = {json.dumps(value)}" for key, value in config.items()]
    with open(repo / "pyproject.toml", "a", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    return repo


def _globs(path: str, functions: tuple[str, ...] | None) -> list[str]:
    """mutmut mutant-name globs for a module, or for some of its functions (methods and plain)."""
    module = path.removesuffix(".py").replace("/", ".")
    if functions is None:
        return [f"{module}.*"]
    return [f"{module}.{prefix}{name}__mutmut_*" for name in functions for prefix in ("x_", "xǁ*ǁ")]


def run_module(path: str, workers: int, only: list[str] | None = None) -> dict:
    """Mutate one module in a scratch copy, run its tests against each mutant (or only the mutants
    named in ``only``), return its record. mutmut's timeout is in wall-clock seconds (twice the
    tests' measured time plus a constant), so a survivor whose tests run slower than measured, on a
    machine that got busier, is reported as timed out, which the score counts as killed: every
    timed-out mutant is therefore run once more, alone, and keeps the verdict of that run."""
    record = _run(path, workers, only)
    if record["timeouts"]:
        again = _run(path, 1, record["timeouts"])
        counts = {b: record[b] + again[b] - (b == "timeout") * len(record["timeouts"])
                  for b in ("killed", "survived", "timeout", "no tests", "other")}
        record = {**record, **counts, "survivors": sorted(record["survivors"] + again["survivors"],
                                                          key=lambda s: s["mutant"]),
                  "timeouts": again["timeouts"], "seconds": round(record["seconds"] + again["seconds"], 1)}
    return record


def _run(path: str, workers: int, only: list[str] | None) -> dict:
    """One mutmut run of :func:`run_module`, without the second look at timeouts."""
    target = TARGETS[path]
    repo = _scratch_copy(path, target)
    started = time.monotonic()
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)  # mutmut puts its mutated copy first; a checkout on the path would shadow it
    globs = only if only is not None else _globs(path, target.functions)
    proc = subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", str(workers), *globs],
                          check=False, cwd=repo, env=env, capture_output=True, text=True)
    try:
        record = collect(repo, path, globs)
    except RuntimeError as exc:
        raise RuntimeError(f"{exc} (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}") from None
    finally:
        shutil.rmtree(repo.parent, ignore_errors=True)
    return {**record, "seconds": round(time.monotonic() - started, 1)}


def collect(repo: Path, path: str, globs: list[str]) -> dict:
    """The record of one module from mutmut's results in ``repo``: counts, and each survivor's key."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code

    target = TARGETS[path]
    meta = repo / "mutants" / (path + ".meta")
    codes = json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"] if meta.exists() else {}
    codes = {name: code for name, code in codes.items() if any(fnmatch.fnmatch(name, g) for g in globs)}
    if not codes or None in codes.values():
        raise RuntimeError(f"mutmut did not finish {path}")
    counts = {"killed": 0, "survived": 0, "timeout": 0, "no tests": 0, "other": 0}
    survivors, timeouts = [], []
    cwd = os.getcwd()
    os.chdir(repo)  # mutmut reads its mutants relative to the working directory
    try:
        for name, code in sorted(codes.items()):
            status = status_by_exit_code[code]
            # a mutant that kills the test process by a signal (it corrupted memory) did not pass the tests
            failed = status in ("caught by type check", "segfault")
            bucket = status if status in counts else "killed" if failed else "other"
            counts[bucket] += 1
            if bucket == "timeout":
                timeouts.append(name)
            if bucket in ("survived", "no tests", "other"):
                key = mutant_key(path, function_label(name), get_diff_for_mutant(name, path=path))
                survivors.append({"key": key, "status": status, "mutant": name})
    finally:
        os.chdir(cwd)
    return {"source_hash": module_hash(path), "tests": list(target.tests),
            "functions": list(target.functions) if target.functions else "all",
            "not_mutated": decorated_functions(path, target.functions), "mutants": len(codes), **counts,
            "survivors": survivors, "timeouts": timeouts}


def recheck_survivors(path: str, record: dict, workers: int) -> dict:
    """Re-run only the recorded survivors of a current module (after tests were added for them):
    those now killed move to the killed count, the others stay survivors. The mutants are named
    as mutmut numbered them for this source, so the record must be current (same hash), and each
    re-run survivor must still carry its recorded key."""
    if record.get("source_hash") != module_hash(path):
        raise RuntimeError(f"{path}: the record is not current, re-run the whole module")
    if not record["survivors"]:
        return record
    again = run_module(path, workers, only=[s["mutant"] for s in record["survivors"]])
    by_name = {s["mutant"]: s for s in again["survivors"]}
    for old in record["survivors"]:
        new = by_name.get(old["mutant"])
        if new is not None and new["key"] != old["key"]:
            raise RuntimeError(f"{path}: {old['mutant']} is now {new['key']!r}, recorded as {old['key']!r}")
    killed = again["killed"] + again["timeout"]
    if killed + len(again["survivors"]) != len(record["survivors"]):
        raise RuntimeError(f"{path}: re-ran {again['mutants']} mutants for {len(record['survivors'])} survivors")
    def bucket(survivor: dict) -> str:
        return survivor["status"] if survivor["status"] in ("survived", "no tests") else "other"

    counts = {b: record[b] for b in ("survived", "no tests", "other")}
    for survivor in record["survivors"]:
        counts[bucket(survivor)] -= 1
    for survivor in again["survivors"]:
        counts[bucket(survivor)] += 1
    return {**record, **counts, "killed": record["killed"] + again["killed"],
            "timeout": record["timeout"] + again["timeout"], "timeouts": record.get("timeouts", []) + again["timeouts"],
            "survivors": [by_name[s["mutant"]] for s in record["survivors"] if s["mutant"] in by_name],
            "recheck_seconds": round(record.get("recheck_seconds", 0) + again["seconds"], 1)}


def score(record: dict, equivalent: dict[str, str], untriaged: set[str]) -> dict:
    """Split a module's survivors into equivalent (allow-listed), untriaged and unexplained."""
    keys = [s["key"] for s in record["survivors"]]
    return {"equivalent": sum(k in equivalent for k in keys), "untriaged": sum(k in untriaged for k in keys),
            "unexplained": sorted(k for k in keys if k not in equivalent and k not in untriaged)}


def problems(results: dict, equivalent: dict[str, str], untriaged: set[str]) -> list[str]:
    """What fails the check: a stale or missing module, a survivor in neither list, or a list entry
    that names no recorded survivor of a current module (killed since, or mistyped: remove it)."""
    found, recorded = [], set()
    modules = results.get("modules", {})
    for path in TARGETS:
        record = modules.get(path)
        if record is None and PENDING + path in untriaged:
            continue
        if record is None or record["source_hash"] != module_hash(path):
            found.append(f"{path}: mutation result {'missing' if record is None else 'stale'} "
                         f"(re-run: python tools/mutation.py --module {path})")
            continue
        if PENDING + path in untriaged:
            found.append(f"listed as pending but recorded: {PENDING}{path}")
        recorded |= {s["key"] for s in record["survivors"]}
        found += [f"unexplained survivor: {key}" for key in score(record, equivalent, untriaged)["unexplained"]]
    current = {p for p in TARGETS if modules.get(p, {}).get("source_hash") == module_hash(p)}
    for key in sorted(set(equivalent) | untriaged):
        if key.split(" | ", 1)[0] in current and key not in recorded:
            found.append(f"listed but not a recorded survivor: {key}")
    return found


def write(results: dict, equivalent: dict[str, str], untriaged: set[str], path: Path = RESULTS) -> None:
    """Recount each module's survivors against the lists, set the target and write the record."""
    # a module listed as pending whose record is stale waits for its pass: its old record goes
    results["modules"] = {p: r for p, r in results["modules"].items()
                          if p in TARGETS and not (PENDING + p in untriaged and r["source_hash"] != module_hash(p))}
    for record in results["modules"].values():
        record.update(score(record, equivalent, untriaged))
    results["target"] = "no survivor (survived or untested) in the privacy wall without a test or an equivalence reason"
    results["met"] = (set(results["modules"]) == set(TARGETS) and not untriaged
                      and not problems(results, equivalent, untriaged))
    results["pending"] = [p for p in TARGETS if PENDING + p in untriaged]
    path.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    """Run the incremental (default), full or per-module mutation pass, or only check the record."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--changed", action="store_true", help="re-run modules whose hash changed (default)")
    mode.add_argument("--all", action="store_true", help="re-run every module")
    mode.add_argument("--module", nargs="+", choices=sorted(TARGETS), help="re-run these modules")
    mode.add_argument("--check", action="store_true", help="only check the record (no mutmut)")
    mode.add_argument("--rescore", action="store_true",
                      help="recount the survivors against the lists and rewrite the record (no mutmut)")
    mode.add_argument("--merge", nargs="+", type=Path, metavar="RECORD",
                      help="take the current module records of other record files (runs made with --results)")
    parser.add_argument("--survivors", action="store_true",
                        help="with --module: re-run only the recorded survivors (after adding tests for them)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--results", type=Path, default=RESULTS, help="the record to update (default: %(default)s)")
    args = parser.parse_args(argv)

    equivalent, untriaged = read_equivalent(), read_untriaged()
    results = json.loads(args.results.read_text(encoding="utf-8")) if args.results.exists() else {}
    results.setdefault("modules", {})
    if args.survivors and not args.module:
        parser.error("--survivors needs --module")
    if args.rescore or args.merge:
        for other in args.merge or []:
            for path, record in json.loads(other.read_text(encoding="utf-8"))["modules"].items():
                if path in TARGETS and record["source_hash"] == module_hash(path):
                    results["modules"][path] = record
        results["modules"] = {p: results["modules"][p] for p in TARGETS if p in results["modules"]}
        write(results, equivalent, untriaged, args.results)
    elif args.survivors:
        for path in args.module:
            print(f"[mutation] {path}: re-running its recorded survivors", flush=True)
            results["modules"][path] = recheck_survivors(path, results["modules"][path], args.workers)
            record = results["modules"][path]
            print(f"[mutation] {path}: {len(record['survivors'])} survivors left", flush=True)
            write(results, equivalent, untriaged, args.results)
    elif not args.check:
        import mutmut

        if args.all:
            todo = list(TARGETS)
        elif args.module:
            todo = args.module
        else:
            todo = [p for p in TARGETS if results["modules"].get(p, {}).get("source_hash") != module_hash(p)]
        results["tool"] = f"mutmut {mutmut.__version__}"
        results["pytest_args"] = list(PYTEST_ARGS)
        for path in todo:
            print(f"[mutation] {path}", flush=True)
            results["modules"][path] = run_module(path, args.workers)
            record = results["modules"][path]
            print(f"[mutation] {path}: {record['mutants']} mutants, {record['killed']} killed, "
                  f"{record['survived']} survived, {record['no tests']} untested, {record['seconds']} s", flush=True)
            write(results, equivalent, untriaged, args.results)
        results["modules"] = {p: results["modules"][p] for p in TARGETS if p in results["modules"]}
        write(results, equivalent, untriaged, args.results)
    found = problems(results, equivalent, untriaged)
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
