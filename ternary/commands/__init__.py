"""One module per `ternary` subcommand (see ternary/cli.py)."""
