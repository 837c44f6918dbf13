"""Scenario files: the typed schema, calibration profiles, and loading with preset resolution."""

from simspec.scenario.loader import ResolvedScenario, load_scenario, resolve
from simspec.scenario.schema import Scenario

__all__ = ["ResolvedScenario", "Scenario", "load_scenario", "resolve"]
