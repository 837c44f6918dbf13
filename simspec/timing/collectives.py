"""Tensor-parallel collective cost: message size -> microseconds, from a measured curve per box.

Between measured points the time is linear; below the first point it is flat (latency-bound). Above the last
point the curve goes on in the protocol NCCL runs there, since NCCL picks its protocol by its own tuning model,
not by timing the box: a curve measured only where that model still picks LL (on 8 PCIe GPUs up to ~1.5 MB at
40 GB/s: where LL's latency 6.6 + 2(p-1) hwLat and half the bus bandwidth cost more than Simple's latency and
the full one) grows at LL's bandwidth term 2(p-1)/p * n / (busbw / 2) up to that switch, and past it at Simple's
latency plus 2(p-1)/p * n / busbw (nccl-tests' bus-bandwidth definition); a curve measured past the switch
grows at that bandwidth term from its last point. A curve with no bus bandwidth goes on along its last segment.
(One dual-socket box of 8 RTX PRO 6000, given its 64 KB point alone, comes out within 20% of its measured
256 KB-2 MB times this way, where the bandwidth term from the last point missed them by 35-42%:
tests/test_timing.py.)
A curve measured on p_ref GPUs is moved to p GPUs in two parts: its small-message time (the first point) by
NCCL's own ring-latency model, baseLat + 2(p-1) hwLat with the LL protocol's baseLat 6.6 us and hwLat
0.6 us (NVLink) or 1.0 us (PCIe), and what larger messages add on top by the ring's bandwidth factor
2(p-1)/p (NCCL tuning model, shared/reference/hardware-and-models.md).

A curve derived from NCCL's tuning model instead of measured (CollectiveCurve.nccl_ring: the NVLink presets and
pcie4-nccl) prices each message as NCCL's own model does, at the fastest of its ring protocols, each its latency plus
the bytes at its bus bandwidth (NCCL src/graph/tuning.cc, the ring refinements of ncclTopoTuneModel, v2.28):
  - LL: the curve's latency (baseLat 6.6 + 2(p-1) hwLat); its bus bandwidth half the link's (each 8 bytes of data
    travel with an 8-byte flag) and at most NCCL's llMaxBws for the GPU generation inside one node (87.7 GB/s
    Ampere, 141 Hopper, 282 Blackwell). On an NVSwitch box the cap binds: an H100's LL moves 141 GB/s of bus
    bandwidth where its Simple protocol reaches the ~365 GB/s nccl-tests measures.
  - LL128 (NVLink only by default): baseLat 14.0 + 2(p-1) x 1.9 us, 120 of every 128 bytes data (0.92 of the link).
  - Simple: baseLat 8.4 + 2(p-1) x 3.4 us (NVLink) or 5.7 (PCIe), the full bus bandwidth (bus_bandwidth_gbps).
So a message from ~100 KB to a few MB, which LL still carries, pays 2.6 times the Simple protocol's bandwidth term
on H100s: at TP 8, 28 us at 1 MiB where the LL latency plus the Simple bandwidth gave 20
(validation/HISTORY.md, 2026-12-05 round 14). NVLS (NVLink SHARP) is not modelled: NCCL picks it only for messages
far larger than a decode step's.
"""

from __future__ import annotations

from bisect import bisect_left
from functools import lru_cache

from simspec.scenario.profile import CollectiveCurve

# NCCL's ring latency per protocol: baseLat + 2(p-1) hwLat, baseLat and hwLat per link (hardware-and-models.md), and
# the share of the link's bus bandwidth LL and LL128 carry as data (tuning.cc: LL x 0.5, LL128 x 0.92 = 120/128)
NCCL_RING_LATENCY_US = {  # protocol: (baseLat, {link: hwLat})
    "LL": (6.6, {"nvlink": 0.6, "pcie": 1.0}),
    "LL128": (14.0, {"nvlink": 1.9, "pcie": 2.5}),
    "Simple": (8.4, {"nvlink": 3.4, "pcie": 5.7}),
}
NCCL_LL_BANDWIDTH_SHARE = 0.5
NCCL_LL128_BANDWIDTH_SHARE = 0.92


