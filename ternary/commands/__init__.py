"""One module per `ternary` subcommand (see ternary/cli.py)."""


def positive_int(text: str) -> int:
    """argparse type for sizes such as --group-size: a clear usage error for 0, -8 or 'x'."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value
