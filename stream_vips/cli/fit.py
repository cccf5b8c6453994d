"""``stream-vips fit``: a finite JSONL data set through :func:`stream_vips.fitting.fit`, with the
model written atomically and nothing spent before every check has passed."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stream_vips import messages
from stream_vips.errors import FitError, LedgerRefused, NoModelError, SpentError, error_text
from stream_vips.fitting.rules import CLI_NAMES, MAX_DIM
from stream_vips.models.registry import MODEL_FAMILIES
from stream_vips.privacy.ledger import read_first_line

# ------------------------------------------------------------------------------------------- CLI


def _param(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    try:
        return key, json.loads(value)
    except (ValueError, RecursionError):  # not JSON (or nested too deeply for it): the text itself
        return key, value


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """The ``fit`` subcommand."""
    p = subparsers.add_parser(
        "fit", help="fit a model to a finite JSONL data set, spending the whole privacy budget",
        description="Fit a model privately to a finite data set (one JSON record per line). The whole data "
                    "set is the reservoir; settings come from N, d, the family, epsilon and delta only "
                    "(docs/fit.md), and the noise is calibrated to spend the whole budget.",
        epilog=EXIT_TEXT)
    p.add_argument("data", metavar="DATA.jsonl", help="records, one JSON object per line ('-': stdin)")
    p.add_argument("--family", required=True, choices=list(MODEL_FAMILIES),
                   help="the model family (docs/families.md: its records, parameters and fit rule)")
    p.add_argument("--epsilon", type=float, default=1.0, help="privacy budget epsilon (default 1)")
    p.add_argument("--delta", type=float, default=1e-5, help="privacy budget delta (default 1e-5)")
    p.add_argument("--non-private", action="store_true", help="baseline without noise (no guarantee; the "
                   "message says private: false and epsilon_spent: null)")
    p.add_argument("--out", metavar="MODEL.json", required=True, help="write the final model message here")
    p.add_argument("--seed", type=int, default=None, help="fix the noise (reproduction only: reported as seeded)")
    p.add_argument("--dim", type=int, default=None, metavar="D",
                   help="the dimension d of the records (required unless a --param gives it): the length of each "
                        f"record's vector; public, so never read from the data; at most {MAX_DIM:,}")
    p.add_argument("--steps", type=int, default=None, help="override the rule's number of steps")
    p.add_argument("--ledger", metavar="PATH", default=None, help="keep the privacy ledger in this file")
    p.add_argument("--param", type=_param, action="append", default=[], metavar="KEY=VALUE",
                   help="a model parameter (JSON value), e.g. --param noise='\"gamma\"' --param y_bound=2")
    return p


def json_lines(raw: bytes) -> list[bytes]:
    """The records of a JSON Lines file: every line, blank or not, is one (N is public and must
    not change when a record is replaced by a blank line; a blank one is rejected as empty);
    the newline that ends the last line does not start another.

    >>> json_lines(b'{"x": [1]}\\n\\n  \\n{"x": [2]}\\n')
    [b'{"x": [1]}', b'', b'  ', b'{"x": [2]}']
    >>> json_lines(b""), json_lines(b"\\n")
    ([], [b''])
    """
    lines = raw.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return lines


def run(args: argparse.Namespace) -> int:
    """``stream-vips fit``: every check (arguments, data, ledger, --out) runs and the output file is
    reserved before anything is spent; a refusal is one line on stderr (exit codes in the
    epilog). The model is written atomically, or printed to stdout if that still fails after
    spending; a failure after spending keeps the last paid model the same way (exit 5)."""
    try:
        out = OutputFile(args.out, data=args.data, ledger=args.ledger)
        try:
            raw = sys.stdin.buffer.read() if args.data == "-" else Path(args.data).read_bytes()
        except OSError as exc:
            raise FitError(f"cannot read {args.data}: {exc.strerror or exc}") from None
        with _quiet_service_logs():
            from stream_vips.fitting.api import prepare  # the models load only when a fit runs

            plan = prepare(json_lines(raw), args.family, args.epsilon, args.delta, dim=args.dim,
                            non_private=args.non_private, seed=args.seed, steps=args.steps, x_columns=None,
                            y_column=None, ledger_path=args.ledger, settings=None, model_id="fit",
                            model_params=dict(args.param), names=CLI_NAMES)
        out.reserve()
    except ValueError as exc:  # FitError, ConfigError and the models' own parameter checks
        return _refuse(exc)
    try:
        try:
            with _quiet_service_logs():
                from stream_vips.fitting.api import execute

                result = execute(plan)
        except SpentError as exc:
            return _failed_after_spending(exc, out)
        except ValueError as exc:  # building the pipeline refused (nothing spent), or no model
            return _refuse(exc)
        except Exception as exc:  # pragma: no cover - execute turns failures after a step into SpentError
            return _failed_after_spending(SpentError(error_text(exc), None, plan.non_private), out)
        error = out.write(messages.dumps(result.message) + b"\n")
    finally:
        out.discard()
    if error is not None:
        print(f"stream-vips fit: cannot write --out {out.path} ({error}); the budget is spent, so the model "
              "message is printed to stdout instead", file=sys.stderr)
    from stream_vips.fitting.api import summary

    print(summary(result), file=sys.stderr)
    for line in result.report["warnings"]:
        print(f"stream-vips fit: warning: {line}", file=sys.stderr)
    return EXIT_CODES["written"] if error is None else EXIT_CODES["not_written"]


def _failed_after_spending(exc: SpentError, out: OutputFile) -> int:
    """Keep the last paid model of a fit that failed after spending (--out, else stdout)
    and say so in one line; exit code 5."""
    where = "no model had been made"
    if exc.message is not None:
        error = out.write(messages.dumps(exc.message) + b"\n")
        where = (f"the last model was saved to {out.path}" if error is None else
                 f"--out {out.path} cannot be written ({error}), so the last model was printed to stdout")
    print(f"stream-vips fit: {exc.headline}; {where}", file=sys.stderr)
    return EXIT_CODES["spent"]


#: Exit codes of ``stream-vips fit`` (its epilog says them).
EXIT_CODES = {"written": 0, "no_model": 1, "bad_input": 2, "ledger": 3, "not_written": 4, "spent": 5}
EXIT_TEXT = ("exit codes: 0 a model was written; 1 no model (the reason is printed: no valid record, the budget "
             "already spent in the ledger, too many rejected records, a failure before any step was paid); 2 bad "
             "arguments or input; 3 the ledger refuses (not a ledger file, corrupt, or in use); 4 the model was made "
             "(the budget spent) but --out could not be written: it was printed to stdout; 5 the fit failed after "
             "spending (the error is printed): the model of the last paid step, if any, was saved to --out (or "
             "stdout if that failed). Nothing is spent unless the exit code is 0, 4 or 5.")


@contextlib.contextmanager
def _quiet_service_logs() -> Iterator[None]:
    """Silence the service's log lines (``stream_vips.*``) for one command-line fit: a refused
    step logs for operators of a long-running service, but here the reason is already in the one
    ``stream-vips fit:`` line (or the warnings), and two more unprefixed lines would only confuse.
    The ledger's warnings and errors still show, as ``stream-vips fit: warning:`` lines: a torn
    last line cut from the user's ledger file is something they must hear about."""
    logger, ledger_logger = logging.getLogger("stream_vips"), logging.getLogger("stream_vips.privacy.ledger")
    quiet, loud = logging.NullHandler(), logging.StreamHandler(sys.stderr)
    loud.setFormatter(logging.Formatter("stream-vips fit: warning: %(message)s"))
    saved = logger.propagate, ledger_logger.propagate, ledger_logger.level
    logger.addHandler(quiet)
    ledger_logger.addHandler(loud)
    logger.propagate = ledger_logger.propagate = False
    ledger_logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.removeHandler(quiet)
        ledger_logger.removeHandler(loud)
        logger.propagate, ledger_logger.propagate = saved[:2]
        ledger_logger.setLevel(saved[2])


