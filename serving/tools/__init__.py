"""Tools around the service that the service itself never imports.

``demo`` scores one admission of the demo release through a running server (``python -m
serving.tools.demo``); ``server_process`` runs ``python -m serving`` in a child process and waits
for /readyz (the demo, the quickstart notebook, benches and tests); ``tiny_export`` writes a tiny
untrained export through the real exporter, to try the API, test the service and benchmark its
overheads. They run from a checkout: the wheel leaves this package out (pyproject.toml).
"""
