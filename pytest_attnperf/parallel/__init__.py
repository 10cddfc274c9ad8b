"""Runs spread over pytest-xdist workers (one per GPU) and their shared state."""
