"""Stage 2, what each setting would deliver (pure): the acceptance the policy can trust
(`acceptance`), the KV cache each engine has and each request takes (`kv_cache`), the demand a change
is decided for (`demand`), how long a rollout takes (`rollout_time`), K inside the engine
(`dynamic_sd`), the tokens per second of each setting (`throughput`) and whether it serves what
arrives (`queueing`)."""
