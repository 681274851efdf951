"""Log output: one JSON object per line off-terminal (log shippers), readable text on a terminal.

Structured fields travel in ``extra``: ``log.info("round closed", extra={"campaign_id": c, "round": r})``
puts ``campaign_id`` and ``round`` into the JSON object (and after the message in text mode).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

__all__ = ["JsonFormatter", "TextFormatter", "configure_logging", "resolve_log_format"]

#: Attributes every ``LogRecord`` has; anything else on a record came from ``extra``.
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}
_HANDLER_MARK = "_ldp_collector_handler"


def _extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    """Format a record as one JSON line: ``ts`` (RFC 3339 UTC), ``level``, ``logger``, ``msg``,
    the ``extra`` fields, and ``exc`` with the traceback if any."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        out: dict[str, Any] = {
            "ts": f"{ts}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in _extra_fields(record).items():
            out.setdefault(key, value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """``HH:MM:SS LEVEL logger: message key=value ...`` for people at a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s", datefmt="%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        extra = _extra_fields(record)
        if extra:
            text += " " + " ".join(f"{k}={v}" for k, v in extra.items())
        return text


def resolve_log_format(log_format: str, stream: TextIO) -> str:
    """``json`` or ``text``: ``auto`` picks JSON unless ``stream`` is a terminal."""
    if log_format not in ("auto", "json", "text"):
        raise ValueError(f"log_format must be auto, json or text, got {log_format!r}")
    if log_format != "auto":
        return log_format
    isatty = getattr(stream, "isatty", None)
    return "text" if callable(isatty) and isatty() else "json"


def configure_logging(log_format: str = "auto", level: str | int = "INFO", stream: TextIO | None = None) -> None:
    """Send the root logger's records to ``stream`` (default stderr) in the chosen format.

    Idempotent: a handler installed by an earlier call is replaced, other handlers are kept.

    Parameters
    ----------
    log_format : {"auto", "json", "text"}
    level : str or int
        Root logger level (``"INFO"``, ``logging.DEBUG`` ...).
    stream : text stream, optional
    """
    stream = sys.stderr if stream is None else stream
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if resolve_log_format(log_format, stream) == "json" else TextFormatter())
    setattr(handler, _HANDLER_MARK, True)
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, _HANDLER_MARK, False):
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
