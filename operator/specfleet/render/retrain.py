"""The drafter retrain Job: the user's pod template, run once when a pool's acceptance drifts (pure).

Unlike the other children it is not part of every render: the policy asks for one when drift has
lasted (see specfleet.policy.rules.drift), at most once per `drafter.retrain.periodSeconds`, and the operator
creates it then. It carries the owner labels and reference, so it is listed, pruned (when the spec
drops `drafter.retrain`) and garbage-collected like every child; a finished Job is deleted by
Kubernetes after one period.
"""

from __future__ import annotations

import copy
from datetime import datetime
from typing import Any

from specfleet.api.validation import SpeculativeDeployment
from specfleet.policy.rules.drift import RetrainTrigger
from specfleet.render.common import Manifest, metadata, with_render_hash

RETRAIN_COMPONENT = "retrain"
# Job names end up in the pods' job-name label: at most 63 characters.
_MAX_NAME = 63


def retrain_job_name(sd: SpeculativeDeployment, pool: str, at: datetime) -> str:
    """One name per trigger: the resource (shortened), the pool and the trigger's Unix time."""
    suffix = f"-{pool}-retrain-{int(at.timestamp())}"
    return sd.name[: _MAX_NAME - len(suffix)].rstrip("-.") + suffix


def _numbers(values: tuple[float, ...]) -> str:
    return ",".join(f"{p:.3f}" for p in values)


def retrain_env(sd: SpeculativeDeployment, trigger: RetrainTrigger) -> list[dict[str, str]]:
    """What the retrain container learns about the drift, as environment variables."""
    drafter = sd.spec.drafter
    values = {
        "SPECFLEET_NAMESPACE": sd.namespace,
        "SPECFLEET_NAME": sd.name,
        "SPECFLEET_POOL": trigger.pool,
        "SPECFLEET_MODEL": sd.spec.model.name,
        "SPECFLEET_DRAFTER": drafter.model or drafter.method,
        "SPECFLEET_DRAFTER_METHOD": drafter.method,
        "SPECFLEET_BASELINE_ACCEPTANCE_LENGTH": f"{trigger.baseline_length:.3f}",
        "SPECFLEET_CURRENT_ACCEPTANCE_LENGTH": f"{trigger.current_length:.3f}",
        "SPECFLEET_DRIFT_PERCENT": f"{trigger.drift_percent:.1f}",
        "SPECFLEET_BASELINE_PER_POSITION": _numbers(trigger.baseline),
        "SPECFLEET_TRIGGERED_AT": trigger.at.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    return [{"name": k, "value": v} for k, v in values.items()]


def render_retrain_job(sd: SpeculativeDeployment, trigger: RetrainTrigger) -> Manifest:
    """The Job for one trigger; None fields of the template are the user's to set."""
    retrain = sd.spec.drafter.retrain
    assert retrain is not None, "render_retrain_job needs drafter.retrain"
    meta = metadata(sd, retrain_job_name(sd, trigger.pool, trigger.at), RETRAIN_COMPONENT, trigger.pool)
    pod_meta = copy.deepcopy(retrain.template.metadata or {})
    pod_meta["labels"] = {**(pod_meta.get("labels") or {}), **meta["labels"]}
    pod_spec: dict[str, Any] = copy.deepcopy(retrain.template.spec)
    pod_spec.setdefault("restartPolicy", "Never")
    env = retrain_env(sd, trigger)
    ours = {e["name"] for e in env}
    for container in pod_spec.get("containers") or []:
        if isinstance(container, dict):
            kept = [e for e in container.get("env") or [] if e.get("name") not in ours]
            container["env"] = [*kept, *env]
    return with_render_hash(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": meta,
            "spec": {
                "backoffLimit": retrain.backoff_limit,
                "ttlSecondsAfterFinished": retrain.period_seconds,
                "template": {"metadata": pod_meta, "spec": pod_spec},
            },
        }
    )
