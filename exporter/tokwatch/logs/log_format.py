"""Log line formats: `text` (time level logger: message) for a terminal, `json` (one object a line: time,
level, logger, message and the record's structured fields) for a fleet's log pipeline (Loki, Elastic)."""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Literal

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")

# Attributes every LogRecord has: anything else on a record came from `extra=` and is a structured field.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def structured_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a record was logged with (`extra=`), without private ones (leading underscore or the
    throttle's marks)."""
    return {
        k: v
        for k, v in vars(record).items()
        if k not in _STANDARD and not k.startswith("_") and not k.startswith("tokwatch_")
    }


class JsonFormatter(logging.Formatter):
    """One JSON object per line: `time` (UTC, RFC 3339 with milliseconds), `level`, `logger`, `message`,
    then the record's structured fields and `exception` (the traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line: dict[str, Any] = {
            "time": f"{seconds}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in structured_fields(record).items():
            line.setdefault(key, value)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = record.exc_text
        return json.dumps(line, default=str, ensure_ascii=False)


def formatter(fmt: LogFormat) -> logging.Formatter:
    """The formatter of a `--log-format`."""
    if fmt == "json":
        return JsonFormatter()
    return logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
