"""Softmax attention: case type and kernels, fp64 reference, sliced checks for long sequences, the built-in suite."""
