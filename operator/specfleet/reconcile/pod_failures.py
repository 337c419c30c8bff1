"""Why a pool is not ready, in the words Kubernetes used: from its pods and Deployments (pure).

A pool short of ready replicas said only "ready replicas: latency 0/1". The reason is usually on the
pods (the scheduler's Unschedulable message, an image that cannot be pulled, a crash loop, an
OOM kill) or on the Deployment (ProgressDeadlineExceeded). `pool_failure` picks the most telling
one, with Kubernetes' own message, for the Ready condition and an Event.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from specfleet.api import reasons
from specfleet_runtime.standby import CANNOT_SLEEP, CANNOT_SLEEP_EXIT_CODE

# Container waiting reasons that mean "this will not start by itself", most telling first.
_WAITING = {
    "ErrImagePull": reasons.IMAGE_PULL_FAILED,
    "ImagePullBackOff": reasons.IMAGE_PULL_FAILED,
    "InvalidImageName": reasons.IMAGE_PULL_FAILED,
    "CreateContainerConfigError": reasons.CONTAINER_CONFIG_ERROR,
    "CreateContainerError": reasons.CONTAINER_CONFIG_ERROR,
    "CrashLoopBackOff": reasons.CRASH_LOOP,
}
# Order of precedence when pods fail in several ways.
_PRECEDENCE = (
    # First: it is the one the operator acts on (the pool is rendered as a Restart pool).
    reasons.STANDBY_UNAVAILABLE,
    reasons.DRAFTER_INCOMPATIBLE,
    reasons.PROGRESS_DEADLINE_EXCEEDED,
    reasons.IMAGE_PULL_FAILED,
    reasons.CONTAINER_CONFIG_ERROR,
    reasons.OOM_KILLED,
    reasons.CRASH_LOOP,
    reasons.UNSCHEDULABLE,
)


@dataclass(frozen=True)
class PoolFailure:
    reason: str
    message: str


def _pod_failures(pod: Mapping[str, Any]) -> Iterable[PoolFailure]:
    name = (pod.get("metadata") or {}).get("name", "?")
    status = pod.get("status") or {}
    for cond in status.get("conditions") or []:
        unscheduled = cond.get("type") == "PodScheduled" and cond.get("status") == "False"
        if unscheduled and cond.get("reason") == "Unschedulable":
            yield PoolFailure(reasons.UNSCHEDULABLE, f"pod {name}: {cond.get('message') or 'unschedulable'}")
    yield from _drafter_incompatible(name, status.get("initContainerStatuses") or [])
    yield from _standby_unavailable(name, status.get("containerStatuses") or [])
    for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        state = container.get("state") or {}
        waiting = state.get("waiting") or {}
        why = _WAITING.get(waiting.get("reason", ""))
        if why is not None:
            detail = waiting.get("message") or waiting["reason"]
            yield PoolFailure(
                why, f"pod {name} container {container.get('name')}: {waiting['reason']}: {detail}"
            )
        last = (container.get("lastState") or {}).get("terminated") or {}
        if (state.get("terminated") or {}).get("reason") == "OOMKilled" or last.get("reason") == "OOMKilled":
            yield PoolFailure(
                reasons.OOM_KILLED, f"pod {name} container {container.get('name')} was OOMKilled"
            )


def _drafter_incompatible(pod: str, statuses: Iterable[Mapping[str, Any]]) -> Iterable[PoolFailure]:
    """The drafter preflight's own lines from a failed init container (its log is the termination message)."""
    for container in statuses:
        for state in (container.get("state") or {}, container.get("lastState") or {}):
            terminated = state.get("terminated") or {}
            if not terminated or terminated.get("exitCode") == 0:
                continue
            prefix = f"{reasons.DRAFTER_INCOMPATIBLE}: "
            lines = [
                line.strip()[len(prefix) :]
                for line in str(terminated.get("message") or "").splitlines()
                if line.strip().startswith(prefix)
            ]
            if lines:
                yield PoolFailure(
                    reasons.DRAFTER_INCOMPATIBLE,
                    f"pod {pod} init container {container.get('name')}: the drafter does not fit the "
                    f"target: {'; '.join(lines)}",
                )
                break


def _standby_unavailable(pod: str, statuses: Iterable[Mapping[str, Any]]) -> Iterable[PoolFailure]:
    """A Standby pod's supervisor found its engine cannot sleep: its exit code and its one
    `standby: the engine cannot sleep: ...` line, in the state or the last state (a restarted one)."""
    for container in statuses:
        for state in (container.get("state") or {}, container.get("lastState") or {}):
            terminated = state.get("terminated") or {}
            if terminated.get("exitCode") != CANNOT_SLEEP_EXIT_CODE:
                continue
            lines = [
                line.strip()
                for line in str(terminated.get("message") or "").splitlines()
                if line.strip().startswith(CANNOT_SLEEP)
            ]
            if lines:
                yield PoolFailure(reasons.STANDBY_UNAVAILABLE, f"pod {pod}: {lines[-1]}")
                return


def _deployment_failures(deployment: Mapping[str, Any] | None) -> Iterable[PoolFailure]:
    if not deployment:
        return
    name = (deployment.get("metadata") or {}).get("name", "?")
    for cond in (deployment.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
            yield PoolFailure(
                reasons.PROGRESS_DEADLINE_EXCEEDED,
                f"deployment {name}: {cond.get('message') or 'no progress'}",
            )


def pool_failure(
    pods: Iterable[Mapping[str, Any]], deployments: Iterable[Mapping[str, Any] | None]
) -> PoolFailure | None:
    """The most telling failure among a pool's Deployments and pods, or None (just slow, or fine)."""
    found = [f for d in deployments for f in _deployment_failures(d)]
    found += [f for p in pods for f in _pod_failures(p)]
    if not found:
        return None
    return min(found, key=lambda f: (_PRECEDENCE.index(f.reason), f.message))
