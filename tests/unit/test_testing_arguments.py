"""tfdist.testing.run_cluster refuses a function its child processes could not import."""

import pytest

from tfdist.testing import run_cluster


def local_function_holder():
    def inner():
        return 1

    return inner


def test_run_cluster_needs_an_importable_function():
    with pytest.raises(TypeError, match="needs a module-level function"):
        run_cluster(local_function_holder())
