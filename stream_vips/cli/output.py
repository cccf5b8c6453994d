"""Output files of the commands: checked before anything is spent, written so a failure loses nothing."""

from __future__ import annotations

import os
from pathlib import Path


def write_summary(path: str, text: str) -> str | None:
    """Write the JSON summary ``text`` to ``path`` (``--json-summary``); why it failed, or ``None``.
    The summary was already printed, so a failure (a full disk) loses nothing."""
    try:
        Path(path).write_text(text + "\n", encoding="utf-8")
    except OSError as exc:
        return f"--json-summary {path}: cannot write it: {exc.strerror or exc} (the summary is above)"
    return None


def output_file_problem(path: str, flag: str) -> str | None:
    """Why the file ``path`` given to ``flag`` cannot be written at the end of a run (it is not
    a file, or its directory is missing or not writable), or ``None``: checked before the run
    starts, so a mistyped path costs no privacy budget. ``-`` (stdout) is always fine.

    >>> output_file_problem("/", "--json-summary")
    '--json-summary /: is a directory; name a file'
    >>> output_file_problem("/no/such/dir/s.json", "--json-summary")
    '--json-summary /no/such/dir/s.json: directory /no/such/dir does not exist'
    """
    if path == "-":
        return None
    target = Path(path)
    parent = target.parent
    if target.is_dir():
        return f"{flag} {path}: is a directory; name a file"
    if not parent.is_dir():
        return f"{flag} {path}: directory {parent} does not exist"
    if not os.access(target if target.exists() else parent, os.W_OK):
        return f"{flag} {path}: not writable"
    return None
