"""What Horovod has and tfdist's Horovod API does not: one error for each, naming what to use.

Imports nothing of TensorFlow.
"""

from __future__ import annotations

__all__ = ["Unsupported", "unsupported"]

DOCS = "docs/horovod.md"


class Unsupported(NotImplementedError):
    """A Horovod feature tfdist does not carry."""


def unsupported(feature: str, alternative: str) -> Unsupported:
    """The error for `feature`, naming `alternative` and the migration page."""
    return Unsupported(
        f"tfdist's Horovod API does not support {feature}. HINT: use {alternative} "
        f"(the migration page, {DOCS}, lists what differs from Horovod)."
    )


def refuse(feature: str, alternative: str):
    """A function that raises `unsupported(feature, alternative)` whatever it is called with,
    for the names of Horovod's API that tfdist does not carry."""

    def refused(*args, **kwargs):
        raise unsupported(feature, alternative)

    refused.__name__ = feature.split("(")[0].replace(" ", "_")
    refused.__doc__ = f"Unsupported in tfdist: {feature}. Use {alternative}."
    return refused
