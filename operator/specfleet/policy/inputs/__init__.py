"""Stage 1, what the policy reads (pure): each pool's observation out of one round of Prometheus
answers (`fleet_answers`, `observation`), its state out of status (`status`), whether Prometheus
scrapes its pods (`scraping`), the cost profile it decides with (`profile_source`) and the two
settings every later stage reads (`settings`)."""
