"""The exception root: every error stream_vips raises on purpose is a :class:`StreamVipsError`.

Each one also keeps the built-in base its callers have always caught (``ValueError`` for bad
input and configuration, ``RuntimeError`` for a state that refuses to go on), so
``except StreamVipsError`` catches everything of ours and ``except ValueError`` still works.
"""

from __future__ import annotations


class StreamVipsError(Exception):
    """Root of the errors stream_vips raises on purpose."""


class ConfigError(StreamVipsError, ValueError):
    """Bad configuration, raised at start; the message names the key."""


class FitError(StreamVipsError, ValueError):
    """``fit`` refused its input or arguments (before spending anything), or made no model."""


class DataError(StreamVipsError, ValueError):
    """Data that cannot be taken as records (a ``str`` for many records, misshaped arrays); none of
    it was fed."""


class StepRefused(StreamVipsError, RuntimeError):
    """A step asked for where the privacy accounting cannot cover it (under window accounting,
    sooner than ``schedule.every_records`` arrivals after the last); nothing was spent."""
