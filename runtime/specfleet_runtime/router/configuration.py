"""The routing config in force: validated on arrival, a bad document logged and the last good one kept."""

from __future__ import annotations

import logging
from collections.abc import Callable

from specfleet_runtime.router.metrics import RouterMetrics
from specfleet_runtime.routing_config import RoutingConfig

log = logging.getLogger(__name__)


class ConfigStore:
    """Holds the current `RoutingConfig`; calls `on_change` with each newly applied one."""

    def __init__(self, metrics: RouterMetrics, on_change: Callable[[RoutingConfig], None]) -> None:
        self.metrics = metrics
        self.on_change = on_change
        self.config: RoutingConfig | None = None
        self._text: str | None = None

    def apply_text(self, text: str | None, origin: str) -> bool:
        """Validate and apply a config document; returns whether the config in force is `text`'s."""
        if text is None:
            log.warning("%s holds no routing config; keeping the last good one", origin)
            return False
        if text == self._text:
            return True
        try:
            config = RoutingConfig.from_json(text)
        except ValueError as err:
            self.metrics.config_reloads.labels("rejected").inc()
            kept = "keeping the last good one" if self.config else "no config loaded yet"
            log.error("rejected routing config from %s: %s; %s", origin, err, kept)
            return False
        self.config = config
        self._text = text
        self.metrics.config_reloads.labels("applied").inc()
        log.info(
            "applied routing config from %s (model %s, pools %s, fallback %s, pool header %s)",
            origin,
            config.served_model_name,
            ",".join(sorted(config.pools)),
            config.fallback,
            config.pool_header_trust,
        )
        self.on_change(config)
        return True
