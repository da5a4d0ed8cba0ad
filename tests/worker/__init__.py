"""Tests of elastra_worker, the in-pod runtime (CPU, gloo, several processes)."""
