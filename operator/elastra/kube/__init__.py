"""The only door to the Kubernetes API: inventory, pods, services, events and status writes.
Nothing else in Elastra makes an API call."""
