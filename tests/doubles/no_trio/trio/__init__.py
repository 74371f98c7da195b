"""Stands in for trio on a real runner's path in tests (tests/doubles/runner.py): the test venv
holds trio only as selenium's dependency (the status page test), and httpcore2 imports it
whenever it is installed, ~0.13 CPU-s per runner that a production venv never pays."""

raise ImportError("trio is kept out of the runners under test")
