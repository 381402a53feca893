"""Serving backends BOute talks to over HTTP: the CPU emulated backend (``backends.emulated``)."""
