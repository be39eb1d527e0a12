"""The protocol's statistics over seeds: mean ± sd, the paired difference to the reference arm with its t, the
Pitman–Morgan test of equal spread for paired runs, and a curve's largest rise (a divergence shows as a jump)."""

from __future__ import annotations

import math
import statistics


def mean_sd(values: list[float], fmt: str) -> str:
    """Mean ± sample sd over seeds; a single value where there is no spread to show."""
    if len(set(values)) == 1:  # one seed, or a quantity the seed does not change (state bytes)
        return format(values[0], fmt)
    return f"{format(statistics.mean(values), fmt)} ± {format(statistics.stdev(values), fmt)}"


def max_rise(curve: list[float]) -> float:
    """The largest increase of the eval loss between two consecutive evaluations (0 for a monotone curve)."""
    return max([0.0] + [b - a for a, b in zip(curve, curve[1:], strict=False)])


def paired(reference: list[float], arm: list[float]) -> str:
    """mean of (L_ref − L_arm) over seeds and its paired t; positive = the arm is better."""
    diffs = [r - a for r, a in zip(reference, arm, strict=True)]
    mean = statistics.fmean(diffs)
    if len(diffs) < 2 or not all(math.isfinite(d) for d in diffs):
        return f"{mean:+.4f}"
    sd = statistics.stdev(diffs)
    t = mean / (sd / math.sqrt(len(diffs))) if sd > 0 else math.inf
    return f"{mean:+.4f} (t = {t:.1f}; " + ", ".join(f"{d:+.3f}" for d in diffs) + ")"


def pitman_morgan(reference: list[float], arm: list[float]) -> tuple[float, float]:
    """(sd ratio arm / reference, two-sided p of the Pitman–Morgan test that the two variances are equal).

    The seeds are shared, so the two spreads are not independent samples (an F test would be wrong): for paired X, Y,
    var X = var Y exactly when X + Y and Y − X are uncorrelated, and t = r √(n − 2) / √(1 − r²) has n − 2 degrees
    of freedom under that hypothesis, for normal pairs (Pitman 1939, Morgan 1939)."""
    from scipy import stats

    if len(arm) < 3 or len(reference) != len(arm):
        raise ValueError(f"the test needs the same >= 3 seeds for both arms, got {len(reference)} and {len(arm)}")
    ratio = statistics.stdev(arm) / statistics.stdev(reference)
    pairs = list(zip(reference, arm, strict=True))
    r = statistics.correlation([a + b for a, b in pairs], [b - a for a, b in pairs])
    t = r * math.sqrt(len(arm) - 2) / math.sqrt(max(1.0 - r * r, 1e-300))
    return ratio, 2.0 * float(stats.t.sf(abs(t), len(arm) - 2))


def spread_test(reference: list[float], arm: list[float]) -> str:
    """The table's spread cell: sd ratio and the Pitman–Morgan p ("" below three seeds or for a diverged run)."""
    if len(arm) < 3 or not all(math.isfinite(v) for v in [*reference, *arm]):
        return ""
    ratio, p = pitman_morgan(reference, arm)
    return f"{ratio:.2f} (p = {p:.2f})"
