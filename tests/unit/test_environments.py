"""Unit tests for tfdist.cluster.environments and tfdist.cluster.slurm: env mapping ->
ClusterSpec, SLURM parsing.

Every test passes a plain env dict (or a read-only mapping); only the os.environ fallback test
uses monkeypatch.
"""

import json
import os
import re
import types

import pytest

from tfdist.cluster import (
    DETECTION_ORDER,
    ClusterConfigError,
    ClusterSpec,
    LocalEnvironment,
    SlurmEnvironment,
    TFConfigEnvironment,
    detect_cluster,
    detect_environment,
    expand_nodelist,
    expand_tasks_per_node,
)
from tfdist.cluster.slurm import unbound_gpu_tasks


def _tf_config(cluster, task_type, task_index):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": task_index}})


def _srun(rank, ntasks, nodelist, per_node, num_nodes=None, **extra):
    """The variables `srun` sets in each task of a step (plus a few job-level ones)."""
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NAME": "train",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": "0",
        "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_STEP_TASKS_PER_NODE": per_node,
    }
    if num_nodes is not None:
        env["SLURM_STEP_NUM_NODES"] = str(num_nodes)
    env.update(extra)
    return env


TWO_WORKERS = {"worker": ["h1:2222", "h2:2222"]}
FOUR_ON_TWO = ["node1:8888", "node1:8889", "node2:8888", "node2:8889"]

