"""From a request body to a pool: body checks, request facts, the client tracker and `classify`.

The pure rules live in `classify.py`; this is their stateful use per request (the tracker's in-flight
counts, the classification metrics).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from specfleet_runtime.router.affinity import prefix_keys
from specfleet_runtime.router.body import BodyFields, read_body_fields
from specfleet_runtime.router.classify import (
    Classification,
    ClientLoadTracker,
    Endpoint,
    InvalidRequest,
    Reason,
    RequestFacts,
    classify,
    extract_facts,
)
from specfleet_runtime.router.errors import clip
from specfleet_runtime.router.intake import Refusal
from specfleet_runtime.router.message import Headers
from specfleet_runtime.router.metrics import RouterMetrics
from specfleet_runtime.routing_config import RoutingConfig

log = logging.getLogger(__name__)


def _refuse_repeated_identity(config: RoutingConfig, headers: Headers) -> None:
    """A trusted identity header sent twice means a gateway appended to a client's value: refuse it."""
    for name, trust in (
        (config.tenant_header, config.tenant_header_trust),
        (config.client_header, config.client_header_trust),
    ):
        if trust == "Trusted" and len(headers.getall(name)) > 1:
            raise InvalidRequest(
                f"header {name} appears more than once; the gateway must replace a client's value", name
            )


def _served_body(config: RoutingConfig, body: bytes, prefix: bool = False) -> BodyFields:
    """The fields of a valid JSON object body whose `model`, if it names one, is the served model (and
    its leading text, with `prefix`)."""
    read = read_body_fields(body, prefix=prefix)
    model = read.fields.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidRequest("'model' must be a string", "model")
    if model is not None and model != config.served_model_name:
        raise Refusal(404, f"The model `{clip(model)}` does not exist.", "model_not_found", "model")
    return read


class Admission:
    """Checks a request's body and decides its pool; `begin`/`end` bracket the request's life."""

    def __init__(self, metrics: RouterMetrics, clock: Callable[[], float]) -> None:
        self.metrics = metrics
        self.clock = clock
        self.tracker = ClientLoadTracker()

    def facts(
        self,
        config: RoutingConfig,
        headers: Mapping[str, str],
        body: bytes,
        remote: str | None,
        endpoint: Endpoint | None = None,
    ) -> RequestFacts:
        """Check the body of an inference request and read its facts; Refusal (400, 404) for a bad one."""
        try:
            if isinstance(headers, Headers):
                _refuse_repeated_identity(config, headers)
            selection = config.endpoint_selection
            affinity = "PrefixAffinity" in (selection.latency.strategy, selection.batch.strategy)
            read = _served_body(config, body, affinity)
            return extract_facts(
                config,
                headers,
                read.fields,
                remote,
                prompts=read.prompts,
                endpoint=endpoint,
                prefix=prefix_keys(read.prefix, read.turns, read.first_user, len(body)) if affinity else None,
            )
        except InvalidRequest as err:
            raise Refusal(400, err.message, "invalid_request", err.param) from None

    def check_body(self, config: RoutingConfig, body: bytes) -> None:
        """Check the body of a tokenizer request (one JSON object naming the served model, if any);
        Refusal (400, 404) for a bad one. It is not classified: no pool choice, no client load."""
        try:
            _served_body(config, body)
        except InvalidRequest as err:
            raise Refusal(400, err.message, "invalid_request", err.param) from None

    def begin(self, config: RoutingConfig, facts: RequestFacts) -> Classification:
        """Count the request against its client and classify it (call `end` when it is over)."""
        verdict = self.tracker.begin(facts.client_id, self.clock(), config.auto_segmentation)
        if verdict.transition is not None:
            self.metrics.segment_transitions.labels(verdict.transition).inc()
            log.info(
                "client %s %s (in flight: %d)",
                facts.client_id,
                "segmented as batch" if verdict.transition == "to_batch" else "back to normal",
                self.tracker.in_flight(facts.client_id),
            )
        classification = classify(config, facts, verdict.segmented)
        self.metrics.value(self.metrics.classifications, classification.pool, classification.label).inc()
        if classification.reason == Reason.AUTO_SEGMENTATION and classification.pool != config.default_pool:
            self.metrics.value(self.metrics.reclassifications, config.default_pool, classification.pool).inc()
        return classification

    def end(self, config: RoutingConfig, facts: RequestFacts) -> None:
        self.tracker.end(facts.client_id, self.clock(), config.auto_segmentation)

    def expire(self, config: RoutingConfig | None) -> None:
        if config is not None:
            for _ in self.tracker.expire(self.clock(), config.auto_segmentation):
                self.metrics.segment_transitions.labels("from_batch").inc()
        self.metrics.segmented_clients.set(self.tracker.segmented_count())
