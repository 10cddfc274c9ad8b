"""Kernels for testing the checks: correct ones that round differently, and wrong ones."""
