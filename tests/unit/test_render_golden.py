"""Golden renders: every example's manifests are compared with a committed file.

Regenerate after an intended change with `make golden` and review the diff.
"""

from __future__ import annotations

import os

import pytest

from specfleet.api.validation import parse_resource
from specfleet.reconcile import decided_plan
from specfleet.render import render_children
from specfleet.render.common import to_yaml
from support.manifests import EXAMPLES, ROOT, load_yaml

GOLDEN = ROOT / "tests" / "golden"
RENDERABLE = [p for p in EXAMPLES if "degraded" not in p.stem]


def _with_uid(doc):
    # A fixed uid so owner references appear in the golden output as they do in a cluster.
    doc["metadata"]["uid"] = "00000000-0000-0000-0000-000000000001"
    return doc


@pytest.mark.parametrize("path", RENDERABLE, ids=lambda p: p.stem)
def test_golden(path):
    sd = parse_resource(_with_uid(load_yaml(path)))
    text = to_yaml(render_children(sd, decided_plan(sd)))
    golden = GOLDEN / f"{path.stem}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(text)
    assert golden.exists(), f"no golden file for {path.name}: run `make golden`"
    assert text == golden.read_text(), f"{golden.name} differs: run `make golden` and review the diff"