DETECTION_CASES = [
    pytest.param(
        {"TF_CONFIG": _tf_config(TWO_WORKERS, "worker", 1)},
        "tf_config",
        TWO_WORKERS,
        "worker:1",
        id="tf-config",
    ),
    pytest.param(
        {
            "TF_CONFIG": _tf_config({"chief": ["c:1"], "worker": ["w:1"], "ps": ["p:1"]}, "ps", 0),
            "PATH": "/usr/bin",
        },
        "tf_config",
        {"chief": ["c:1"], "worker": ["w:1"], "ps": ["p:1"]},
        "ps:0",
        id="tf-config-ps",
    ),
    pytest.param(
        _srun(3, 4, "node[1-2]", "2(x2)", num_nodes=2),
        "slurm",
        {"worker": FOUR_ON_TWO},
        "worker:3",
        id="srun-2x2-rank3",
    ),
    pytest.param(
        _srun(0, 4, "node[1-2]", "2(x2)", num_nodes=2),
        "slurm",
        {"worker": FOUR_ON_TWO},
        "worker:0",
        id="srun-2x2-rank0",
    ),
    pytest.param(
        _srun(2, 3, "gpu[01-02]", "2,1"),
        "slurm",
        {"worker": ["gpu01:8888", "gpu01:8889", "gpu02:8888"]},
        "worker:2",
        id="srun-uneven-no-num-nodes",
    ),
    pytest.param(
        _srun(1, 3, "a,b,c", "1(x3)", num_nodes=3),
        "slurm",
        {"worker": ["a:8888", "b:8888", "c:8888"]},
        "worker:1",
        id="srun-one-per-node",
    ),
    pytest.param(
        _srun(0, 1, "solo", "1"),
        "slurm",
        {"worker": ["solo:8888"]},
        "worker:0",
        id="srun-single-task",
    ),
    pytest.param(
        _srun(0, 4, "node[1-2]", "2(x2)", TFDIST_NUM_PS="1"),
        "slurm",
        {"chief": ["node1:8888"], "ps": ["node1:8889"], "worker": ["node2:8888", "node2:8889"]},
        "chief:0",
        id="srun-num-ps-env-rank0-chief",
    ),
    pytest.param(
        _srun(1, 4, "node[1-2]", "2(x2)", TFDIST_NUM_PS="1"),
        "slurm",
        {"chief": ["node1:8888"], "ps": ["node1:8889"], "worker": ["node2:8888", "node2:8889"]},
        "ps:0",
        id="srun-num-ps-env-rank1-ps",
    ),
    pytest.param(
        _srun(3, 4, "node[1-2]", "2(x2)", TFDIST_NUM_PS="1"),
        "slurm",
        {"chief": ["node1:8888"], "ps": ["node1:8889"], "worker": ["node2:8888", "node2:8889"]},
        "worker:1",
        id="srun-num-ps-env-rank3-worker",
    ),
    pytest.param(
        _srun(2, 5, "n[1-5]", "1(x5)", TFDIST_NUM_PS="2"),
        "slurm",
        {"chief": ["n1:8888"], "ps": ["n2:8888", "n3:8888"], "worker": ["n4:8888", "n5:8888"]},
        "ps:1",
        id="srun-two-ps",
    ),
    pytest.param(
        _srun(1, 2, "node[1-2]", "1(x2)", TFDIST_SLURM_PORT="12345"),
        "slurm",
        {"worker": ["node1:12345", "node2:12345"]},
        "worker:1",
        id="srun-port-env",
    ),
    pytest.param(
        _srun(1, 4, "node[1-2]", "2(x2)", TFDIST_SLURM_PORT="65534"),
        "slurm",
        {"worker": ["node1:65534", "node1:65535", "node2:65534", "node2:65535"]},
        "worker:1",
        id="srun-port-at-the-top",
    ),
    pytest.param(
        {
            "SLURM_STEP_ID": "0",
            "SLURM_PROCID": "1",
            "SLURM_NTASKS": "2",
            "SLURM_JOB_NODELIST": "x[1-2]",
            "SLURM_TASKS_PER_NODE": "1(x2)",
        },
        "slurm",
        {"worker": ["x1:8888", "x2:8888"]},
        "worker:1",
        id="srun-job-level-fallbacks",
    ),
    pytest.param(
        {
            "SLURM_STEP_ID": "0",
            "SLURM_PROCID": "3",
            "SLURM_STEP_NUM_TASKS": "4",
            "SLURM_STEP_NODELIST": "x[1-2]",
        },
        "slurm",
        {"worker": ["x1:8888", "x1:8889", "x2:8888", "x2:8889"]},
        "worker:3",
        id="srun-even-split-without-tasks-per-node",
    ),
    pytest.param(
        dict(_srun(0, 4, "node[1-2]", "2(x2)"), TF_CONFIG=_tf_config(TWO_WORKERS, "worker", 1)),
        "tf_config",
        TWO_WORKERS,
        "worker:1",
        id="tf-config-beats-slurm",
    ),
    pytest.param(
        _srun(0, 4, "node[1-2]", "2(x2)", SLURM_JOB_NAME="bash"),
        "local",
        {},
        None,
        id="interactive-bash-is-not-slurm",
    ),
    pytest.param(
        _srun(0, 4, "node[1-2]", "2(x2)", SLURM_JOB_NAME="interactive"),
        "local",
        {},
        None,
        id="interactive-job-name",
    ),
    pytest.param(
        {
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NAME": "train",
            "SLURM_NTASKS": "4",
            "SLURM_JOB_NODELIST": "node[1-2]",
            "SLURM_NODELIST": "node[1-2]",
            "SLURM_TASKS_PER_NODE": "2(x2)",
            "SLURM_JOB_NUM_NODES": "2",
        },
        "local",
        {},
        None,
        id="salloc-without-step-is-local",
    ),
    pytest.param(
        {k: v for k, v in _srun(0, 2, "n[1-2]", "1(x2)").items() if k != "SLURM_PROCID"},
        "local",
        {},
        None,
        id="step-id-without-procid-is-local",
    ),
    pytest.param({"TF_CONFIG": "   "}, "local", {}, None, id="blank-tf-config-is-local"),
    pytest.param(
        {"TFDIST_NUM_PS": "1", "TFDIST_SLURM_PORT": "1"},
        "local",
        {},
        None,
        id="tfdist-settings-alone-are-local",
    ),
    pytest.param({}, "local", {}, None, id="empty-env"),
]


