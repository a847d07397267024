"""Tier 1: communication="gloo" without torch says which extra to install, and how; its
buckets of tensors, from the last."""

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


def test_buckets_are_cut_from_the_last_tensor_and_never_cut_a_tensor():
    assert gloo.buckets([8, 8, 8, 16], 16) == [[3], [1, 2], [0]]
    assert gloo.buckets([8, 8, 8, 16], 1) == [[3], [2], [1], [0]]
    assert gloo.buckets([8, 8, 8, 16], 1 << 20) == [[0, 1, 2, 3]]
    assert gloo.buckets([40, 4, 4], 8) == [[1, 2], [0]]
    assert gloo.buckets([], 8) == []
    # every position once, in order when the buckets are read from the last
    nbytes = [3, 70, 1, 1, 64, 9, 200, 5]
    cut = gloo.buckets(nbytes, 64)
    assert [p for bucket in reversed(cut) for p in bucket] == list(range(len(nbytes)))
    assert all(sum(nbytes[p] for p in bucket) >= 64 for bucket in cut[:-1])


def test_the_docs_give_the_bucket_size_of_the_code():
    from helpers.docs import DOCS, prose

    page = prose(DOCS / "concepts" / "communication.md")
    size = f"{gloo.BUCKET_BYTES >> 20} MiB"
    assert f"buckets of about {size} (`tfdist.strategy.gloo.BUCKET_BYTES`" in page, size
