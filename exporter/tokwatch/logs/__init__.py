"""Logging for a fleet: volume control that never hides a distinct problem."""
