"""Field types and bounds that several parts of the SpeculativeDeployment API share."""

from __future__ import annotations

from typing import Literal

SpeculationSetting = Literal["On", "Off", "Auto"]
SpeculationMode = Literal["On", "Off"]
MAX_SPECULATIVE_TOKENS = 10
MAX_SCHEDULE_RANGES = 16
# Flips (and adjustments) the status remembers per pool: the most an hourly budget may allow.
MAX_CHANGES_PER_HOUR = 60

# Names that end up as vLLM argument values: one starting with "-" would be read as a flag.
NOT_A_FLAG_MESSAGE = "must not start with '-' (vLLM would read it as a flag)"
