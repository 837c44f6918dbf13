"""Calibration: turning measurements of a real server into a profile the time model reads."""