def _refuse(exc: Exception) -> int:
    """One line on stderr for a refused fit; the exit code of its kind."""
    print("stream-vips fit: " + " ".join(str(exc).splitlines()), file=sys.stderr)
    if isinstance(exc, NoModelError):
        return EXIT_CODES["no_model"]
    return EXIT_CODES["ledger"] if isinstance(exc, LedgerRefused) else EXIT_CODES["bad_input"]


class OutputFile:
    """``--out``, checked before the fit and reserved before it spends anything.

    The path must not be the data file (nor the file on stdin when the data is ``-``), the
    ledger (resolved paths, so links and relative spellings are caught) or any other privacy
    ledger (its first line is a ledger line: overwriting it would erase spent budget), must not
    be a directory or another non-regular file. :meth:`reserve` creates its directory the way
    the ledger's is and a temporary file next to it, which proves the directory writable (a
    fit that writes no model removes both); :meth:`write` fills it and renames it over the
    target (atomic: a reader sees the old file or the whole model, never part of one). An
    existing file keeps its mode, and a symlink stays a link: the temporary file is made in the
    link target's directory and renamed over the target. If that still fails after the budget
    was spent, the model goes to stdout so the spent budget is not lost.
    """

    def __init__(self, path: str, *, data: str, ledger: str | None) -> None:
        if path == "-":  # would make a file named "-": the model is a file, written atomically
            raise FitError("--out - is not supported: give a file path for the model (the summary goes to stderr)")
        self.path = Path(path)
        self._target = _resolve(self.path, "--out")  # a symlink's target is written, the link kept
        self._tmp: Path | None = None
        self._created: list[Path] = []  # directories reserve() made, deepest first
        self._written = False
        for flag, other, name in (("the data file", None if data == "-" else data, "the data file"),
                                  ("the --ledger file", ledger, "--ledger")):
            if other is not None and (self._target == _resolve(Path(other), name)
                                      or _same_file(self.path, Path(other))):
                raise FitError(f"--out {path} is {flag}: writing the model there would destroy it; "
                               "choose another --out")
        if data == "-" and _is_stdin(self.path):
            raise FitError(f"--out {path} is the data read from stdin: writing the model there would destroy it; "
                           "choose another --out")
        if self.path.is_dir():
            raise FitError(f"--out {path} is a directory; give a file name, e.g. {Path(path) / 'model.json'}")
        if self.path.exists() and not self.path.is_file():
            raise FitError(f"--out {path} is not a regular file; give a file path")
        if self.path.is_file():
            self._refuse_a_ledger(path)

    def _refuse_a_ledger(self, path: str) -> None:
        """Refuse an existing --out that is, or may be (it cannot be read), a privacy ledger: its
        first line begins like a ledger line, whether or not its checksum passes
        (:func:`~stream_vips.privacy.ledger.starts_like_ledger`)."""
        from stream_vips.privacy.ledger import starts_like_ledger

        try:
            first = read_first_line(self.path)
        except OSError as exc:
            raise FitError(f"--out {path} exists but cannot be read ({exc.strerror or exc}), so it may be a privacy "
                           "ledger, which the model must not replace; choose another --out") from None
        if starts_like_ledger(first):
            raise FitError(f"--out {path} is a privacy ledger (its first line begins like a ledger line): writing "
                           "the model there would erase the record of the spent budget; choose another --out")

    def reserve(self) -> None:
        """Create the directory and the temporary file (FitError when they cannot be)."""
        import os
        import tempfile

        # recorded before mkdir, so a failure partway (a name too long deeper down) still removes what it made
        self._created = [p for p in self._target.parents if not p.exists()]  # deepest first
        try:
            self._target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self._target.parent, prefix=f".{self._target.name}.", suffix=".partial")
        except OSError as exc:
            self.discard()
            raise FitError(f"--out {self.path} cannot be written: {exc.strerror or exc}") from exc
        os.close(fd)
        self._tmp = Path(tmp)

    def write(self, data: bytes) -> str | None:
        """Write ``data`` to the target atomically and durably (the file, then its directory,
        fsynced); on failure print it to stdout. Returns ``None`` when the target holds it, else
        why it could not be written."""
        import os

        from stream_vips.privacy.ledger import fsync_dir

        try:
            if self._tmp is None:
                raise OSError("no temporary file was reserved")
            try:  # an existing file keeps its mode (a private 0600 model stays private)
                mode = os.stat(self._target).st_mode & 0o7777
            except FileNotFoundError:
                mask = os.umask(0)
                os.umask(mask)
                mode = 0o666 & ~mask
            with open(self._tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(self._tmp, mode)
            os.replace(self._tmp, self._target)
            self._tmp, self._written = None, True
        except OSError as exc:
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
            return str(exc.strerror or exc)
        try:  # the rename itself must survive a crash; the file is whole either way
            fsync_dir(self._target.parent)
        except OSError as exc:
            print(f"stream-vips fit: warning: --out {self.path} is written, but its directory could not be synced "
                  f"({exc.strerror or exc}): a crash soon after may lose the rename", file=sys.stderr)
        return None

    def discard(self) -> None:
        """Remove the reserved temporary file if it is still there (no partial output) and, when
        no model was written, the directories :meth:`reserve` created (a refused fit leaves nothing)."""
        import os

        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)
            self._tmp = None
        if not self._written:
            for directory in self._created:
                try:
                    directory.rmdir()
                except OSError:
                    if os.path.isdir(directory):  # no longer empty: something else put a file there
                        break
                    # never made: mkdir failed before it (or its name is too long to exist)
        self._created = []


def _resolve(path: Path, flag: str) -> Path:
    """``path`` made absolute with its symlinks followed; a symlink loop is a FitError (one line)."""
    try:
        return path.resolve()
    except (RuntimeError, OSError) as exc:  # RuntimeError: a symlink loop before Python 3.13
        raise FitError(f"{flag} {path} cannot be resolved ({getattr(exc, 'strerror', None) or exc}): "
                       "a symlink loop? give a path that leads to a file") from None


def _is_stdin(path: Path) -> bool:
    """``path`` exists and is the file on standard input (same device and inode)."""
    import os

    try:
        st, out = os.fstat(0), os.stat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (out.st_dev, out.st_ino)


def _same_file(a: Path, b: Path) -> bool:
    """Both exist and are the same file (a hard link has another resolved path)."""
    try:
        return a.exists() and b.exists() and a.samefile(b)
    except OSError:
        return False
