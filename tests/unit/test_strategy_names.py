"""resolve_strategy_name, tier 1: "auto", the names and their aliases, and the names that
contradict the cluster (pure). make_strategy and virtual_cpus: tests/inprocess/test_strategy.py.
"""

import pytest

from tfdist.strategy import resolve_strategy_name

from helpers.strategy import (
    CHIEF_AND_WORKER,
    CPU1,
    CPU4,
    GPU2,
    ONE_WORKER,
    PS_JOB,
    SINGLE,
    TWO_WORKERS,
)


@pytest.mark.parametrize(
    "cluster, devices, expected",
    [
        (SINGLE, CPU1, "one_device"),
        (SINGLE, CPU4, "mirrored"),
        (SINGLE, GPU2, "mirrored"),
        (ONE_WORKER, CPU1, "one_device"),
        (ONE_WORKER, GPU2, "mirrored"),
        (TWO_WORKERS, CPU1, "multi_worker_mirrored"),
        (TWO_WORKERS, GPU2, "multi_worker_mirrored"),  # NCCL: test_gpu_sharing.py
        (CHIEF_AND_WORKER, CPU1, "multi_worker_mirrored"),
        (PS_JOB, CPU1, "parameter_server"),
        (PS_JOB, GPU2, "parameter_server"),
    ],
)
def test_auto_is_a_pure_function_of_cluster_and_devices(cluster, devices, expected):
    assert resolve_strategy_name("auto", cluster, devices) == expected


@pytest.mark.parametrize(
    "name, expected",
    [
        ("Mirrored", "mirrored"),
        ("multi-worker-mirrored", "multi_worker_mirrored"),
        ("off", "default"),
        ("OFF", "default"),
        ("one_device", "one_device"),
    ],
)
def test_names_are_case_insensitive_and_aliased(name, expected):
    assert resolve_strategy_name(name, SINGLE, CPU1) == expected


@pytest.mark.parametrize(
    "name, cluster, error, match",
    [
        (
            "mirored",
            SINGLE,
            ValueError,
            r"strategy='mirored' is not a known strategy\. "
            r"Choose one of: auto, one_device, mirrored",
        ),
        (False, SINGLE, TypeError, r"Received: name=False .*quote it: 'off'"),
        (3, SINGLE, TypeError, r"must be a string\. Received: name=3 \(of type int\)"),
        ("parameter_server", TWO_WORKERS, ValueError, r"needs a cluster with a 'ps' job"),
        (
            "mirrored",
            TWO_WORKERS,
            ValueError,
            r"strategy='mirrored' trains in one process, but the cluster has 2 workers.*"
            r"multi_worker_mirrored",
        ),
        ("one_device", CHIEF_AND_WORKER, ValueError, r"cluster has 2 workers"),
        ("multi_worker_mirrored", PS_JOB, ValueError, r"does not use the cluster's 'ps' job"),
    ],
)
def test_names_that_contradict_the_cluster_are_refused(name, cluster, error, match):
    with pytest.raises(error, match=match):
        resolve_strategy_name(name, cluster, CPU1)
