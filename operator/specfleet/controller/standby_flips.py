"""A Standby pool's flip carried out (the I/O of `specfleet.reconcile.standby_flip`).

The operator labels a pod out of its pool's Services, waits for its engine to empty, and switches
engines over vLLM's sleep API (`POST /sleep?level=1`, `POST /wake_up`, `GET /is_sleeping`; routes
of vLLM's server under VLLM_SERVER_DEV_MODE=1, which the emulator serves the same way), checks the
woken engine with a completion (and, after a flip On, its acceptance against the pool's baseline),
then labels the pod into the new engine's Service. A switch that fails puts the pod back on the
engine it came from; the caller then stops flipping the pool by Standby.

Level 1 only: level 2 loses an EAGLE-3 drafter's weights (vllm#52479). Pod IPs are dialed through an
address map (as the router's `--endpoint-address-map`), so a test bed whose pod IPs are not routable
maps them to loopback twins.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from specfleet.reconcile.standby_flip import (
    FLIP_ANNOTATION,
    FLIPPING,
    FlipMark,
    Replica,
    Setting,
    Step,
    engine_port,
    next_steps,
    other,
    replica_of,
    settled,
)
from specfleet_runtime import vllm_metrics as vm
from specfleet_runtime.names import LABEL_SPECULATION
from specfleet_runtime.router.endpoints import AddressMap, map_address

logger = logging.getLogger(__name__)

# Completions that measure a woken speculating engine's acceptance, and their length: enough drafts
# (~30 per completion at K 3) to tell a working drafter from one whose weights did not come back.
CHECK_COMPLETIONS = 4
CHECK_TOKENS = 32
# A woken drafter must reach this share of the baseline's accepted tokens per draft (acceptance
# length - 1); a drafter whose weights were lost (vllm#52479) accepts next to none.
ACCEPTANCE_TOLERANCE = 0.5
CHECK_PROMPT = "Write one sentence about the sea."
Manifest = dict[str, Any]


class SwitchError(Exception):
    """An engine did not do what the switch asked: the message says which and what it answered."""


@dataclass(frozen=True)
class EngineClient:
    """One vLLM engine of a pod, over HTTP."""

    url: str  # http://ip:port
    timeout: float = 30.0

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()
        except (urllib.error.URLError, OSError) as err:
            raise SwitchError(f"{method} {self.url}{path}: {err}") from None

    def _ok(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> bytes:
        status, text = self._call(method, path, body)
        if status != 200:
            raise SwitchError(f"{method} {path} answered {status}: {text[:200].decode(errors='replace')}")
        return text

    def metrics(self) -> dict[str, float]:
        """Each sample of /metrics summed by metric name (labels dropped)."""
        out: dict[str, float] = {}
        for line in self._ok("GET", "/metrics").decode().splitlines():
            if not line or line.startswith("#"):
                continue
            name_labels, _, value = line.rpartition(" ")
            name = name_labels.split("{", 1)[0]
            try:
                out[name] = out.get(name, 0.0) + float(value)
            except ValueError:
                continue
        return out

    def in_flight(self) -> float:
        m = self.metrics()
        return m.get(vm.REQUESTS_RUNNING, 0.0) + m.get(vm.REQUESTS_WAITING, 0.0)

    def is_sleeping(self) -> bool:
        return bool(json.loads(self._ok("GET", "/is_sleeping")).get("is_sleeping"))

    def sleep(self) -> None:
        self._ok("POST", "/sleep?level=1")
        if not self.is_sleeping():
            raise SwitchError("POST /sleep?level=1 answered 200 but /is_sleeping says awake")

    def wake(self) -> None:
        self._ok("POST", "/wake_up")
        if self.is_sleeping():
            raise SwitchError("POST /wake_up answered 200 but /is_sleeping says asleep")

    def complete(self, model: str, max_tokens: int) -> None:
        body = {"model": model, "prompt": CHECK_PROMPT, "max_tokens": max_tokens, "temperature": 0}
        reply = json.loads(self._ok("POST", "/v1/completions", body))
        if not reply.get("choices"):
            raise SwitchError(f"a check completion came back without choices: {str(reply)[:200]}")


@dataclass(frozen=True)
class SwitchResult:
    ok: bool
    why: str = ""
    # Acceptance length the woken speculating engine measured over the check (None: not checked).
    acceptance_length: float | None = None


def acceptance_length(engine: EngineClient, model: str) -> float | None:
    """The woken engine's acceptance length over the check completions, sent at once (one batch: the
    check costs one completion's time, not four, while the pod is out of its Services)."""
    before = engine.metrics()
    with ThreadPoolExecutor(CHECK_COMPLETIONS) as pool:
        list(pool.map(lambda _: engine.complete(model, CHECK_TOKENS), range(CHECK_COMPLETIONS)))
    after = engine.metrics()
    drafts = after.get(vm.SPEC_DRAFTS, 0.0) - before.get(vm.SPEC_DRAFTS, 0.0)
    accepted = after.get(vm.SPEC_ACCEPTED_TOKENS, 0.0) - before.get(vm.SPEC_ACCEPTED_TOKENS, 0.0)
    return None if drafts <= 0 else 1 + accepted / drafts


