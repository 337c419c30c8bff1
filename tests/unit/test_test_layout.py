"""pytest imports test modules by basename (rootdir import mode): two tiers with one file name fail
collection of the whole suite, which only shows when every tier is collected together (make test)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_name_is_unique_across_tiers():
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []
