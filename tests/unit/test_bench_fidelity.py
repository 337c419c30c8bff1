"""The fidelity benchmark's published-run table (`benchmarks/fidelity.py`) is well-formed: every run names
its source and free inputs, the ratios it states agree with the measurements they are quotients of and
with the acceptance they were derived from, and one small run simulates in a few seconds."""

from __future__ import annotations

from typing import Any

import pytest

from specfleet_runtime.cost_profile import (
    default_profile,
    expected_tokens_per_step,
    speedup,
    validate_acceptance,
)
from support.benchmarks import load_benchmark

fid = load_benchmark("fidelity")


@pytest.mark.parametrize("run", fid.RUNS, ids=lambda r: f"{r.group}/{r.label}")
def test_every_run_states_its_source_inputs_and_what_it_leaves_free(run: Any) -> None:
    assert run.source.startswith("https://")
    assert run.model
    assert run.gpu
    assert run.drafter
    assert run.acceptance_how
    assert run.lengths_how
    assert run.free, "a run names the inputs its source leaves free (or says none)"
    assert run.tp >= 1
    assert run.k >= 1
    assert run.concurrency >= 1
    assert min(run.lengths) >= 1
    assert run.quantity in (fid.TPOT_RATIO, fid.THROUGHPUT_RATIO)
    assert 0 < run.published < 5
    acceptance = validate_acceptance(run.acceptance)
    assert len(acceptance) >= run.k, "the simulator needs an acceptance for every drafted position"


@pytest.mark.parametrize("run", [r for r in fid.RUNS if r.parts], ids=lambda r: f"{r.group}/{r.label}")
def test_a_stated_ratio_is_the_quotient_of_its_stated_measurements(run: Any) -> None:
    numerator, denominator = run.parts
    assert run.published == pytest.approx(numerator / denominator, rel=0.005)


def test_derived_acceptance_gives_back_the_published_acceptance_lengths() -> None:
    for acceptance, lengths in (
        (fid.EAGLE1_ACCEPTANCE, fid.EAGLE1_AL),
        (fid.EAGLE3_ACCEPTANCE, fid.EAGLE3_AL),
    ):
        for k, length in lengths.items():
            assert expected_tokens_per_step(acceptance, k) == pytest.approx(length, abs=0.005)


def test_the_dynamic_sd_conclusions_agree_with_the_table_they_are_drawn_from() -> None:
    """At the table's own batch sizes the quoted speedups are its decode-only goodput ratios."""
    profile = default_profile()
    rows = [r for r in fid.RUNS if r.source == fid.DYNAMIC_SD and r.concurrency in profile.batch_sizes]
    assert len(rows) >= 3
    for run in rows:
        assert run.published == pytest.approx(
            speedup(profile, run.concurrency, run.k, run.acceptance), rel=0.02
        )


def test_runs_not_simulated_say_why() -> None:
    assert fid.NOT_SIMULATED
    for entry in fid.NOT_SIMULATED:
        assert entry.source
        assert entry.what
        assert entry.why


def test_one_small_case_simulates_and_renders() -> None:
    run = next(r for r in fid.RUNS if r.source == fid.AL_BY_K and r.k == 3)
    simulated = fid.simulate_run(run, duration=60.0)
    assert simulated.tpot_on_ms < simulated.tpot_off_ms
    assert simulated.within
    page = fid.render([simulated], [], 60.0, 1.0)
    assert page.startswith("# Fidelity")
    assert f"`{fid.COMMAND}`" in page
    assert run.source in page


def test_each_run_names_its_drafter_method_in_the_resource_it_simulates() -> None:
    assert {r.method for r in fid.RUNS} == {"eagle", "eagle3"}
    for run in fid.RUNS:
        assert run.method == ("eagle3" if "EAGLE3-" in run.drafter else "eagle")
        assert fid.resource(run.method).spec.drafter.method == run.method


def test_an_eagle3_row_runs_on_the_products_eagle3_default() -> None:
    """The headline is the product's own pick for an eagle3 drafter, not a benchmark-side table."""
    run = next(r for r in fid.RUNS if r.source == fid.AL_BY_K and r.method == "eagle3" and r.k == 3)
    headline = fid.simulate_run(run, duration=60.0)
    assert headline.value == pytest.approx(fid.simulate_run(run, 60.0, default_profile("eagle3")).value)
    assert headline.value < fid.simulate_run(run, 60.0, default_profile("eagle")).value
    assert headline.within
