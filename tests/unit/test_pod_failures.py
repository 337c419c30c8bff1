"""Why a pool is not ready, from pod and Deployment shapes the apiserver returns."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from specfleet.api import reasons
from specfleet.reconcile import reconcile
from specfleet.reconcile.pod_failures import pool_failure
from support.fake_cluster import FakeCluster
from support.manifests import ROOT, load_yaml

UNSCHEDULABLE = {
    "metadata": {"name": "a-latency-1"},
    "status": {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
            }
        ],
    },
}


def _waiting(reason: str, message: str = "") -> dict:  # type: ignore[type-arg]
    return {
        "metadata": {"name": "a-latency-2"},
        "status": {
            "containerStatuses": [
                {
                    "name": "vllm",
                    "state": {"waiting": {"reason": reason, "message": message}},
                    "lastState": {},
                }
            ]
        },
    }


def test_scheduler_message_is_reported_as_is() -> None:
    failure = pool_failure([UNSCHEDULABLE], [])
    assert failure is not None
    assert failure.reason == "Unschedulable"
    assert "0/3 nodes are available: 3 Insufficient nvidia.com/gpu." in failure.message


def test_image_pull_beats_unschedulable_and_names_the_container() -> None:
    failure = pool_failure(
        [UNSCHEDULABLE, _waiting("ImagePullBackOff", 'Back-off pulling image "vllm:nope"')], []
    )
    assert failure is not None
    assert failure.reason == "ImagePullFailed"
    assert 'container vllm: ImagePullBackOff: Back-off pulling image "vllm:nope"' in failure.message


def test_oom_kill_in_last_state_and_crash_loop() -> None:
    pod = _waiting("CrashLoopBackOff", "back-off 5m0s restarting failed container")
    pod["status"]["containerStatuses"][0]["lastState"] = {"terminated": {"reason": "OOMKilled"}}
    failure = pool_failure([pod], [])
    assert failure is not None
    assert failure.reason == "OOMKilled"


def test_progress_deadline_of_the_deployment() -> None:
    deployment = {
        "metadata": {"name": "a-latency"},
        "status": {
            "conditions": [
                {
                    "type": "Progressing",
                    "status": "False",
                    "reason": "ProgressDeadlineExceeded",
                    "message": 'ReplicaSet "a-latency-5d9" has timed out progressing.',
                }
            ]
        },
    }
    failure = pool_failure([_waiting("ContainerCreating")], [deployment, None])
    assert failure is not None
    assert failure.reason == "ProgressDeadlineExceeded"
    assert "timed out progressing" in failure.message


def test_slow_but_healthy_pods_are_no_failure() -> None:
    assert pool_failure([_waiting("ContainerCreating")], [{"status": {"conditions": []}}]) is None


def test_reconcile_puts_the_reason_in_ready_and_warns_once() -> None:
    cluster = FakeCluster()
    body = load_yaml(ROOT / "examples" / "02-two-pools-routing-policy.yaml")
    body["metadata"].update(uid="uid-1", generation=1)
    now = datetime(2026, 11, 30, tzinfo=UTC)
    first = reconcile(body, cluster, now)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "assistant-latency-abc",
            "namespace": "inference",
            "labels": {
                "app.kubernetes.io/instance": "assistant",
                "app.kubernetes.io/managed-by": "specfleet-operator",
                "specfleet.io/pool": "latency",
            },
        },
        "status": UNSCHEDULABLE["status"],
    }
    cluster.objects[("Pod", "inference", "assistant-latency-abc")] = pod
    second = reconcile({**body, "status": first.status}, cluster, now + timedelta(seconds=30))
    ready = {c["type"]: c for c in second.status["conditions"]}["Ready"]
    assert ready["reason"] == "Unschedulable"
    assert "3 Insufficient nvidia.com/gpu" in ready["message"]
    assert ready["message"].endswith(f"(see {reasons.troubleshooting_url('Unschedulable')})")
    assert [e.reason for e in second.events if e.type == "Warning"] == ["PoolNotReady"]
    third = reconcile({**body, "status": second.status}, cluster, now + timedelta(seconds=60))
    assert [e.reason for e in third.events if e.type == "Warning"] == [], "warned once, not every resync"


# A pod whose drafter preflight failed, as the kubelet reports it after the first restart: the init
# container crash-loops, its log (terminationMessagePolicy FallbackToLogsOnError) is the last
# termination's message, and vLLM waits in PodInitializing.
PREFLIGHT_LINE = "DrafterIncompatible: hidden size: the drafter's target_hidden_size is 512, the target's hidden_size is 256"
DRAFTER_INCOMPATIBLE_POD = {
    "metadata": {"name": "a-latency-7f9c"},
    "status": {
        "phase": "Pending",
        "conditions": [
            {
                "type": "Initialized",
                "status": "False",
                "reason": "ContainersNotInitialized",
                "message": "containers with incomplete status: [drafter-preflight]",
            },
            {"type": "PodScheduled", "status": "True"},
        ],
        "initContainerStatuses": [
            {
                "name": "drafter-preflight",
                "image": "ghcr.io/specfleet/specfleet:0.1.0",
                "imageID": "",
                "ready": False,
                "restartCount": 2,
                "started": False,
                "state": {
                    "waiting": {
                        "reason": "CrashLoopBackOff",
                        "message": "back-off 20s restarting failed container=drafter-preflight "
                        "pod=a-latency-7f9c_inference(0b1d)",
                    }
                },
                "lastState": {
                    "terminated": {
                        "exitCode": 1,
                        "reason": "Error",
                        "message": PREFLIGHT_LINE + "\n",
                        "startedAt": "2026-11-30T21:00:01Z",
                        "finishedAt": "2026-11-30T21:00:02Z",
                        "containerID": "containerd://4c1e",
                    }
                },
            }
        ],
        "containerStatuses": [
            {
                "name": "vllm",
                "image": "vllm/vllm-openai:v0.32.0",
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "started": False,
                "state": {"waiting": {"reason": "PodInitializing"}},
                "lastState": {},
            }
        ],
    },
}


def test_failed_drafter_preflight_is_drafter_incompatible_with_the_field_that_differs() -> None:
    failure = pool_failure([UNSCHEDULABLE, DRAFTER_INCOMPATIBLE_POD], [])
    assert failure is not None
    assert failure.reason == "DrafterIncompatible"
    assert failure.message == (
        "pod a-latency-7f9c init container drafter-preflight: the drafter does not fit the target: "
        "hidden size: the drafter's target_hidden_size is 512, the target's hidden_size is 256"
    )
    # The first failure, before any restart: the terminated state itself.
    first = {"metadata": {"name": "p"}, "status": {"initContainerStatuses": [{"name": "drafter-preflight", "state": {"terminated": {"exitCode": 1, "message": PREFLIGHT_LINE}}}]}}  # fmt: skip
    found = pool_failure([first], [])
    assert found is not None
    assert found.reason == "DrafterIncompatible"


def test_init_container_crash_loop_without_preflight_lines_is_a_crash_loop() -> None:
    pod = {"metadata": {"name": "p"}, "status": {"initContainerStatuses": [{"name": "other", "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}}, "lastState": {"terminated": {"exitCode": 2, "message": "boom"}}}]}}  # fmt: skip
    failure = pool_failure([pod], [])
    assert failure is not None
    assert failure.reason == "CrashLoopBackOff"
    # A preflight that passed (exit 0) is no failure.
    ok = {"metadata": {"name": "p"}, "status": {"initContainerStatuses": [{"name": "drafter-preflight", "state": {"terminated": {"exitCode": 0, "message": "drafter fits"}}}]}}  # fmt: skip
    assert pool_failure([ok], []) is None


def test_a_flip_whose_new_pods_fail_the_preflight_shows_in_progressing_while_old_pods_serve() -> None:
    cluster = FakeCluster()
    body = load_yaml(ROOT / "examples" / "02-two-pools-routing-policy.yaml")
    body["metadata"].update(uid="uid-1", generation=1)
    now = datetime(2026, 11, 30, tzinfo=UTC)
    first = reconcile(body, cluster, now)
    cluster.roll_out()
    settled = reconcile({**body, "status": first.status}, cluster, now + timedelta(seconds=30))
    # A surge rollout: the old pods stay ready, the new one never passes its init container.
    deployment = cluster.objects[("Deployment", "inference", "assistant-latency")]
    deployment["status"]["updatedReplicas"] = 1
    deployment["status"]["replicas"] = deployment["spec"]["replicas"] + 1
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "a-latency-7f9c",
            "namespace": "inference",
            "labels": {
                "app.kubernetes.io/instance": "assistant",
                "app.kubernetes.io/managed-by": "specfleet-operator",
                "specfleet.io/pool": "latency",
            },
        },
        "status": DRAFTER_INCOMPATIBLE_POD["status"],
    }
    cluster.objects[("Pod", "inference", "a-latency-7f9c")] = pod
    stuck = reconcile({**body, "status": settled.status}, cluster, now + timedelta(seconds=60))
    conditions = {c["type"]: c for c in stuck.status["conditions"]}
    assert conditions["Ready"]["status"] == "True"
    assert conditions["Progressing"]["status"] == "True"
    assert conditions["Progressing"]["reason"] == "DrafterIncompatible"
    assert (
        "latency: pod a-latency-7f9c init container drafter-preflight: the drafter does not fit"
        in (conditions["Progressing"]["message"])
    )
    assert [e.reason for e in stuck.events if e.type == "Warning"] == ["PoolNotReady"]
    again = reconcile({**body, "status": stuck.status}, cluster, now + timedelta(seconds=90))
    assert [e.reason for e in again.events if e.type == "Warning"] == [], "warned once"