def engine_url(address: str, setting: str) -> str:
    """The URL of a pod's engine that serves `setting`."""
    return f"http://{address}:{engine_port(setting)}"


def switch_engines(
    urls: Mapping[str, str], to: Setting, model: str, baseline_length: float | None, timeout: float = 120.0
) -> SwitchResult:
    """Sleep the engine serving `other(to)`, wake the one for `to` and check it; on a failure put the
    pod back on the engine it came from (best effort) and say why. `urls`: each setting's engine."""
    source = EngineClient(urls[other(to)], timeout)
    target = EngineClient(urls[to], timeout)
    length = None
    try:
        source.sleep()
        target.wake()
        target.complete(model, 1)
        if to == "On":
            length = acceptance_length(target, model)
            if baseline_length is not None and baseline_length > 1:
                floor = 1 + ACCEPTANCE_TOLERANCE * (baseline_length - 1)
                if length is None or length < floor:
                    shown = "no drafts" if length is None else f"{length:.2f}"
                    raise SwitchError(
                        f"the woken drafter's acceptance length is {shown}, below {floor:.2f} "
                        f"({ACCEPTANCE_TOLERANCE:.0%} of the baseline {baseline_length:.2f}'s gain)"
                    )
        return SwitchResult(True, acceptance_length=length)
    except SwitchError as err:
        why = str(err)
    for undo in (target.sleep, source.wake):
        try:
            undo()
        except SwitchError as err:
            logger.warning("standby revert of %s: %s", urls[to], err)
    return SwitchResult(False, why, length)


class PodsApi(Protocol):
    """What the flip needs of the Kubernetes API."""

    def pods(self, namespace: str, labels: Mapping[str, str]) -> list[Manifest]:
        """The pods carrying all `labels`."""

    def endpoint_slices(self, namespace: str, labels: Mapping[str, str]) -> list[Manifest]:
        """The EndpointSlices carrying all `labels` (Services copy their labels onto their slices)."""

    def patch_pod(
        self,
        namespace: str,
        name: str,
        labels: Mapping[str, str | None],
        annotations: Mapping[str, str | None],
    ) -> None:
        """Merge-patch the pod's labels and annotations (None deletes a key)."""


@dataclass(frozen=True)
class KubePods:
    """`PodsApi` over the operator's `KubeCluster` (or anything with its three methods)."""

    cluster: Any  # controller.kube.KubeCluster

    def pods(self, namespace: str, labels: Mapping[str, str]) -> list[Manifest]:
        items: list[Manifest] = self.cluster.list_children("v1", "Pod", namespace, labels)
        return items

    def endpoint_slices(self, namespace: str, labels: Mapping[str, str]) -> list[Manifest]:
        items: list[Manifest] = self.cluster.list_children(
            "discovery.k8s.io/v1", "EndpointSlice", namespace, labels
        )
        return items

    def patch_pod(
        self,
        namespace: str,
        name: str,
        labels: Mapping[str, str | None],
        annotations: Mapping[str, str | None],
    ) -> None:
        self.cluster.patch_pod_metadata(namespace, name, labels, annotations)


