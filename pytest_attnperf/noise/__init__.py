"""The noise benchmark (a console script): repeated runs, injected slowdowns and what the gate caught."""
