"""The model cache in every engine pod: the volume, where it is mounted, HF_HOME, and a read-only cache
kept offline; and examples/08 with the Job that fills its claim (examples/model-cache/fill-cache.yaml)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from specfleet.api.constants import LABEL_COMPONENT
from specfleet.api.validation import InvalidResourceError, parse_resource
from specfleet.cli.main import main
from specfleet.reconcile import decided_plan
from specfleet.render import plan_of, render_children
from specfleet.render.engine import ENGINE_COMPONENT, PREFLIGHT_CONTAINER
from support.manifests import ROOT, load_yaml, merge

CACHED = ROOT / "examples" / "08-model-cache-pvc.yaml"
FILL = ROOT / "examples" / "model-cache" / "fill-cache.yaml"
MINIMAL = ROOT / "examples" / "01-minimal-eagle3.yaml"
ON = plan_of({"latency": "On", "batch": "On"})


def _sd(path=CACHED, patch=None):
    doc = load_yaml(path)
    if patch:
        doc = merge(doc, patch)
    return parse_resource(doc)


def _engine_pods(sd, plan=ON) -> dict[str, dict[str, Any]]:
    """The pod spec of every engine Deployment (both pools, canaries included), by Deployment name."""
    return {
        c["metadata"]["name"]: c["spec"]["template"]["spec"]
        for c in render_children(sd, plan)
        if c["kind"] == "Deployment" and c["metadata"]["labels"][LABEL_COMPONENT] == ENGINE_COMPONENT
    }


def _cache_volume(pod):
    return next(v for v in pod["volumes"] if v["name"] == "model-cache")


def _containers_reading_the_cache(pod):
    """The engine and, where a drafter is loaded, its preflight check: both read the weights."""
    return pod["containers"] + [c for c in pod.get("initContainers", []) if c["name"] == PREFLIGHT_CONTAINER]


def _env(container):
    return {e["name"]: e.get("value") for e in container["env"]}


def _cache_mount(container):
    return next(m for m in container["volumeMounts"] if m["name"] == "model-cache")


@pytest.mark.parametrize("plan", [ON, plan_of({"latency": "Off", "batch": "Off"})], ids=["on", "off"])
def test_the_example_mounts_its_claim_read_only_in_every_engine(plan):
    sd = _sd()
    pods = _engine_pods(sd, plan)
    assert set(pods) == {"cached-latency", "cached-batch", "cached-latency-canary"}
    for name, pod in pods.items():
        assert _cache_volume(pod) == {
            "name": "model-cache",
            "persistentVolumeClaim": {"claimName": "hf-cache", "readOnly": True},
        }, name
        containers = _containers_reading_the_cache(pod)
        if plan is ON:
            # Every speculating engine checks its EAGLE-3 drafter first, reading the same cache.
            assert [c["name"] for c in containers][1:] == [PREFLIGHT_CONTAINER], name
        for container in containers:
            assert _cache_mount(container) == {
                "name": "model-cache",
                "mountPath": "/root/.cache/huggingface",
                "readOnly": True,
            }, (name, container["name"])
            env = _env(container)
            assert env["HF_HOME"] == "/root/.cache/huggingface", (name, container["name"])
            assert env["HF_HUB_OFFLINE"] == "1", (name, container["name"])


def test_the_decided_plan_renders_the_same_cache():
    sd = _sd()
    for pod in _engine_pods(sd, decided_plan(sd)).values():
        assert _cache_volume(pod)["persistentVolumeClaim"]["readOnly"] is True


def test_a_writable_claim_lets_engines_download_what_is_missing():
    sd = _sd(patch={"spec": {"engine": {"modelCache": {"readOnly": False}}}})
    for pod in _engine_pods(sd).values():
        assert _cache_volume(pod)["persistentVolumeClaim"] == {"claimName": "hf-cache"}
        for container in _containers_reading_the_cache(pod):
            assert "readOnly" not in _cache_mount(container)
            assert "HF_HUB_OFFLINE" not in _env(container)


def test_without_a_claim_each_pod_gets_an_empty_dir_of_its_own():
    sd = _sd(MINIMAL, {"spec": {"engine": {"modelCache": {"sizeLimit": "40Gi"}}}})
    pods = _engine_pods(sd)
    assert pods
    for pod in pods.values():
        assert _cache_volume(pod) == {"name": "model-cache", "emptyDir": {"sizeLimit": "40Gi"}}
        for container in _containers_reading_the_cache(pod):
            assert "HF_HUB_OFFLINE" not in _env(container)


def test_the_mount_path_is_where_hf_home_points():
    sd = _sd(patch={"spec": {"engine": {"modelCache": {"mountPath": "/models"}}}})
    for pod in _engine_pods(sd).values():
        for container in _containers_reading_the_cache(pod):
            assert _cache_mount(container)["mountPath"] == "/models"
            assert _env(container)["HF_HOME"] == "/models"
            if container["name"] == PREFLIGHT_CONTAINER:
                args = container["args"]
                assert args[args.index("--cache-dir") + 1] == "/models"


def test_a_read_only_cache_needs_a_claim():
    with pytest.raises(InvalidResourceError) as err:
        _sd(MINIMAL, {"spec": {"engine": {"modelCache": {"readOnly": True}}}})
    assert any(
        "modelCache.readOnly needs modelCache.persistentVolumeClaimName" in m for m in err.value.messages
    )


def test_the_example_renders_with_the_cli(capsys):
    assert main(["render", "-f", str(CACHED)]) == 0
    rendered = list(yaml.safe_load_all(capsys.readouterr().out))
    assert any(doc["metadata"]["name"] == "cached-latency-canary" for doc in rendered)


def _fill_manifests():
    docs = [d for d in yaml.safe_load_all(FILL.read_text()) if d]
    by_kind = {d["kind"]: d for d in docs}
    assert sorted(by_kind) == ["Job", "PersistentVolumeClaim"]
    return by_kind["PersistentVolumeClaim"], by_kind["Job"]


def test_the_fill_job_fills_the_claim_the_example_mounts():
    sd = _sd()
    cache = sd.spec.engine.model_cache
    claim, job = _fill_manifests()
    assert claim["metadata"]["name"] == cache.persistent_volume_claim_name
    assert (
        claim["metadata"]["namespace"]
        == job["metadata"]["namespace"]
        == load_yaml(CACHED)["metadata"]["namespace"]
    )
    # Engines on several nodes mount it at once.
    assert set(claim["spec"]["accessModes"]) & {"ReadWriteMany", "ReadOnlyMany"}
    pod = job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    volume = next(
        v for v in pod["volumes"] if v["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    )
    mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
    assert mount["mountPath"] == cache.mount_path
    assert _env(container)["HF_HOME"] == cache.mount_path
    # The Job writes the cache; only the engines are read-only.
    assert not mount.get("readOnly")
    assert "HF_HUB_OFFLINE" not in _env(container)
    # It fetches both checkpoints the engines load, with the engines' image.
    script = "\n".join(container["args"])
    assert f'"{sd.spec.model.name}"' in script
    assert f'"{sd.spec.drafter.model}"' in script
    assert container["image"] == sd.spec.engine.image
    token = next(e for e in container["env"] if e["name"] == "HF_TOKEN")
    assert token["valueFrom"]["secretKeyRef"]["optional"] is True


def _abridges(short: Any, full: Any) -> bool:
    """Whether `short` is `full` with keys, list tails or comment lines of a script left out."""
    if isinstance(short, dict):
        return isinstance(full, dict) and all(k in full and _abridges(v, full[k]) for k, v in short.items())
    if isinstance(short, list):
        return isinstance(full, list) and all(_abridges(s, f) for s, f in zip(short, full, strict=False))
    if isinstance(short, str) and isinstance(full, str) and "\n" in full:

        def code(text: str) -> list[str]:
            return [line for line in text.splitlines() if not line.strip().startswith("#")]

        return code(short) == code(full)
    return bool(short == full)


def test_the_getting_started_snippets_are_the_example_files_abridged():
    text = (ROOT / "docs" / "getting-started.md").read_text()
    section = text[text.index("## Keep the weights in a shared cache") :]
    section = section[: section.index("\n## ")]
    blocks = [b.split("```", 1)[0] for b in section.split("```yaml\n")[1:]]
    fill_doc, resource_doc = (list(yaml.safe_load_all(b)) for b in blocks[:2])
    claim, job = _fill_manifests()
    assert len(fill_doc) == 2
    assert _abridges(fill_doc[0], claim)
    assert _abridges(fill_doc[1], job)
    assert _abridges(resource_doc[0], load_yaml(CACHED))
