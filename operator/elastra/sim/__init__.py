"""Trace-driven cluster simulator that reuses the planner and the resize policy, so its figures
are those of the operator's own code."""
