"""The roofline a decode step follows, fitted to a measured step-time table (pure).

A decode step of an engine reads the target's weights once and runs the drafter's K passes whatever
the batch: a time floor, which the table measures at its smallest batch. On top of that it does work
in proportion to the tokens it verifies, batch x (1 + K) (the target's compute, what the step grows
with once the batch is large enough for the GPU to be compute-bound), work per running request
whatever K (reading its KV cache, sampling), and in an engine started with the drafter more work per
running request (the drafter's passes over it, its KV, the rejection sampler; vLLM's K=0 inside a
speculating engine is slower than a plain engine, the more so the more requests run):

    step_ms(b, K) = floor(K) + (b - b_min) x (a + s x min(K, 1) + c x (1 + K))

(min(K, 1): 1 for every drafting K, and linear between K 0 and 1 as the table is.) `floor(K)` is the
smallest batch's row of the table (linear between its K values; beyond the largest K one more draft
costs the row's mean cost per draft, one more drafter pass). `a`, `s` (ms per request)
and `c` (ms per verified token) are the least-squares fit over every point of the table, each held at
or above 0 so the roofline is monotone in batch and in K. A table whose step grows with the batch the
same at every K says verification is free (c and s 0); one whose growth is in proportion to 1 + K
says it is all compute (a and s 0).

`StepTimeProfile` uses it only past its table (a batch above the largest measured or a K above the
largest), anchored at the table's edge; inside the table the measured points are interpolated.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Roofline:
    """A decode step's floor at each K plus compute per verified token (module docstring)."""

    min_batch: float  # the smallest batch of the table: the floor is its row
    ks: tuple[float, ...]  # the table's K values, increasing
    floor_ms: tuple[float, ...]  # the smallest batch's step time at each of `ks`
    ms_per_draft: float  # the floor's growth per draft beyond the largest K
    ms_per_request: float  # a: work per running request, whatever K
    ms_per_speculating_request: float  # s: more work per running request with the drafter (K > 0)
    ms_per_token: float  # c: compute per verified token

    def floor(self, k: float) -> float:
        """Milliseconds a step takes at the smallest batch with `k` drafts per request."""
        ks, ys = self.ks, self.floor_ms
        if k >= ks[-1]:
            return ys[-1] + self.ms_per_draft * (k - ks[-1])
        if k <= ks[0]:
            return ys[0]
        i = bisect.bisect_right(ks, k)  # ks[i-1] <= k < ks[i]
        return ys[i - 1] + (ys[i] - ys[i - 1]) * (k - ks[i - 1]) / (ks[i] - ks[i - 1])

    def step_ms(self, batch: float, k: float) -> float:
        """Milliseconds of one step of `batch` requests verifying `k` drafts each."""
        more = max(0.0, batch - self.min_batch)
        speculating = self.ms_per_speculating_request * min(k, 1.0)
        return self.floor(k) + more * (self.ms_per_request + speculating + self.ms_per_token * (1.0 + k))

    @classmethod
    def fit(
        cls,
        batch_sizes: Sequence[int],
        ks: Sequence[int],
        step_ms: Sequence[Sequence[float]],
    ) -> Roofline:
        """Fit to a table (`step_ms[i][j]` at `batch_sizes[i]`, `ks[j]`; both increasing).

        Each point's time less the floor at its K is `a u + s u min(K, 1) + c u (1 + K)` with
        u = b - b_min; (a, s, c) minimize the squared error over all points with each >= 0. All are
        0 where the table has one batch size.
        """
        b_min = float(batch_sizes[0])
        floor = tuple(float(t) for t in step_ms[0])
        k_values = tuple(float(k) for k in ks)
        per_draft = max(0.0, (floor[-1] - floor[0]) / k_values[-1]) if k_values[-1] > 0 else 0.0
        rows: list[tuple[float, ...]] = []
        targets: list[float] = []
        for b, row in zip(batch_sizes, step_ms, strict=True):
            for k, t, base in zip(k_values, row, floor, strict=True):
                u = b - b_min
                rows.append((u, u * min(k, 1.0), u * (1.0 + k)))
                targets.append(t - base)
        a, s, c = _nonnegative_least_squares(rows, targets)
        return cls(
            min_batch=b_min,
            ks=k_values,
            floor_ms=floor,
            ms_per_draft=per_draft,
            ms_per_request=a,
            ms_per_speculating_request=s,
            ms_per_token=c,
        )


def _nonnegative_least_squares(rows: Sequence[tuple[float, ...]], targets: Sequence[float]) -> list[float]:
    """Coefficients >= 0 minimizing the sum of (target - row . x)^2: the least-squares solution on
    each subset of the columns (the optimum is the unconstrained one on its own support), the best
    of those that come out non-negative. For the few columns here, enumerating is exact and cheap."""
    n = len(rows[0]) if rows else 0

    def error(x: Sequence[float]) -> float:
        return sum(
            (t - sum(xi * ri for xi, ri in zip(x, r, strict=True))) ** 2
            for r, t in zip(rows, targets, strict=True)
        )

    best, best_error = [0.0] * n, error([0.0] * n)
    for size in range(1, n + 1):
        for support in itertools.combinations(range(n), size):
            solved = _solve_normal_equations(rows, targets, support)
            if solved is None or min(solved) < 0:
                continue
            x = [0.0] * n
            for column, value in zip(support, solved, strict=True):
                x[column] = value
            e = error(x)
            if e < best_error - 1e-12:
                best, best_error = x, e
    return best


def _solve_normal_equations(
    rows: Sequence[tuple[float, ...]], targets: Sequence[float], support: Sequence[int]
) -> list[float] | None:
    """The least-squares coefficients of the `support` columns (Gaussian elimination with partial
    pivoting on the normal equations); None where they are singular."""
    m = len(support)
    a = [[sum(r[i] * r[j] for r in rows) for j in support] for i in support]
    b = [sum(r[i] * t for r, t in zip(rows, targets, strict=True)) for i in support]
    scale = max((abs(v) for line in a for v in line), default=0.0)
    for col in range(m):
        pivot = max(range(col, m), key=lambda i: abs(a[i][col]))
        if abs(a[pivot][col]) <= 1e-12 * scale or scale == 0:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        b[col], b[pivot] = b[pivot], b[col]
        for i in range(col + 1, m):
            f = a[i][col] / a[col][col]
            for j in range(col, m):
                a[i][j] -= f * a[col][j]
            b[i] -= f * b[col]
    x = [0.0] * m
    for i in reversed(range(m)):
        x[i] = (b[i] - sum(a[i][j] * x[j] for j in range(i + 1, m))) / a[i][i]
    return x
