"""The maintainers' noise benchmark, run from a checkout (not installed): repeated runs and injected slowdowns."""
