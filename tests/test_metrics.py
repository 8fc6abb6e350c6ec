"""selskill.measure.metrics' bootstrap: every resample is the point estimate of the rows it draws, seeded."""

import random

import numpy as np
import pytest

from selskill.measure.metrics import (
    METRICS,
    _draw_counts,
    _episodes,
    _weighted,
    compute_metrics,
    paired_sr_difference,
)


def _rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        calls = rng.choice([0, 0, 1, 2, 3])
        rows.append(
            {
                "task_id": f"valid_seen/t{i}",
                "task_type": "x",
                "success": rng.random() < 0.5,
                "n_skill_calls": calls,
                "n_precise_calls": rng.randint(0, calls),
                "env_steps": rng.randint(1, 50),
                "n_malformed": rng.randint(0, 2),
                "n_turns": rng.randint(0, 40) if i else 0,  # one episode without turns
            }
        )
    return rows


@pytest.mark.parametrize("steps", ["n_turns", "env_steps"])
def test_each_resample_equals_the_point_estimate_of_the_rows_it_draws(steps):
    rows = _rows(9, 1)
    counts = _draw_counts(len(rows), 50, seed=3)
    draws = _weighted(_episodes(rows, steps), counts)
    for k, row_counts in enumerate(counts):
        drawn = [r for r, c in zip(rows, row_counts, strict=True) for _ in range(c)]
        point = compute_metrics(drawn, n_boot=0, steps=steps)
        for m in METRICS:
            want = np.nan if point[m] is None else point[m]
            assert draws[m][k] == pytest.approx(want, nan_ok=True), (k, m)
        assert draws["skill_calls"][k] == point["skill_calls"]


def test_draw_counts_resample_n_items_uniformly():
    counts = _draw_counts(7, 20000, seed=0)
    assert counts.shape == (20000, 7) and (counts.sum(axis=1) == 7).all()
    assert counts.mean(axis=0) == pytest.approx(np.ones(7), abs=0.03)


def test_intervals_are_seeded_and_pinned():
    rows = _rows(40, 2)
    a, b = compute_metrics(rows, n_boot=300, seed=5), compute_metrics(rows, n_boot=300, seed=5)
    assert a == b and a["ci"] != compute_metrics(rows, n_boot=300, seed=6)["ci"]
    for m in METRICS:
        lo, hi = a["ci"][m]
        assert lo <= a[m] <= hi, m
    # numpy's Generator(PCG64) draws: a change of RNG or of the percentile rule shows here
    assert a["ci"]["sr"] == [0.35, 0.65]
    d = paired_sr_difference(rows, [r | {"success": True} for r in rows], n_boot=300, seed=5)
    assert d == {"tasks": 40, "diff": 0.5, "ci": [0.35, 0.625]}
