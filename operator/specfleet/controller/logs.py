"""The operator's log format: one JSON object per line, whatever a message contains.

A format string that pastes the message between quotes breaks on the first `"` or newline in a
message (an apiserver error, a traceback). This formatter builds the object and lets `json` escape it.
Kopf's per-object loggers attach the object they are about (`k8s_ref`); it becomes `object`.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any


class JsonFormatter(logging.Formatter):
    """time, level, logger, message, and where present object, exception and stack."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        ref = getattr(record, "k8s_ref", None)
        if isinstance(ref, dict):
            entry["object"] = {k: ref[k] for k in ("kind", "namespace", "name") if ref.get(k)}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str)


def configure_json_logging(level: int) -> None:
    """Every logger (ours, Kopf's, the clients') writes JSON lines to stderr; Python warnings too."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.captureWarnings(True)
