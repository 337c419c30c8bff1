"""Stage 4, the decision and its record (pure): one pool assessed by its rules (`pool`), every Auto
pool of a deployment through the gates (`deployment.decide`), one whole evaluation of a resource
(`evaluation.evaluate_policy`, the entry point the operator and the simulator call), and what goes
back to status (`record`, `status_writes`)."""
