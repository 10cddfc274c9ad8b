"""Which kernels run on which shapes: the kernel registry, the suites' parametrization, which memory
bound a kernel is held to, and one folder per attention family."""
