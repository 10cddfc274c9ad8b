"""Which kernels run on which shapes: the kernel registry, the suites' parametrization and one
folder per attention family."""
