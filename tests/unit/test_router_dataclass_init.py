"""The request path's per-request dataclasses write their own `__init__`, and it takes their fields.

A dataclass's generated `__init__` is Python source made at import time, so mypyc cannot compile it:
in the compiled router each of these would be built by interpreted Python on every request, where a
written-out `__init__` compiles to a native one. Written out, it must still take exactly the
dataclass's fields, with the same defaults, and set every field: checked here in both builds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from typing import Any

import pytest

from specfleet_runtime.router.affinity import Choice, Limits, PrefixKeys
from specfleet_runtime.router.body_fields import BodyFields
from specfleet_runtime.router.classify import Classification, Reason, RequestFacts, _ClientState
from specfleet_runtime.router.intake import BodyHold
from specfleet_runtime.router.message import Headers, Request
from specfleet_runtime.router.proxy import RequestResult, _EngineRequest
from specfleet_runtime.router.reply import Reply


class _Connection:
    """Just enough of a server connection for a `Request` to be built."""

    task: asyncio.Task[None] | None = None

    def pause_reading(self) -> None:
        pass


def _request() -> Request:
    return Request(_Connection(), "POST", "/v1/completions", Headers([]), None, True, True, None)  # type: ignore[arg-type]


# Each class with the arguments its required fields get (of the types the compiled build checks).
REQUIRED: dict[type, dict[str, Any]] = {
    RequestResult: {"status": 200, "pool": "latency"},
    _EngineRequest: {
        "request": _request(),
        "target": "/v1/completions",
        "body": b"{}",
        "headers": [],
        "classification": Classification("latency", Reason.DEFAULT),
        "started": None,
    },
    BodyFields: {"fields": {}},
    RequestFacts: {"client_id": "client"},
    _ClientState: {},
    PrefixKeys: {"leading": 7},
    Limits: {"ring": 1, "home": 2, "conversation": 3},
    Choice: {"url": "http://a", "how": "home"},
    Reply: {"status": 200},
    BodyHold: {"request": _request(), "last": 1.5},
    Request: {
        "connection": _Connection(),
        "method": "POST",
        "target": "/v1/completions",
        "headers": Headers([]),
        "remote": None,
        "keep_alive": True,
        "http11": True,
        "content_length": None,
    },
}


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


@pytest.mark.parametrize("cls", list(REQUIRED), ids=lambda cls: cls.__name__)
def test_written_out_init_sets_every_field(cls: type) -> None:
    assert dataclasses.is_dataclass(cls)
    assert "__init__" in cls.__dict__
    init = cls.__dict__["__init__"]
    if hasattr(init, "__code__"):  # the source build: not dataclasses' generated one
        assert init.__code__.co_filename == inspect.getsourcefile(cls)
    required = REQUIRED[cls]
    built = cls(**required)
    for field in dataclasses.fields(cls):
        expected = required[field.name] if field.name in required else _default(field)
        assert (
            field.name in required
            or field.default is not dataclasses.MISSING
            or (field.default_factory is not dataclasses.MISSING)
        ), f"{cls.__name__}.{field.name} has no default and no test argument"
        assert getattr(built, field.name) == expected, f"{cls.__name__}.{field.name}"


@pytest.mark.parametrize("cls", list(REQUIRED), ids=lambda cls: cls.__name__)
def test_written_out_init_takes_the_fields(cls: type) -> None:
    init = cls.__dict__["__init__"]
    if not hasattr(init, "__code__"):
        pytest.skip("the compiled build shows no signature (*args, **kwargs); the source build checks it")
    params = [p for p in inspect.signature(init).parameters.values() if p.name != "self"]
    fields = [f for f in dataclasses.fields(cls) if f.init]
    assert [p.name for p in params] == [f.name for f in fields]
    for param, field in zip(params, fields, strict=True):
        expected = inspect.Parameter.empty if field.default is dataclasses.MISSING else field.default
        assert param.default == expected, f"{cls.__name__}.{field.name}"
        assert field.default_factory is dataclasses.MISSING, f"{cls.__name__}.{field.name}: a factory"
