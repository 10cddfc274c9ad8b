"""Linear attention (LA, GLA, simple GLA, Gated DeltaNet): case type and kernels, fp64 recurrences,
cost models, the memory bound of a chunked kernel, the built-in suite."""
