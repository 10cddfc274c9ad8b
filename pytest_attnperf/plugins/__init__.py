"""The run's plugin objects, each with its own hooks and state, registered by ``plugin.pytest_configure``
where the run uses it: case isolation, pool runs, Triton's cache, the run history, the timeline, the
correctness failures and the pytest-xdist controller (docs/architecture.md, "Plugin objects")."""
