"""Fit a profile's all-reduce curve so the time model reproduces measured iteration times.

Each anchor is a measured iteration (a resolved scenario, a batch size, a context, the measured time)
and the message size whose all-reduce time it pins: the size of that iteration's dominant collective
(batch x tokens per request x hidden x 2 bytes). Anchors are solved in order of message size, since an
iteration also pays collectives of smaller sizes (draft passes) that earlier anchors already fixed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from scipy.optimize import brentq

from simspec.scenario.loader import ResolvedScenario
from simspec.scenario.profile import CollectiveCurve
from simspec.timing.iteration import IterationCost, IterationModel


@dataclass(frozen=True)
class Anchor:
    label: str
    resolved: ResolvedScenario
    batch_size: int
    context_tokens_per_request: float
    measured_iteration_ms: float
    message_bytes: int


def model_with_curve(rs: ResolvedScenario, curve: CollectiveCurve) -> IterationModel:
    return IterationModel(dataclasses.replace(rs, all_reduce=curve))


def iteration_cost(a: Anchor, curve: CollectiveCurve) -> IterationCost:
    return model_with_curve(a.resolved, curve).decode(a.batch_size, a.batch_size * a.context_tokens_per_request)


def fit_all_reduce(anchors: list[Anchor], *, measured_gpus: int, bus_bandwidth_gbps: float | None,
                   source: str, max_us: float = 100_000.0, passes: int = 50, tol_us: float = 1e-4) -> CollectiveCurve:
    """Solve one (bytes, us) point per anchor so that each anchor's modelled iteration time matches.

    A first pass solves the anchors in order of message size, each with the points below it fixed. An
    iteration may also pay a collective past its own point (the logits' all-gather), priced along the curve's
    continuation past its last point, which a later point moves: further passes solve each point again with the
    others fixed until no point moves by more than tol_us."""
    ordered = sorted(anchors, key=lambda x: x.message_bytes)
    points: list[tuple[float, float]] = []

    def solve(i: int, a: Anchor) -> float:
        floor = points[i - 1][1] if i > 0 else 1e-3  # time never falls as messages grow

        def residual(t_us: float) -> float:
            trial = points[:i] + [(float(a.message_bytes), t_us)] + points[i + 1:]
            curve = CollectiveCurve(measured_gpus=measured_gpus, points_bytes_us=trial,
                                    bus_bandwidth_gbps=bus_bandwidth_gbps, source=source)
            return iteration_cost(a, curve).total_ms - a.measured_iteration_ms

        ceiling = points[i + 1][1] if i + 1 < len(points) else max_us  # nor rises past a larger message's
        if residual(floor) > 0:
            raise ValueError(f"{a.label}: the model is already slower than measured with the fastest admissible"
                             f" all-reduce ({floor:.1f} us at {a.message_bytes} B); the compute side overestimates")
        if residual(ceiling) < 0:
            raise ValueError(f"{a.label}: the model stays faster than measured with the slowest admissible"
                             f" all-reduce ({ceiling:.1f} us at {a.message_bytes} B)")
        return float(brentq(residual, floor, ceiling, xtol=1e-6))

    for i, a in enumerate(ordered):
        points.append((float(a.message_bytes), solve(i, a)))
    for _ in range(passes):
        moved = 0.0
        for i, a in enumerate(ordered):
            t = solve(i, a)
            moved = max(moved, abs(t - points[i][1]))
            points[i] = (points[i][0], t)
        if moved <= tol_us:
            break
    else:
        raise ValueError(f"the all-reduce points did not settle within {passes} passes (last move {moved:.3g} us)")
    return CollectiveCurve(measured_gpus=measured_gpus, points_bytes_us=points, bus_bandwidth_gbps=bus_bandwidth_gbps,
                           source=source)
