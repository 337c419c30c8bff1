"""The SpeculativeDeployment API (specfleet.io/v1alpha1): pydantic models, the single source of truth.

The CRD in crds/ is generated from these classes (`specfleet crd`); every field's description becomes
its `kubectl explain` text. Cross-field rules (`rules = (...)`) are enforced twice with one message:
as CEL by the apiserver and in Python by `specfleet render` and the operator.

Conventions: camelCase JSON, durations as integers named ...Seconds, no floats in spec (fractions are
milli-units or percent integers, named so), fixed structs for the two pools.

Modules by job: `spec` joins the parts of the spec (`engine` with the model, `drafter`, `pools`,
`routing`, `policy`, `monitoring`; shared bounds in `fields`), `status` is what the operator writes,
`validation` parses a resource, `semantics` and `effective` derive from a valid spec.
"""
