"""Maintenance scripts run from the repository (not shipped with the package)."""
