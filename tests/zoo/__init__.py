"""Zoos of attention kernels, right ones that round their own way and wrong ones, for testing the checks."""
