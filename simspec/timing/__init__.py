"""The time model: batch shape -> cost breakdown. Pure functions of presets and coefficients; no SimPy here."""

from simspec.timing.iteration import IterationCost, IterationModel

__all__ = ["IterationCost", "IterationModel"]
