"""Case tables shared by the unit tests (pydantic) and the integration tests (API server)."""
