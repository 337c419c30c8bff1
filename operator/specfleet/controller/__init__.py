"""The running operator: Kopf handlers, the reconcile and policy loops with their locks and schedulers,
leader election and the Kubernetes API client. The only place the control plane writes to a cluster;
the decisions it applies come from the pure core (reconcile, render, policy)."""
