"""Argument types of the `tfdist` commands: seconds and positive counts.

Each is an argparse `type=`: it returns the parsed value or raises `ArgumentTypeError` with a
message that quotes the text and says what to give instead.
"""

from __future__ import annotations

import argparse
import math


def positive_seconds(text: str, hint: str) -> float:
    """A positive, finite number of seconds; `hint` ends the error message."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a positive number of seconds. HINT: {hint}"
        )
    return value


def seconds(text: str) -> float:
    """A positive, finite number of seconds (`--timeout`)."""
    return positive_seconds(
        text, "e.g. --timeout 600 stops the job after 10 minutes; leave --timeout out for no limit."
    )


def positive_int(text: str) -> int:
    """A whole number of at least 1 (`verify --steps`)."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)
