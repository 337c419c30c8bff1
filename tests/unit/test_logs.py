"""The operator's log lines are JSON objects whatever the message holds."""

from __future__ import annotations

import io
import json
import logging

from specfleet.controller.logs import JsonFormatter


def _lines(emit) -> list[dict]:  # type: ignore[no-untyped-def,type-arg]
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("specfleet.test-logs")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    emit(logger)
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_quotes_newlines_and_backslashes_stay_one_valid_line() -> None:
    message = 'apiserver said "no"\n\tpath: C:\\x {"json": true}'
    [entry] = _lines(lambda log: log.warning("%s", message))
    assert entry["message"] == message
    assert entry["level"] == "WARNING"
    assert entry["logger"] == "specfleet.test-logs"
    assert entry["time"].endswith("+00:00")


def test_an_exception_is_a_field_not_extra_lines() -> None:
    def emit(log: logging.Logger) -> None:
        try:
            raise ValueError('bad "value"')
        except ValueError:
            log.exception("reconcile failed")

    [entry] = _lines(emit)
    assert entry["message"] == "reconcile failed"
    assert 'ValueError: bad "value"' in entry["exception"]


def test_kopf_object_reference_becomes_object() -> None:
    ref = {"kind": "SpeculativeDeployment", "namespace": "inference", "name": "assistant", "uid": "u"}
    [entry] = _lines(lambda log: log.info("applied", extra={"k8s_ref": ref}))
    assert entry["object"] == {"kind": "SpeculativeDeployment", "namespace": "inference", "name": "assistant"}
