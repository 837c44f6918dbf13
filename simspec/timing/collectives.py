"""Tensor-parallel collective cost: message size -> microseconds, from a measured curve per box.

Between measured points the time is linear; below the first point it is flat (latency-bound); above the
last point it grows by the ring bandwidth term 2(p-1)/p * n / busbw (nccl-tests' bus-bandwidth definition).
A curve measured on p_ref GPUs is moved to p GPUs in two parts: its small-message time (the first point) by
NCCL's own ring-latency model, baseLat + 2(p-1) hwLat with the LL protocol's baseLat 6.6 us and hwLat
0.6 us (NVLink) or 1.0 us (PCIe), and what larger messages add on top by the ring's bandwidth factor
2(p-1)/p (NCCL tuning model, shared/reference/hardware-and-models.md).
"""

from __future__ import annotations

from bisect import bisect_left
from functools import lru_cache

from simspec.scenario.profile import CollectiveCurve

NCCL_LL_BASE_LATENCY_US = 6.6
NCCL_LL_HW_LATENCY_US = {"nvlink": 0.6, "pcie": 1.0}


def ring_latency_us(p: int, link: str) -> float:
    return NCCL_LL_BASE_LATENCY_US + 2 * (p - 1) * NCCL_LL_HW_LATENCY_US[link]


class Collectives:
    """All-reduce and all-gather times for one TP group."""

    def __init__(self, curve: CollectiveCurve, tp: int, link: str):
        self.tp = tp
        p_ref = curve.measured_gpus
        latency_scale = ring_latency_us(tp, link) / ring_latency_us(p_ref, link) if tp > 1 else 0.0
        bandwidth_scale = (2 * (tp - 1) / tp) / (2 * (p_ref - 1) / p_ref) if tp > 1 else 0.0
        self._sizes = [float(s) for s, _ in curve.points_bytes_us]
        base = float(curve.points_bytes_us[0][1])
        self._times = [base * latency_scale + (float(t) - base) * bandwidth_scale for _, t in curve.points_bytes_us]
        if curve.bus_bandwidth_gbps:
            self._tail_us_per_byte = 2 * (tp - 1) / tp / (curve.bus_bandwidth_gbps * 1e9) * 1e6 if tp > 1 else 0.0
        elif len(self._sizes) > 1:
            self._tail_us_per_byte = (self._times[-1] - self._times[-2]) / (self._sizes[-1] - self._sizes[-2])
        else:
            self._tail_us_per_byte = 0.0
        # an implementation that dispatches by size (SGLang's custom all-reduce below its max size, NCCL above;
        # the PCIe one-shot kernel's threshold is picked by timing both) costs the faster of the two at each size
        self._fallback = Collectives(curve.fallback, tp, link) if curve.fallback is not None else None
        self.all_reduce_us = lru_cache(maxsize=4096)(self._all_reduce_us)

    def _all_reduce_us(self, nbytes: float) -> float:
        if self.tp == 1 or nbytes <= 0:
            return 0.0
        own = self._curve_us(nbytes)
        return min(own, self._fallback.all_reduce_us(nbytes)) if self._fallback is not None else own

    def _curve_us(self, nbytes: float) -> float:
        sizes, times = self._sizes, self._times
        if nbytes <= sizes[0]:
            return times[0]
        if nbytes >= sizes[-1]:
            return times[-1] + (nbytes - sizes[-1]) * self._tail_us_per_byte
        i = bisect_left(sizes, nbytes)
        s0, s1, t0, t1 = sizes[i - 1], sizes[i], times[i - 1], times[i]
        return t0 + (t1 - t0) * (nbytes - s0) / (s1 - s0)

    def all_gather_us(self, total_bytes: float) -> float:
        """A ring all-gather moves (p-1)/p of the output, half an all-reduce's 2(p-1)/p: priced as the
        all-reduce of half the bytes (same latency; NCCL's all-gather latency is lower, so this errs slow)."""
        return self.all_reduce_us(total_bytes / 2)
