"""Pure resize decisions: from the spec, the current world, worker states and free capacity,
decide whether to keep the world or form a new one, and why. Imports nothing from Kubernetes or
Kopf; time is injected."""
