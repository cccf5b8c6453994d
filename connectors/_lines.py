"""What the line-oriented connectors (jsonl, stdio, synthetic, memory) share.

One JSON document per line: model messages in the strict compact form of
:func:`stream_vips.messages.dumps`, dead letters as :func:`dead_letter_to_dict`. Lines are written
in one call and flushed, so a reader (or a crash) never sees half a message.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from stream_vips.io import DeadLetter, reverse_lines
from stream_vips.messages import dumps


class PausableSource:
    """``pause``/``resume`` toggle :attr:`paused`; a paused source's ``poll`` returns no records."""

    paused: bool = False

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False


def line_value(raw: bytes) -> bytes | None:
    """A read line without its line ending, or ``None`` when it is blank (blank lines are skipped)."""
    value = raw.rstrip(b"\r\n")
    return value if value.strip() else None


def message_line(message: Mapping[str, Any]) -> str:
    """A model message as one compact JSON line (NaN or infinity raise, as in the message format)."""
    return dumps(message).decode("utf-8")


def dead_letter_to_dict(letter: DeadLetter) -> dict[str, Any]:
    """JSON form of a dead letter: reason, detail, origin and the original value.

    The value is kept as text when it is valid UTF-8, else base64 (``value_base64``); a record
    without a value (a tombstone) has ``"value": null``.
    """
    out: dict[str, Any] = {
        "reason": letter.reason,
        "detail": letter.detail,
        "origin": dict(letter.record.origin),
    }
    if letter.length is not None:
        out.update(length=letter.length, sha256=letter.sha256, truncated=letter.truncated)
    value = letter.record.value
    if value is None:
        out["value"] = None
        return out
    try:
        out["value"] = value.decode("utf-8")
    except UnicodeDecodeError:
        out["value_base64"] = base64.b64encode(value).decode("ascii")
    return out


def dead_letter_line(letter: DeadLetter) -> str:
    """A dead letter as one JSON line."""
    return json.dumps(dead_letter_to_dict(letter), default=str)


def last_message(path: str, key: str) -> dict[str, Any] | None:
    """The last model message for ``key`` in a JSON-lines file, read backwards from its end (a
    service's model file grows for months; start-up reads only its tail). A torn last line is
    skipped."""
    needle = json.dumps(key).encode()
    try:
        for line, torn in reverse_lines(path):
            if torn or needle not in line:
                continue
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict) and msg.get("model_id") == key:
                return msg
    except FileNotFoundError:
        return None
    return None


def write_lines(stream: TextIO, lines: Sequence[str]) -> None:
    """Write ``lines`` (each newline-terminated) in one call and flush; nothing for no lines."""
    if lines:
        stream.write("".join(line + "\n" for line in lines))
        stream.flush()
