"""How long a pool's engines take to start, measured from its pods (pure): the policy prices a flip's
rollout with it.

An engine's start-up is its pod's creation to its Ready condition (`metadata.creationTimestamp` to the
condition's `lastTransitionTime`): scheduling, image pull, model load, warm-up and the first readiness
probe. A pool's is the median over its pods that are Ready, so one slow node does not set it. A pod
whose containers restarted is left out: its Ready time counts the crash and the back-off, not a start.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any


def _time(text: Any) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def pod_startup_seconds(pod: Mapping[str, Any]) -> float | None:
    """Seconds from the pod's creation to its Ready condition, or None (not Ready, restarted, or the
    times are missing)."""
    status = pod.get("status") or {}
    containers = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    if any(int(c.get("restartCount") or 0) > 0 for c in containers):
        return None
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    if ready is None or ready.get("status") != "True":
        return None
    created = _time((pod.get("metadata") or {}).get("creationTimestamp"))
    became_ready = _time(ready.get("lastTransitionTime"))
    if created is None or became_ready is None or became_ready < created:
        return None
    return (became_ready - created).total_seconds()


def pool_startup_seconds(pods: Iterable[Mapping[str, Any]]) -> int | None:
    """The pool's start-up in whole seconds: the median over its pods that became Ready without a
    restart (None: no such pod)."""
    seconds = [s for p in pods if (s := pod_startup_seconds(p)) is not None]
    if not seconds:
        return None
    return max(1, round(statistics.median(seconds)))
