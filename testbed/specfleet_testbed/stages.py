"""kwok stages of the test bed: kwokctl's defaults, plus readiness that waits for a real process.

By default kwok marks a pod Running and Ready at once. That is fine where nothing plays the pod,
but in namespaces named ``e2e-*`` (the e2e tier) or ``sandbox*`` (the demo) a local process plays
each pod (see specfleet_sandbox.pods),
and a pod must not be Ready before that process answers, exactly as a readiness probe would hold it
back. There pods start Running but not Ready, and become Ready when whoever plays them sets the
annotation ``testbed.specfleet.io/ready: "true"``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PROBED_NAMESPACE_PREFIX = "e2e-"
# Every prefix whose pods wait for their process: the e2e tier's and the sandbox's namespaces.
PROBED_NAMESPACE_PREFIXES = (PROBED_NAMESPACE_PREFIX, "sandbox")
READY_ANNOTATION = "testbed.specfleet.io/ready"

_IN_PROBED = (
    "(" + " || ".join(f"self.metadata.namespace.startsWith('{p}')" for p in PROBED_NAMESPACE_PREFIXES) + ")"
)
_NOT_DELETING = "!has(self.metadata.deletionTimestamp)"


def _running_containers(ready: bool) -> str:
    """Both stages' containerStatuses, one text so they cannot drift: all running, `ready` as the pod."""
    return (
        "containerStatuses:\n"
        "{{ range .spec.containers }}\n"
        "- image: {{ .image | Quote }}\n"
        "  name: {{ .name | Quote }}\n"
        f"  ready: {'true' if ready else 'false'}\n"
        "  started: true\n"
        "  restartCount: 0\n"
        "  state:\n"
        "    running:\n"
        "      startedAt: {{ $now | Quote }}\n"
        "{{ end }}\n"
    )


# Running with IPs, Ready False: the statusTemplate uses kwok's template functions (Now, Quote,
# NodeIPsWith, PodIPsWith).
_RUNNING_UNREADY = (
    """\
{{ $now := Now }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Initialized
- lastTransitionTime: {{ $now | Quote }}
  status: "False"
  reason: WaitingForProcess
  type: Ready
- lastTransitionTime: {{ $now | Quote }}
  status: "False"
  reason: WaitingForProcess
  type: ContainersReady
"""
    + _running_containers(ready=False)
    + """\
{{ with NodeIPsWith .spec.nodeName }}
hostIP: {{ index . 0 | Quote }}
{{ end }}
{{ with PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
podIP: {{ index . 0 | Quote }}
podIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
phase: Running
startTime: {{ $now | Quote }}
"""
)

_READY = (
    """\
{{ $now := Now }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Initialized
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Ready
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: ContainersReady
"""
    + _running_containers(ready=True)
    + "phase: Running\n"
)


def _cel(*expressions: str) -> list[dict[str, Any]]:
    return [{"cel": {"expression": e}} for e in expressions]


def _stage(name: str, selector: list[dict[str, Any]], template: str) -> dict[str, Any]:
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Stage",
        "metadata": {"name": name},
        "spec": {
            "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
            "selector": {"matchExpressions": selector},
            "next": {"statusTemplate": template},
        },
    }


def probed_stages() -> list[dict[str, Any]]:
    """The two stages for pods in probed namespaces."""
    return [
        _stage(
            "specfleet-pod-running-unready",
            _cel(_NOT_DELETING, _IN_PROBED, "!has(self.status.phase) || self.status.phase == 'Pending'"),
            _RUNNING_UNREADY,
        ),
        _stage(
            "specfleet-pod-ready-when-annotated",
            [
                *_cel(
                    _NOT_DELETING,
                    _IN_PROBED,
                    "has(self.status.phase) && self.status.phase == 'Running'",
                    f"has(self.metadata.annotations) && '{READY_ANNOTATION}' in self.metadata.annotations "
                    f"&& self.metadata.annotations['{READY_ANNOTATION}'] == 'true'",
                ),
                # kwok's CEL cannot look into pod conditions; its (older) jq form can.
                {
                    "key": '.status.conditions.[] | select( .type == "Ready" ) | .status',
                    "operator": "NotIn",
                    "values": ["True"],
                },
            ],
            _READY,
        ),
    ]


def write_stages(defaults: Path, target: Path) -> Path:
    """kwokctl's default stages with pod-ready limited to unprobed namespaces, plus the probed stages.

    Text surgery rather than a YAML parser keeps this package stdlib-only; the defaults come from one
    pinned kwok version, and a change in their shape fails loudly here.
    """
    docs = defaults.read_text().split("\n---\n")
    marker = "  selector:\n    matchExpressions:\n"
    exclude = marker + f'    - cel:\n        expression: "!{_IN_PROBED}"\n'
    patched = 0
    for i, doc in enumerate(docs):
        if "\n  name: pod-ready\n" in doc:
            if marker not in doc:
                raise ValueError(f"unexpected shape of kwok's pod-ready stage in {defaults}")
            docs[i] = doc.replace(marker, exclude, 1)
            patched += 1
    if patched != 1:
        raise ValueError(f"expected one pod-ready stage in {defaults}, found {patched}")
    docs += [json.dumps(stage, indent=1) for stage in probed_stages()]
    target.write_text("\n---\n".join(docs) + "\n")
    return target