def ring_latency_us(p: int, link: str, protocol: str = "LL") -> float:
    base, hw = NCCL_RING_LATENCY_US[protocol]
    return base + 2 * (p - 1) * hw[link]


def ring_us_per_byte(p: int, bus_bandwidth_gbps: float) -> float:
    """Microseconds a ring all-reduce over p GPUs spends per byte of its message at this bus bandwidth."""
    return 2 * (p - 1) / p / (bus_bandwidth_gbps * 1e9) * 1e6


def ring_protocols_beside_ll(p: int, link: str, bus_bandwidth_gbps: float, ll128: bool) -> list[tuple[float, float]]:
    """NCCL's ring protocols other than LL as its tuning model prices them, each (latency us, us per byte): Simple
    at the full bus bandwidth, and LL128 at 120/128 of it where NCCL runs LL128."""
    lines = [(ring_latency_us(p, link, "Simple"), ring_us_per_byte(p, bus_bandwidth_gbps))]
    if ll128:
        lines.append((ring_latency_us(p, link, "LL128"),
                      ring_us_per_byte(p, NCCL_LL128_BANDWIDTH_SHARE * bus_bandwidth_gbps)))
    return lines


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
        # NCCL's other ring protocols, as (latency us, us per byte), for a curve derived from its tuning model
        self._protocols: list[tuple[float, float]] = []
        self._ll_until, self._past_ll = float("inf"), []
        ring = curve.nccl_ring
        if ring is not None and curve.bus_bandwidth_gbps and tp > 1:
            busbw = curve.bus_bandwidth_gbps
            # the curve itself is LL: its latency, then LL's share of the link up to NCCL's cap
            self._tail_us_per_byte = ring_us_per_byte(
                tp, min(ring.ll_max_bus_bandwidth_gbps, NCCL_LL_BANDWIDTH_SHARE * busbw))
            self._protocols = ring_protocols_beside_ll(tp, link, busbw, ring.ll128)
        elif curve.bus_bandwidth_gbps and tp > 1:
            busbw = curve.bus_bandwidth_gbps
            ll_latency, ll_rate = ring_latency_us(tp, link, "LL"), ring_us_per_byte(tp, NCCL_LL_BANDWIDTH_SHARE * busbw)
            others = ring_protocols_beside_ll(tp, link, busbw, ll128=link == "nvlink")  # NCCL's default LL128 use
            # NCCL picks a protocol by its own model, not by timing the box: it keeps LL up to the size where
            # the model prices another protocol cheaper, however slow LL really is on the box
            switch = min((lat - ll_latency) / (ll_rate - rate) for lat, rate in others if rate < ll_rate)
            if self._sizes[-1] < switch:
                # measured in LL only: past the last point LL goes on at its own bus bandwidth term (half the
                # link's), not at the last segment's slope, which on a small-message curve still holds latency
                # effects or, on a curve fitted to step times, what else those steps cost (validation/HISTORY.md
                # round 29); past NCCL's switch, the other protocols at their latencies and bus bandwidths (a box
                # whose measured LL runs above NCCL's model drops there: M1's profile by ~80 us at ~1.5 MB)
                self._tail_us_per_byte = ll_rate
                self._ll_until, self._past_ll = switch, others
            else:  # measured past the switch: the full bus bandwidth from the last point
                self._tail_us_per_byte = ring_us_per_byte(tp, busbw)
        elif curve.bus_bandwidth_gbps:
            self._tail_us_per_byte = 0.0
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
        own = (self._curve_us(nbytes) if nbytes < self._ll_until
               else min(latency_us + nbytes * us_per_byte for latency_us, us_per_byte in self._past_ll))
        for latency_us, us_per_byte in self._protocols:
            own = min(own, latency_us + nbytes * us_per_byte)
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
