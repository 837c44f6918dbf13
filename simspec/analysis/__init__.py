"""Metrics computed from the engine's raw records, and their presentation."""