@pytest.mark.parametrize("env, source, cluster, task", DETECTION_CASES)
def test_detect_cluster(env, source, cluster, task):
    spec = detect_cluster(env)
    assert detect_environment(env).name == source
    assert spec.cluster == cluster
    assert spec.task == task
    if cluster:
        task_type, task_index = task.split(":")
        assert spec == ClusterSpec(cluster, task_type, int(task_index))
    else:
        assert spec.is_single_process
        assert spec.num_workers == 1 and spec.is_chief


@pytest.mark.parametrize("env, source, cluster, task", DETECTION_CASES)
def test_detect_cluster_never_writes_its_mapping(env, source, cluster, task):
    before_environ = dict(os.environ)
    mapping = dict(env)
    detect_cluster(mapping)
    assert mapping == env
    # A read-only view: any write attempt would raise TypeError.
    assert detect_cluster(types.MappingProxyType(dict(env))) == detect_cluster(env)
    assert dict(os.environ) == before_environ


def test_detect_cluster_reads_os_environ_by_default(monkeypatch):
    for key in list(os.environ):
        if key.startswith("SLURM_") or key.startswith("TFDIST_"):
            monkeypatch.delenv(key)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert detect_cluster().is_single_process
    assert detect_environment() is LocalEnvironment

    monkeypatch.setenv("TF_CONFIG", _tf_config(TWO_WORKERS, "worker", 1))
    assert detect_cluster() == ClusterSpec(TWO_WORKERS, "worker", 1)
    assert detect_environment() is TFConfigEnvironment

    monkeypatch.delenv("TF_CONFIG")
    for key, value in _srun(1, 2, "n[1-2]", "1(x2)").items():
        monkeypatch.setenv(key, value)
    assert detect_cluster() == ClusterSpec({"worker": ["n1:8888", "n2:8888"]}, "worker", 1)
    assert detect_environment() is SlurmEnvironment


def test_detection_order():
    assert DETECTION_ORDER == (TFConfigEnvironment, SlurmEnvironment, LocalEnvironment)


def test_invalid_tf_config_is_an_error_not_a_fallback():
    env = dict(_srun(0, 2, "n[1-2]", "1(x2)"), TF_CONFIG="{oops")
    with pytest.raises(ClusterConfigError, match=re.escape("'{oops'")):
        detect_cluster(env)


# ------------------------------------------------------------------- SLURM settings

BASE = _srun(2, 4, "node[1-2]", "2(x2)", num_nodes=2)
PS_CLUSTER = {"chief": ["node1:8888"], "ps": ["node1:8889"], "worker": ["node2:8888", "node2:8889"]}


@pytest.mark.parametrize(
    "env_extra, kwargs, cluster, task",
    [
        pytest.param({}, {"num_ps": 1}, PS_CLUSTER, "worker:0", id="num-ps-argument"),
        pytest.param(
            {"TFDIST_NUM_PS": "2"}, {"num_ps": 1}, PS_CLUSTER, "worker:0", id="argument-beats-env"
        ),
        pytest.param(
            {"TFDIST_NUM_PS": "1"},
            {"num_ps": 0},
            {"worker": FOUR_ON_TWO},
            "worker:2",
            id="explicit-zero-beats-env",
        ),
        pytest.param({"TFDIST_NUM_PS": "1"}, {}, PS_CLUSTER, "worker:0", id="env-num-ps"),
        pytest.param(
            {"TFDIST_SLURM_PORT": "9000"},
            {"port": 7000},
            {"worker": ["node1:7000", "node1:7001", "node2:7000", "node2:7001"]},
            "worker:2",
            id="port-argument-beats-env",
        ),
        pytest.param({"TFDIST_NUM_PS": " 1 "}, {}, PS_CLUSTER, "worker:0", id="env-whitespace"),
    ],
)
def test_slurm_settings(env_extra, kwargs, cluster, task):
    env = dict(BASE, **env_extra)
    spec = SlurmEnvironment.cluster_spec(env, **kwargs)
    assert spec.cluster == cluster
    assert spec.task == task
    assert ClusterSpec.from_slurm(env, **kwargs) == spec


