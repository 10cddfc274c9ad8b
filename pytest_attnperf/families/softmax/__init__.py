"""Softmax attention: case type and kernels, fp64 reference, sliced checks for long sequences, the
memory bound of a tiled kernel, the built-in suite."""
