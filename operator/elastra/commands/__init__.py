"""One module per ``elastra`` subcommand; each has ``register(subparsers)``."""
