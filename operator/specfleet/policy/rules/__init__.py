"""Stage 3, what each rule asks for (pure): the mode rules (`goodput`, `threshold`), the adjustments
(`retune`, `canaries`), the safety rules (`revert`, `dip`, `gates`) and acceptance drift (`drift`);
each returns a `results.Wanted` or a `results.PoolDecision`."""
