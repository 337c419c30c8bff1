"""What each condition type and reason (`api/reasons.py`) means and what to do about it: the one home of
the troubleshooting page (`make docs-reference` writes docs/troubleshooting.md from these; a test checks
every reason is here).

The entries live by domain: `api/reason_docs_resource.py` (condition types; the resource's children,
pods, metrics, cost profile, drift, Events, autoscaling and gateway) and `api/reason_docs_policy.py`
(the policy's decisions). This module merges them in the page's order."""

from __future__ import annotations

from typing import Final

from specfleet.api.reason_docs_base import ReasonDoc
from specfleet.api.reason_docs_policy import DECISION_REASON_DOCS
from specfleet.api.reason_docs_resource import CONDITION_DOCS, INTEGRATION_REASON_DOCS, RESOURCE_REASON_DOCS

__all__ = ["CONDITION_DOCS", "REASON_DOCS", "ReasonDoc"]

REASON_DOCS: Final[dict[str, ReasonDoc]] = {
    **RESOURCE_REASON_DOCS,
    **DECISION_REASON_DOCS,
    **INTEGRATION_REASON_DOCS,
}
