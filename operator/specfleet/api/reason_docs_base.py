"""The shape of a reason's entry in the troubleshooting table (`api/reason_docs.py` merges the tables)."""

from __future__ import annotations

from typing import NamedTuple


class ReasonDoc(NamedTuple):
    """Where a reason appears, what it means, what to do."""

    where: str
    meaning: str
    action: str


NOTHING = "Nothing: this is the normal state."
