"""Kubernetes list-and-watch for the router: EndpointSlices of pool Services and the routing ConfigMap.

`Informer` is the loop (list, publish, watch and publish every change, relist on watch end or error,
back off on errors, log every failure); it only talks to a `ListWatchClient`, so tests drive it with a
fake and the cluster tier drives it with `KubeListWatch` against a real apiserver. The official
client is synchronous, so each informer runs in a daemon thread and hands snapshots to a callback;
the router wraps that callback with `loop.call_soon_threadsafe`.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

from specfleet_runtime.router.endpoints import SERVICE_NAME_LABEL

log = logging.getLogger(__name__)

Object = dict[str, Any]
WatchEvent = tuple[str, Object]
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class ListWatchClient(Protocol):
    """The two API calls an informer needs."""

    def list_objects(self) -> tuple[list[Object], str]:
        """Current objects and the list's resourceVersion."""
        ...

    def watch_events(self, resource_version: str, timeout_seconds: int) -> Iterable[WatchEvent]:
        """Events (type, object) after `resource_version`; ends when the server closes the watch."""
        ...


class WatchExpired(Exception):
    """The watch's resourceVersion is too old (HTTP 410): relist at once, no backoff needed."""


def _key(obj: Object) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class Informer:
    """List, then watch; keep a cache by namespace/name; `publish(snapshot)` after every change."""

    def __init__(
        self,
        name: str,
        client: ListWatchClient,
        publish: Callable[[list[Object]], None],
        resync_seconds: int = 300,
        backoff_initial: float = 1.0,
        backoff_max: float = 30.0,
        on_error: Callable[[BaseException], object] | None = None,
    ) -> None:
        self.name = name
        # Called (from the watch thread) for every failure, after it is logged: a metric, typically.
        self._on_error = on_error
        self._client = client
        self._publish = publish
        self._resync_seconds = resync_seconds
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failures = 0

    def start(self) -> Informer:
        # Daemon: a thread blocked in a watch read must not keep the process alive at exit.
        self._thread = threading.Thread(target=self.run, name=f"informer-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ask the loop to end; it does at the next event, error or watch timeout."""
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def run(self) -> None:
        backoff = self._backoff_initial
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self._list_and_watch()
                backoff = self._backoff_initial
            except WatchExpired:
                log.info("informer %s: watch expired, relisting", self.name)
            except Exception as err:
                self.failures += 1
                log.exception("informer %s: list/watch failed, retrying in %.1fs", self.name, backoff)
                if self._on_error is not None:
                    self._on_error(err)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self._backoff_max)
                continue
            # A watch that ends at once, time after time, must not become a busy loop of lists.
            if time.monotonic() - started < self._backoff_initial:
                self._stop.wait(self._backoff_initial)
        log.info("informer %s stopped", self.name)

    def _list_and_watch(self) -> None:
        items, resource_version = self._client.list_objects()
        cache = {_key(obj): obj for obj in items}
        self._emit(cache)
        # The watch ends after resync_seconds; the loop then relists, which is the periodic resync.
        for event_type, obj in self._client.watch_events(resource_version, self._resync_seconds):
            if self._stop.is_set():
                return
            if event_type == "ERROR":
                if obj.get("code") == 410:
                    raise WatchExpired()
                raise RuntimeError(f"watch error event: {obj.get('message', obj)}")
            if event_type in ("ADDED", "MODIFIED"):
                cache[_key(obj)] = obj
            elif event_type == "DELETED":
                cache.pop(_key(obj), None)
            elif event_type != "BOOKMARK":
                log.warning("informer %s: ignoring watch event of type %r", self.name, event_type)
                continue
            if event_type != "BOOKMARK":
                self._emit(cache)

    def _emit(self, cache: dict[str, Object]) -> None:
        if not self._stop.is_set():
            self._publish(list(cache.values()))


class KubeListWatch:
    """`ListWatchClient` over one namespaced list call of the official client, with selectors."""

    def __init__(
        self,
        list_call: Callable[..., Any],
        namespace: str,
        label_selector: str | None = None,
        field_selector: str | None = None,
        connect_timeout: float = 10.0,
    ) -> None:
        self._list_call = list_call
        self._namespace = namespace
        self._selectors: dict[str, str] = {}
        if label_selector:
            self._selectors["label_selector"] = label_selector
        if field_selector:
            self._selectors["field_selector"] = field_selector
        self._connect_timeout = connect_timeout

    def list_objects(self) -> tuple[list[Object], str]:
        response = self._list_call(
            self._namespace,
            _preload_content=False,
            _request_timeout=(self._connect_timeout, 60),
            **self._selectors,
        )
        doc = json.loads(response.data)
        return list(doc.get("items") or []), str(doc["metadata"]["resourceVersion"])

    def watch_events(self, resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        # The official client is untyped.
        stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
            self._list_call,
            self._namespace,
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
            allow_watch_bookmarks=True,
            # A read timeout a little past the server's watch timeout: a dead connection cannot hang us.
            _request_timeout=(self._connect_timeout, timeout_seconds + 30),
            **self._selectors,
        )
        try:
            for event in stream:
                yield str(event["type"]), dict(event["raw_object"])
        except ApiException as err:
            if err.status == 410:
                raise WatchExpired() from err
            raise


def load_api_client(kubeconfig: str | None) -> Any:
    """An official-client ApiClient: the given kubeconfig, else in-cluster, else ~/.kube/config."""
    from kubernetes import client, config

    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        return client.ApiClient(configuration)
    return config.new_client_from_config()  # type: ignore[no-untyped-call]


def default_namespace() -> str:
    """The pod's own namespace when running in a cluster, else `default`."""
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def endpoint_slice_client(api_client: Any, namespace: str, service: str) -> KubeListWatch:
    from kubernetes import client

    return KubeListWatch(
        client.DiscoveryV1Api(api_client).list_namespaced_endpoint_slice,
        namespace,
        label_selector=f"{SERVICE_NAME_LABEL}={service}",
    )


def config_map_client(api_client: Any, namespace: str, name: str) -> KubeListWatch:
    from kubernetes import client

    return KubeListWatch(
        client.CoreV1Api(api_client).list_namespaced_config_map,
        namespace,
        field_selector=f"metadata.name={name}",
    )
