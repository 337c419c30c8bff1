"""specfleet: the control plane (API models, renderer, policy, metrics, Kopf handlers, CLI)."""

__version__ = "0.1.0"
