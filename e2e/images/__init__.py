"""Images built without a registry: see build.py and README.md."""
