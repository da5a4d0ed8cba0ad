"""Kopf handlers: read the TrainingJob and its children, call the pure planner and resize
policy, apply the difference through elastra.kube, write status once."""
