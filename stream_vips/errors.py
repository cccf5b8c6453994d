"""The exception root: every error stream_vips raises on purpose is a :class:`StreamVipsError`.

Each one also keeps the built-in base its callers have always caught (``ValueError`` for bad
input and configuration, ``RuntimeError`` for a state that refuses to go on), so
``except StreamVipsError`` catches everything of ours and ``except ValueError`` still works.
"""

from __future__ import annotations

from typing import Any


class StreamVipsError(Exception):
    """Root of the errors stream_vips raises on purpose."""


class ConfigError(StreamVipsError, ValueError):
    """Bad configuration, raised at start; the message names the key."""


class FitError(StreamVipsError, ValueError):
    """``fit`` refused its input or arguments (before spending anything), or made no model."""


class NoModelError(FitError):
    """The fit ran but released no model; the message says why (the learner's halt reason)."""


class LedgerRefused(FitError):
    """The ledger path is not a usable privacy ledger (a directory, another kind of file, corrupt,
    or locked by another process); raised before anything is spent."""


class SpentError(FitError):
    """The fit failed once a step was paid (during the run or after it). ``message`` is the model
    of the last paid step (``None`` when no model was made): its budget is spent, so keep it
    (``stream_vips.client.posterior_from_message`` reads it). ``headline`` is the one line saying
    what failed (without "budget" for a non-private fit, which spends none)."""

    def __init__(self, error: str, message: dict[str, Any] | None, non_private: bool = False) -> None:
        self.headline = (f"the non-private fit failed after it made a model ({error})" if non_private else
                         f"the fit failed after privacy budget was spent ({error})")
        kept = "the last model is kept" if message is not None else "no model had been made"
        super().__init__(f"{self.headline}; {kept} (.message)")
        self.error, self.message = error, message


def error_text(exc: BaseException) -> str:
    """``exc`` as one line: its type and message."""
    return " ".join(f"{type(exc).__name__}: {exc}".splitlines())


class DataError(StreamVipsError, ValueError):
    """Data that cannot be taken as records (a ``str`` for many records, misshaped arrays); none of
    it was fed."""


class ReservoirNotFull(StreamVipsError, RuntimeError):
    """No release before the reservoir holds M records (privacy rule 5: q and the normaliser
    assume exactly M)."""


class StepRefused(StreamVipsError, RuntimeError):
    """A step asked for where the privacy accounting cannot cover it (under window accounting,
    sooner than ``schedule.every_records`` arrivals after the last); nothing was spent."""
