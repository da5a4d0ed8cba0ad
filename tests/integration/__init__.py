"""Integration tests against the real local control plane (see conftest.py)."""
