"""The unit tier: pure Python. Its tests never import TensorFlow (nor Keras), so they run
without the logical CPUs, and `pytest tests/unit` imports no TensorFlow at all."""

import pytest


@pytest.fixture(scope="session", autouse=True)
def _logical_cpus_first():
    """Overrides tests/conftest.py's: no CPU split (that would import TensorFlow) here."""
