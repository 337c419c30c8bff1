"""The guide's generated pages match their sources, and every condition reason is documented."""

from __future__ import annotations

import re
from pathlib import Path

import markdown
import pytest
import yaml

from specfleet.api import constants, reason_docs, reasons
from specfleet.cli import docs_reference

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("page", sorted(docs_reference.PAGES))
def test_committed_page_matches_a_fresh_generation(page):
    committed = (ROOT / "docs" / page).read_text()
    assert committed == docs_reference.PAGES[page](), f"docs/{page} is stale: run `make docs-reference`"


def _constants() -> dict[str, str]:
    return {
        name: value
        for name, value in vars(reasons).items()
        if name.isupper() and not name.startswith("_") and isinstance(value, str)
    }


def test_every_reason_has_a_meaning_and_an_action():
    condition_types = set(reason_docs.CONDITION_DOCS)
    undocumented = sorted(
        f"{name} = {value!r}"
        for name, value in _constants().items()
        if value not in reason_docs.REASON_DOCS and value not in condition_types
    )
    assert undocumented == [], (
        "add them to api/reason_docs_resource.py or api/reason_docs_policy.py (merged by api/reason_docs.py)"
    )
    for value, doc in reason_docs.REASON_DOCS.items():
        assert all(doc), value


def test_every_documented_name_is_a_real_reason():
    values = set(_constants().values())
    assert set(reason_docs.REASON_DOCS) <= values
    assert set(reason_docs.CONDITION_DOCS) <= values


def test_reference_shows_types_defaults_enums_units_and_rules():
    page = docs_reference.field_reference()
    assert "| `speculation` | string | `Auto` |" in page
    assert "one of `On`, `Off`, `Auto`" in page
    assert "unit: seconds" in page
    assert "CEL: `" in page
    assert "### `status.pools.latency`" in page
    assert "status.pools.&lt;pool>" in page, "a bare <pool> would be read as an HTML tag"


def test_values_reference_lists_every_value_with_a_description_and_its_default():
    page = docs_reference.values_reference()
    assert '| `image.tag` | string or number | `""` |' in page
    assert '| `grafana.dashboard.labelValue` | string | `"1"` |' in page, "a string default reads as one"
    for line in page.splitlines():
        if line.startswith("| `"):
            assert not line.endswith("|  |"), f"a value without a description: {line}"
    assert "- Helm chart values: values.md" in (ROOT / "mkdocs.yml").read_text()


def test_troubleshooting_lists_every_reason_under_its_own_heading():
    page = docs_reference.troubleshooting()
    for value in reason_docs.REASON_DOCS:
        assert f"\n### {value}\n" in page


def _heading_ids(page: Path) -> set[str]:
    """The ids mkdocs gives the page's headings (Python-Markdown's toc, as mkdocs.yml configures it)."""
    html = markdown.markdown(page.read_text(), extensions=["tables", "toc"])
    return set(re.findall(r'<h[1-6] id="([^"]+)"', html))


def test_every_reason_link_in_a_message_lands_on_its_heading():
    ids = _heading_ids(ROOT / "docs" / "troubleshooting.md")
    page = f"{constants.DOCS_URL}troubleshooting/#"
    for reason in reason_docs.REASON_DOCS:
        url = reasons.troubleshooting_url(reason)
        assert url.startswith(page), url
        assert url.removeprefix(page) in ids, f"{url}: no such heading in docs/troubleshooting.md"


def test_every_reason_the_reconciler_links_is_documented():
    # with_link(..., reasons.NAME) in the operator's code: each NAME must have a troubleshooting entry.
    linked = set()
    for source in (ROOT / "operator" / "specfleet").rglob("*.py"):
        linked |= set(re.findall(r"with_link\(.*?, reasons\.([A-Z_]+)\)", source.read_text(), re.DOTALL))
    assert linked, "no linked message found: the pattern no longer matches the code"
    assert {getattr(reasons, name) for name in linked} <= set(reason_docs.REASON_DOCS)


def test_the_docs_site_url_is_the_one_messages_link_to():
    site = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["site_url"]
    assert site == constants.DOCS_URL


def test_nothing_the_readme_guide_or_benchmarks_run_reads_outside_the_repository():
    # A fresh clone has no sibling folders: data the commands need ships in the repository.
    sources = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "benchmarks").glob("*.py")]
    outside = re.compile(r"/work/|\.\./shared|[\"']shared[\"']")
    found = [f"{p.relative_to(ROOT)}: {m.group()}" for p in sources for m in outside.finditer(p.read_text())]
    assert found == []