@dataclass
class Tick:
    """What one pass over a pool did."""

    steps: list[Step] = field(default_factory=list)
    # (pod, seconds from its drain's start to serving the new setting)
    finished: list[tuple[str, float]] = field(default_factory=list)
    # Seconds each finished pod's switch took (sleep, wake, check: the flip less its drain, which
    # depends on the load at the time)
    switched: list[float] = field(default_factory=list)
    # (pod, why): a switch that failed and was put back
    reverted: list[tuple[str, str]] = field(default_factory=list)
    settled: bool = False


def _listed(slices: Sequence[Manifest]) -> set[str]:
    names = set()
    for s in slices:
        for ep in s.get("endpoints") or []:
            ref = ep.get("targetRef") or {}
            if ref.get("kind") == "Pod" and (ep.get("conditions") or {}).get("ready", True):
                names.add(ref.get("name", ""))
    return names


def seen_name(pod: Manifest) -> str:
    return str((pod.get("metadata") or {}).get("name", ""))


@dataclass
class StandbyFlipper:
    """Drives every flip of Standby pools, one pass per call to `tick`."""

    api: PodsApi
    address_map: AddressMap = ()
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    # A pod's engine for a setting, from its (mapped) address.
    engine_url: Callable[[str, str], str] = engine_url

    def _urls(self, address: str) -> dict[str, str]:
        return {s: self.engine_url(address, s) for s in ("On", "Off")}

    def _replica(self, pod: Manifest, listed: set[str]) -> tuple[Replica, str | None]:
        seen = replica_of(pod, listed=seen_name(pod) in listed)
        ip = (pod.get("status") or {}).get("podIP")
        address = map_address(ip, self.address_map) if ip else None
        if seen.mark is not None and address is not None and not seen.listed:
            try:
                in_flight = EngineClient(self._urls(address)[other(seen.mark.to)], 5.0).in_flight()
                seen = replace(seen, in_flight=in_flight)
            except SwitchError as err:
                logger.info("standby drain of %s: %s", seen.pod, err)
        return seen, address

    def tick(
        self,
        namespace: str,
        selector: Mapping[str, str],
        desired: Setting,
        model: str,
        baseline_length: float | None = None,
    ) -> Tick:
        """One pass: read the pool's pods, then begin, advance or finish their flips toward `desired`."""
        now = self.clock()
        pods = self.api.pods(namespace, selector)
        listed = _listed(self.api.endpoint_slices(namespace, selector))
        seen = [self._replica(p, listed) for p in pods]
        grace = {
            (p.get("metadata") or {}).get("name", ""): float(
                (p.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
            )
            for p in pods
        }
        replicas = [r for r, _ in seen]
        addresses = {r.pod: a for r, a in seen}
        out = Tick()
        # One grace for the pool: its pods share a template.
        steps = next_steps(desired, replicas, now, min(grace.values(), default=30.0))
        out.steps = steps
        for step in steps:
            if step.kind == "Begin":
                begun = FlipMark(step.to, now)
                self.api.patch_pod(
                    namespace, step.pod, {LABEL_SPECULATION: FLIPPING}, {FLIP_ANNOTATION: begun.text()}
                )
                logger.info("standby flip of %s to %s: draining", step.pod, step.to)
            elif step.kind == "Switch":
                address = addresses.get(step.pod)
                switch_began = self.clock()
                result = (
                    SwitchResult(False, "the pod has no IP")
                    if address is None
                    else switch_engines(self._urls(address), step.to, model, baseline_length)
                )
                since = next(r.mark.since for r in replicas if r.pod == step.pod and r.mark is not None)
                if result.ok:
                    self.api.patch_pod(
                        namespace, step.pod, {LABEL_SPECULATION: step.to}, {FLIP_ANNOTATION: None}
                    )
                    seconds = (self.clock() - since).total_seconds()
                    out.finished.append((step.pod, seconds))
                    out.switched.append((self.clock() - switch_began).total_seconds())
                    logger.info("standby flip of %s to %s: serving after %.1f s", step.pod, step.to, seconds)
                else:
                    back = other(step.to)
                    self.api.patch_pod(
                        namespace, step.pod, {LABEL_SPECULATION: back}, {FLIP_ANNOTATION: None}
                    )
                    out.reverted.append((step.pod, result.why))
                    logger.warning(
                        "standby flip of %s to %s failed, back to %s: %s", step.pod, step.to, back, result.why
                    )
        out.settled = not steps and settled(desired, replicas)
        return out