# ---------------------------------------------------------------- SLURM contradictions


def _without(env, *keys):
    return {k: v for k, v in env.items() if k not in keys}


@pytest.mark.parametrize(
    "env, kwargs, fragments",
    [
        pytest.param(
            dict(BASE, SLURM_PROCID="4"),
            {},
            ["SLURM_PROCID=4 is not below SLURM_STEP_NUM_TASKS=4"],
            id="rank-too-high",
        ),
        pytest.param(
            dict(BASE, SLURM_STEP_NODELIST="node1"),
            {},
            ["SLURM_STEP_NODELIST='node1' names 1 node(s)", "SLURM_STEP_NUM_NODES=2"],
            id="nodelist-shorter-than-num-nodes",
        ),
        pytest.param(
            dict(BASE, SLURM_STEP_TASKS_PER_NODE="2,1"),
            {},
            ["SLURM_STEP_TASKS_PER_NODE='2,1' adds up to 3 tasks", "SLURM_STEP_NUM_TASKS=4"],
            id="tasks-per-node-sum",
        ),
        pytest.param(
            dict(BASE, SLURM_STEP_TASKS_PER_NODE="4"),
            {},
            ["SLURM_STEP_TASKS_PER_NODE='4' describes 1 node(s)", "names 2"],
            id="tasks-per-node-length",
        ),
        pytest.param(
            _without(dict(BASE, SLURM_STEP_NUM_TASKS="3"), "SLURM_STEP_TASKS_PER_NODE"),
            {},
            ["3 tasks do not split evenly over 2 nodes"],
            id="uneven-without-per-node",
        ),
        pytest.param(
            BASE,
            {"num_ps": 3},
            ["num_ps=3 needs at least 5 SLURM tasks", "the step has 4"],
            id="num-ps-too-large",
        ),
        pytest.param(
            dict(BASE, TFDIST_NUM_PS="3"),
            {},
            ["num_ps=3 needs at least 5 SLURM tasks"],
            id="num-ps-env-too-large",
        ),
        pytest.param(
            dict(BASE, TFDIST_NUM_PS="3"), {}, ["lower num_ps / TFDIST_NUM_PS"], id="num-ps-hint"
        ),
        pytest.param(
            dict(BASE, TFDIST_NUM_PS="x"),
            {},
            ["TFDIST_NUM_PS must be a non-negative integer", "Received: TFDIST_NUM_PS='x'"],
            id="num-ps-env-not-int",
        ),
        pytest.param(
            dict(BASE, TFDIST_NUM_PS="-1"),
            {},
            ["TFDIST_NUM_PS must be a non-negative integer", "Received: TFDIST_NUM_PS='-1'"],
            id="num-ps-env-negative",
        ),
        pytest.param(
            BASE,
            {"num_ps": -1},
            ["num_ps=-1 must be a non-negative integer"],
            id="num-ps-arg-negative",
        ),
        pytest.param(
            BASE,
            {"num_ps": True},
            ["num_ps=True must be a non-negative integer"],
            id="num-ps-arg-bool",
        ),
        pytest.param(
            BASE,
            {"num_ps": 1.5},
            ["num_ps=1.5 must be a non-negative integer"],
            id="num-ps-arg-float",
        ),
        pytest.param(
            BASE, {"port": -5}, ["port=-5 must be a non-negative integer"], id="port-arg-negative"
        ),
        pytest.param(BASE, {"port": 0}, ["SLURM base port 0"], id="port-0"),
        pytest.param(
            dict(BASE, TFDIST_SLURM_PORT="65535"),
            {},
            ["SLURM base port 65535 leaves no room for 2 task(s) per node"],
            id="port-overflow",
        ),
        pytest.param(
            dict(BASE, TFDIST_SLURM_PORT="abc"),
            {},
            [
                "TFDIST_SLURM_PORT must be a non-negative integer",
                "Received: TFDIST_SLURM_PORT='abc'",
            ],
            id="port-env-bad",
        ),
        pytest.param(
            dict(BASE, SLURM_PROCID="abc"),
            {},
            ["SLURM_PROCID='abc' is not an integer"],
            id="rank-not-int",
        ),
        pytest.param(
            dict(BASE, SLURM_PROCID="-1"),
            {},
            ["SLURM_PROCID='-1' must not be negative"],
            id="rank-negative",
        ),
        pytest.param(
            dict(BASE, SLURM_STEP_NUM_NODES="two"),
            {},
            ["SLURM_STEP_NUM_NODES='two' is not an integer"],
            id="num-nodes-not-int",
        ),
        pytest.param(
            _without(BASE, "SLURM_PROCID"), {}, ["SLURM_PROCID is not set"], id="rank-missing"
        ),
        pytest.param(
            _without(BASE, "SLURM_STEP_NUM_TASKS"),
            {},
            ["SLURM_STEP_NUM_TASKS is not set"],
            id="ntasks-missing",
        ),
        pytest.param(
            _without(BASE, "SLURM_STEP_NODELIST"),
            {},
            ["SLURM_STEP_NODELIST is not set"],
            id="nodelist-missing",
        ),
        pytest.param(
            dict(BASE, SLURM_STEP_NODELIST="node[2-1]"),
            {},
            ["Decreasing range '2-1'", "'node[2-1]'"],
            id="bad-nodelist",
        ),
        pytest.param(
            dict(BASE, SLURM_STEP_TASKS_PER_NODE="two"),
            {},
            ["tasks-per-node value 'two'"],
            id="bad-tasks-per-node",
        ),
    ],
)
def test_slurm_contradictions(env, kwargs, fragments):
    with pytest.raises(ClusterConfigError, match=re.escape(fragments[0])) as excinfo:
        SlurmEnvironment.cluster_spec(env, **kwargs)
    for fragment in fragments[1:]:
        assert fragment in str(excinfo.value)
    if not kwargs and SlurmEnvironment.detect(env):
        # Inside an srun step, detection reports the error rather than falling back to local.
        with pytest.raises(ClusterConfigError, match=re.escape(fragments[0])):
            detect_cluster(env)


