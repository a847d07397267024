"""The unit tier: pure Python. Its tests never import TensorFlow (nor Keras), so they run
without the logical CPUs, and `pytest tests/unit` imports no TensorFlow at all.

With FORBID_TENSORFLOW=1 in the environment, importing TensorFlow, Keras or tf_keras here fails
the test that does it (an AssertionError from the import) and the whole session, even where the
code swallowed the error. tests/unit/test_no_tensorflow.py runs the tier that way, in a process
of its own: `make test` runs every tier in the same pytest processes, where a guard like this
would stop the other tiers' TensorFlow.
"""

import importlib.abc
import os
import sys

import pytest

GUARD = "FORBID_TENSORFLOW"
FORBIDDEN = ("tensorflow", "keras", "tf_keras")


class _ForbidTensorFlow(importlib.abc.MetaPathFinder):
    """Refuses TensorFlow and both Kerases, and remembers each attempt and its test."""

    def __init__(self):
        self.attempts = []

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] not in FORBIDDEN:
            return None
        test = os.environ.get("PYTEST_CURRENT_TEST")  # "<node id> (call)"; unset in collection
        self.attempts.append(f"{name} by {test.rpartition(' (')[0] if test else 'collection'}")
        raise AssertionError(
            f"A unit test imported {name!r}: tests/unit never imports TensorFlow or Keras. "
            "HINT: move the test to tests/inprocess, or test what does not need TensorFlow."
        )


_GUARD = None
if os.environ.get(GUARD) == "1":
    _GUARD = _ForbidTensorFlow()
    _GUARD.attempts += [f"{name} before tests/unit" for name in FORBIDDEN if name in sys.modules]
    sys.meta_path.insert(0, _GUARD)


def pytest_sessionfinish(session):
    if _GUARD is not None and _GUARD.attempts:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if _GUARD is not None and _GUARD.attempts:
        terminalreporter.section("TensorFlow in the unit tier", red=True)
        for attempt in _GUARD.attempts:
            terminalreporter.line(f"imported {attempt}")


@pytest.fixture(scope="session", autouse=True)
def _logical_cpus_first():
    """Overrides tests/conftest.py's: no CPU split (that would import TensorFlow) here."""
