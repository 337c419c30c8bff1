"""Names shared by the API, the renderer and the handlers: group, kind, labels, annotations."""

from __future__ import annotations

from typing import Final

from specfleet_runtime import names

GROUP: Final = names.GROUP
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "SpeculativeDeployment"
PLURAL: Final = "speculativedeployments"
SINGULAR: Final = "speculativedeployment"
SHORT_NAMES: Final = ("specdeploy", "sd")

# The published guide (mkdocs.yml's site_url; the release workflow deploys it to GitHub Pages).
# Condition messages link into its troubleshooting page.
DOCS_URL: Final = "https://specfleet.github.io/specfleet/"

# The single field manager for every server-side apply the operator makes.
FIELD_MANAGER: Final = "specfleet-operator"
# Holds an autoscaled Deployment's replicas for a moment when autoscaling is turned on, so the
# operator's apply without replicas releases them unchanged (the autoscaler's first scale takes them).
HANDOVER_MANAGER: Final = "specfleet-replicas-handover"

LABEL_NAME: Final = "app.kubernetes.io/name"
LABEL_INSTANCE: Final = "app.kubernetes.io/instance"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
LABEL_PART_OF: Final = "app.kubernetes.io/part-of"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
# The pod labels Prometheus selects engines by are defined with the other shared names.
LABEL_DEPLOYMENT: Final = names.LABEL_DEPLOYMENT
LABEL_POOL: Final = names.LABEL_POOL
LABEL_SPECULATION: Final = names.LABEL_SPECULATION
LABEL_TRACK: Final = names.LABEL_TRACK
LABEL_FLIP: Final = names.LABEL_FLIP

# sha256 of a child's rendered content: equal hash on the live object means nothing to write.
ANNOTATION_RENDER_HASH: Final = f"{GROUP}/render-hash"

# The two pools every SpeculativeDeployment has (defined in `specfleet_runtime.names`, which the router
# shares); the operator iterates them in this order.
PoolName = names.PoolName
POOLS: Final = names.POOLS
