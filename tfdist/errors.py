"""tfdist's exceptions, and the one check of a whole-number argument.

A leaf: imports nothing of tfdist, nor TensorFlow. Every message tfdist raises quotes the value
it refuses, says what was expected, and ends with a HINT naming the fix.
"""

from __future__ import annotations

__all__ = ["ClusterConfigError", "TaskUnavailableError", "is_count", "is_int"]


class ClusterConfigError(ValueError):
    """A cluster description (TF_CONFIG, host lists, SLURM variables) is invalid.

    The message quotes the offending value, says what was expected, and how to fix it.
    """


class TaskUnavailableError(RuntimeError):
    """A task of the parameter-server job cannot be reached (its process died or hangs).

    Attributes:
        tasks: list of task names ("ps:0") found unreachable.
        addresses: their "host:port" addresses.
    """

    def __init__(self, message: str, tasks=(), addresses=()):
        super().__init__(message)
        self.tasks, self.addresses = list(tasks), list(addresses)


def is_int(value) -> bool:
    """True for a Python int that is not a bool (a bool is an int too, and never meant as one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_count(value, minimum: int = 0) -> bool:
    """True for a Python int (not a bool) of at least `minimum`."""
    return is_int(value) and value >= minimum
