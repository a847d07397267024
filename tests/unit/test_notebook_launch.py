"""tfdist.notebook_launch refuses what it cannot run before any task starts (its jobs run in
tests/cluster/test_notebooks.py)."""

import sys
import threading

import pytest

import tfdist


def _train():
    return 1


def test_a_value_that_is_not_a_function_is_refused():
    with pytest.raises(TypeError, match=r"runs a function\. Received: fn=3\.0"):
        tfdist.notebook_launch(3.0)


def test_an_argument_that_cannot_go_to_another_process_is_refused_by_name():
    with pytest.raises(TypeError, match=r"cannot pickle args .*HINT: make the object inside"):
        tfdist.notebook_launch(_train, args=(threading.Lock(),))
    with pytest.raises(TypeError, match=r"cannot pickle kwargs"):
        tfdist.notebook_launch(_train, kwargs={"lock": threading.Lock()})


def test_without_cloudpickle_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "cloudpickle", None)  # import cloudpickle fails
    with pytest.raises(ImportError, match=r"pip install 'tfdist\[notebook\]'"):
        tfdist.notebook_launch(_train)
