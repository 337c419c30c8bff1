"""specfleet: the control plane. A pure core (`api`, `render`, `policy`, `sim`, `reconcile`) and three edges
around it: `controller` (the running operator), `observe` (metrics in and out), `cli` (the command)."""

__version__ = "0.1.0"
