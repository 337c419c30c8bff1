"""Where the router's inputs come from: the routing config (a file or a ConfigMap) and pool endpoints.

Sources only deliver raw inputs; the router validates them, so a bad config is rejected in one place
(with a log line) and the last good one stays in force.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from specfleet_runtime.router.kube import (
    Informer,
    ListWatchClient,
    Object,
    endpoint_slice_client,
)
from specfleet_runtime.routing_config import ROUTING_CONFIG_KEY

log = logging.getLogger(__name__)

# deliver(text, origin): text is None when the source exists but holds no routing config.
ConfigDeliver = Callable[[str | None, str], object]
SlicePublish = Callable[[list[Object]], None]


class ConfigSource(Protocol):
    """Runs until cancelled, calling `deliver` on the event loop whenever the config text may have changed."""

    description: str

    async def run(self, deliver: ConfigDeliver) -> None: ...


class ConfigFileSource:
    """A JSON file (for example a mounted ConfigMap key), re-read every `poll_seconds`.

    The content is compared, not the mtime: a ConfigMap volume swaps a symlink, and a small file costs
    nothing to read.
    """

    def __init__(self, path: Path, poll_seconds: float = 2.0) -> None:
        self.path = path
        self.poll_seconds = poll_seconds
        self.description = f"file {path}"

    async def run(self, deliver: ConfigDeliver) -> None:
        last_text: str | None = None
        missing_logged = False
        while True:
            try:
                # Undecodable bytes become U+FFFD, so the router rejects them as a bad config.
                text = self.path.read_bytes().decode("utf-8", errors="replace")
            except OSError as err:
                if not missing_logged:
                    log.warning(
                        "cannot read routing config %s (%s); keeping the last good one", self.path, err
                    )
                    missing_logged = True
            else:
                missing_logged = False
                if text != last_text:
                    last_text = text
                    deliver(text, self.description)
            await asyncio.sleep(self.poll_seconds)


class ConfigMapSource:
    """The `routing.json` key of one ConfigMap, watched through the Kubernetes API."""

    def __init__(
        self,
        client: ListWatchClient,
        namespace: str,
        name: str,
        resync_seconds: int = 300,
        key: str = ROUTING_CONFIG_KEY,
        on_error: Callable[[BaseException], object] | None = None,
    ) -> None:
        self._client = client
        self._on_error = on_error
        self._key = key
        self._resync_seconds = resync_seconds
        self.description = f"configmap {namespace}/{name}"

    async def run(self, deliver: ConfigDeliver) -> None:
        loop = asyncio.get_running_loop()

        def publish(objects: list[Object]) -> None:
            text: str | None = None
            for obj in objects:
                data = obj.get("data") or {}
                value = data.get(self._key)
                text = value if isinstance(value, str) else None
            loop.call_soon_threadsafe(deliver, text, self.description)

        informer = Informer(
            self.description, self._client, publish, self._resync_seconds, on_error=self._on_error
        ).start()
        try:
            await asyncio.Event().wait()
        finally:
            informer.stop()


class EndpointWatch(Protocol):
    """A running watch of one Service's EndpointSlices."""

    def stop(self) -> None: ...


# (namespace, service, publish) -> a started watch that calls publish(slices) from any thread.
SliceWatchFactory = Callable[[str, str, SlicePublish], EndpointWatch]


class KubeSliceWatchFactory:
    """Starts one `Informer` per Service; the API client is created on first use, then shared."""

    def __init__(
        self,
        api_client_provider: Callable[[], Any],
        resync_seconds: int = 300,
        on_error: Callable[[BaseException], object] | None = None,
    ) -> None:
        self._provider = api_client_provider
        self._on_error = on_error
        self._api_client: Any = None
        self._lock = threading.Lock()
        self._resync_seconds = resync_seconds

    def __call__(self, namespace: str, service: str, publish: SlicePublish) -> EndpointWatch:
        with self._lock:
            if self._api_client is None:
                self._api_client = self._provider()
        client = endpoint_slice_client(self._api_client, namespace, service)
        name = f"endpointslices {namespace}/{service}"
        return Informer(name, client, publish, self._resync_seconds, on_error=self._on_error).start()