# ------------------------------------------------------------------------ hostlists


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("node1", ["node1"]),
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("gpu-a[01-03,07],cpu[1-2]", ["gpu-a01", "gpu-a02", "gpu-a03", "gpu-a07", "cpu1", "cpu2"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("a,b", ["a", "b"]),
        ("x[001-003]", ["x001", "x002", "x003"]),
        ("n[08-11]", ["n08", "n09", "n10", "n11"]),
        ("n[9-11]", ["n9", "n10", "n11"]),
        ("n[5]", ["n5"]),
        ("n[1,3-4,7]", ["n1", "n3", "n4", "n7"]),
        ("rack[1-2]-gpu", ["rack1-gpu", "rack2-gpu"]),
        ("node-1.cluster.org,node-2.cluster.org", ["node-1.cluster.org", "node-2.cluster.org"]),
        (" a , b[1-2] ", ["a", "b1", "b2"]),
    ],
)
def test_expand_nodelist(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize(
    "nodelist, fragments",
    [
        ("n[1-", ["Unbalanced '['", "'n[1-'"]),
        ("n]1[", ["Unbalanced ']'", "'n]1['"]),
        ("n[1-2]]", ["Unbalanced ']'"]),
        ("n[[1-2]]", ["Nested '['"]),
        ("n[3-1]", ["Decreasing range '3-1'", "'n[3-1]'"]),
        ("n[a-b]", ["'a-b' in SLURM node list 'n[a-b]' is not a number"]),
        ("n[1-2-3]", ["'1-2-3'", "is not a number"]),
        ("n[]", ["'' in SLURM node list 'n[]'"]),
        ("", ["Empty SLURM node list", "''"]),
        ("   ", ["Empty SLURM node list"]),
        ("a,,b", ["Empty host name", "'a,,b'"]),
        ("a,", ["Empty host name"]),
        (None, ["Empty SLURM node list", "None"]),
    ],
)
def test_expand_nodelist_errors(nodelist, fragments):
    with pytest.raises(ClusterConfigError, match=re.escape(fragments[0])) as excinfo:
        expand_nodelist(nodelist)
    for fragment in fragments[1:]:
        assert fragment in str(excinfo.value)


@pytest.mark.parametrize(
    "text, counts",
    [
        ("2(x3),1", [2, 2, 2, 1]),
        ("4", [4]),
        ("1(x2)", [1, 1]),
        ("3,2(x2),1", [3, 2, 2, 1]),
        (" 2 , 1 ", [2, 1]),
    ],
)
def test_expand_tasks_per_node(text, counts):
    assert expand_tasks_per_node(text) == counts


@pytest.mark.parametrize("text", ["x", "", "2(3)", "2x3", "2(x)", "2,,1", "-1"])
def test_expand_tasks_per_node_errors(text):
    with pytest.raises(ClusterConfigError, match=re.escape(f"value {text!r} is not like")):
        expand_tasks_per_node(text)


@pytest.mark.parametrize(
    "env, kwargs, source",
    [
        pytest.param(BASE, {"num_ps": -1}, "num_ps=-1", id="num_ps-argument"),
        pytest.param(BASE, {"port": -5}, "port=-5", id="port-argument"),
        pytest.param(BASE, {"port": "80a"}, "port='80a'", id="port-argument-str"),
        pytest.param(dict(BASE, TFDIST_NUM_PS="-1"), {}, "TFDIST_NUM_PS", id="num-ps-env"),
        pytest.param(dict(BASE, TFDIST_SLURM_PORT="x"), {}, "TFDIST_SLURM_PORT", id="port-env"),
    ],
)
def test_slurm_setting_errors_name_the_source(env, kwargs, source):
    """The message starts with the setting as the user spelled it: argument or variable."""
    with pytest.raises(ClusterConfigError, match="^" + re.escape(source + " must be")):
        SlurmEnvironment.cluster_spec(env, **kwargs)


def _srun_task(local, per_node="2", node="0", **more):
    return {"SLURM_STEP_ID": "0", "SLURM_LOCALID": str(local), "SLURM_NODEID": node,
            "SLURM_STEP_TASKS_PER_NODE": per_node, **more}  # fmt: skip


def test_tasks_of_a_step_that_see_the_same_gpus_know_their_local_rank():
    assert unbound_gpu_tasks(_srun_task(1)) == (1, 2)
    assert unbound_gpu_tasks(_srun_task(1, per_node="4(x2),2", node="2")) == (1, 2)
    assert unbound_gpu_tasks(_srun_task(0, SLURM_GPU_BIND="none")) == (0, 2)


@pytest.mark.parametrize(
    "env",
    [
        _srun_task(1, SLURM_GPUS_PER_TASK="1"),  # srun --gpus-per-task: SLURM bound them
        _srun_task(1, SLURM_GPU_BIND="map_gpu:0,1"),
        _srun_task(0, per_node="1"),  # alone on its node: it uses every GPU
        {"SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "2"},  # not in a step
        _srun_task(0, per_node="two"),  # SlurmEnvironment says what is wrong
        _srun_task(2),  # local rank past the tasks of its node
    ],
)
def test_gpus_are_left_as_they_are_where_slurm_bound_them_or_nothing_is_shared(env):
    assert unbound_gpu_tasks(env) is None
