"""Shared set-up; the tfdist.testing plugin itself is loaded through its entry point.

The logical CPU count is fixed once per process (setup.cfg: tfdist_virtual_cpus = 4), before
any test initialises TensorFlow; tests that need another count run in a subprocess.
"""

import os

import pytest

pytest_plugins = ["pytester"]

# Quiet TensorFlow's C++ logs here and in every child process the tests start.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture(scope="session", autouse=True)
def _logical_cpus_first(virtual_cpus):
    """Splits the CPU before any test can initialise TensorFlow."""
    return virtual_cpus
