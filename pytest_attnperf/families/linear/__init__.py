"""Linear attention (LA, GLA, simple GLA, Gated DeltaNet): case type and kernels, fp64 recurrences,
cost models, the built-in suite."""
