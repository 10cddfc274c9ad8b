"""Run the suites from a checkout without installing: load the plugin from this tree.

When pytest-attnperf is installed, its pytest11 entry point already registered the plugin
under the name ``pytest_attnperf.plugin``, and pytest skips this request.
"""

pytest_plugins = ["pytester", "pytest_attnperf.plugin"]
