"""The command outputs README.md and the guide show are the current code's (`make docs-figures`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from specfleet.cli import docs_figures
from specfleet.cli.docs_figures import Figure, FigureError

ROOT = Path(__file__).resolve().parents[2]
PLAN = (
    "specfleet plan -f examples/02-two-pools-routing-policy.yaml "
    "--trace examples/traces/AzureLLMInferenceTrace_conv.csv.gz --time-scale 6"
)


# Each figure's command runs once per session (command_output is cached): plan and simulate over the
# hour-long trace take about 4 s each, and README.md and planning.md share the plan.
@pytest.mark.parametrize("page", [p.relative_to(ROOT).as_posix() for p in docs_figures.pages()])
def test_every_figure_is_the_current_codes_output(page):
    committed = (ROOT / page).read_text(encoding="utf-8")
    assert docs_figures.regenerate(committed) == committed, f"{page} is stale: run `make docs-figures`"


def test_the_readme_and_the_planning_page_hold_their_figures():
    # A marker deleted by accident would otherwise leave a pasted block that nothing checks.
    assert {p.relative_to(ROOT).as_posix() for p in docs_figures.pages()} >= {
        "README.md",
        "docs/tasks/planning.md",
    }


def test_no_specfleet_output_is_pasted_outside_a_figure():
    # A fenced block starting `$ specfleet ...` shows a command's output: it must be generated.
    for page in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]:
        outside = docs_figures.FIGURE.sub("", page.read_text(encoding="utf-8"))
        pasted = re.findall(r"^```[^\n]*\n\$ specfleet [^\n]*", outside, re.MULTILINE)
        assert pasted == [], f"{page.relative_to(ROOT)}: wrap it in a <!-- figure: ... --> marker"


def test_the_plan_is_the_same_on_a_second_run():
    assert docs_figures.command_output.__wrapped__(PLAN) == docs_figures.command_output(PLAN)


def test_a_marker_names_a_specfleet_command_and_its_rules():
    figure = Figure.parse("$ specfleet plan -f x.yaml\n  | keep a.b c\n  | keep d")
    assert figure == Figure("specfleet plan -f x.yaml", show_command=True, keep=("a.b", "c", "d"))
    assert Figure.parse("specfleet crd") == Figure("specfleet crd")
    with pytest.raises(FigureError, match="a `specfleet` command"):
        Figure.parse("rm -rf /")
    with pytest.raises(FigureError, match="unknown rule"):
        Figure.parse("specfleet crd | head 3")


OUTPUT = """\
top: 1
pools:
  latency:
    load: {p5: 1.0, p50: 2.0}
    why: because
    extra: [1, 2]
policy:
  thresholds: {a: 1, b: 2, c: 3}
schedule:
- {min: 1, k: 3}
- {min: 2, k: 0}
"""


def test_keep_shortens_to_the_named_keys_in_the_outputs_order():
    kept = docs_figures.shortened(OUTPUT, ["schedule", "policy.thresholds.a", "pools.latency.load", "top"])
    assert kept == (
        "top: 1\n"
        "pools:\n"
        "  latency:\n"
        "    load: {p5: 1.0, p50: 2.0}\n"
        "policy:\n"
        "  thresholds: {a: 1, ...}\n"
        "schedule:\n"
        "- {min: 1, k: 3}\n"
        "- {min: 2, k: 0}\n"
    )


def test_keep_fails_on_a_key_the_output_no_longer_has():
    with pytest.raises(FigureError, match=r"pools\.latency has no key speedup"):
        docs_figures.shortened(OUTPUT, ["pools.latency.speedup"])


def test_a_mapping_too_wide_for_one_line_stays_a_block():
    wide = {f"key{n}WithALongName": n for n in range(8)}
    kept = docs_figures.shortened(f"wide: {wide}\n", ["wide"])
    assert kept.splitlines()[:2] == ["wide:", "  key0WithALongName: 0"]


def test_the_shown_command_wraps_before_an_option():
    figure = docs_figures.Figure(PLAN, show_command=True)
    lines = docs_figures._command_lines(figure.command).splitlines()
    assert lines == [
        "$ specfleet plan -f examples/02-two-pools-routing-policy.yaml \\",
        "    --trace examples/traces/AzureLLMInferenceTrace_conv.csv.gz --time-scale 6",
    ]


def test_a_failing_command_says_why():
    with pytest.raises(FigureError, match=r"exited with 1: error: .*no-such\.yaml"):
        docs_figures.command_output("specfleet render -f no-such.yaml")
