"""Tier 1: communication='gloo' without torch says which extra to install, and how."""

import sys

import pytest

from tfdist.strategy import gloo


def test_without_torch_the_error_names_the_extra_and_the_cpu_wheel(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    monkeypatch.setitem(sys.modules, "torch.distributed", None)
    with pytest.raises(ImportError) as err:
        gloo.require_torch()
    message = str(err.value)
    assert "communication='gloo'" in message
    assert "tfdist[gloo]" in message
    assert "download.pytorch.org/whl/cpu" in message
    assert "communication='ring'" in message


def test_the_group_ranks_follow_tensorflows_order_chief_first():
    from tfdist.cluster import ClusterSpec

    spec = ClusterSpec(
        {"chief": ["a:1"], "worker": ["b:2", "[::1]:3"]}, task_type="worker", task_index=1
    )
    assert [(job, index) for job, index, _ in gloo._tasks(spec)] == [
        ("chief", 0),
        ("worker", 0),
        ("worker", 1),
    ]
    assert gloo._host("[::1]:3") == "::1"
