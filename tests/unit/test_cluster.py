"""Unit tests for tfdist.cluster: building, validating and emitting a ClusterSpec.

No TensorFlow (`to_tf()` / `resolver()`: tests/inprocess/test_cluster_tf.py). Environment
variables only through monkeypatch.
"""

import copy
import json
import pickle
import re

import pytest

from tfdist.cluster import JOB_NAMES, ClusterConfigError, ClusterSpec, free_ports

from helpers.cluster_spec import FULL, FULL_TASKS


def _raises(fragments):
    """pytest.raises(ClusterConfigError) matching the first fragment; checks the rest after."""
    return pytest.raises(ClusterConfigError, match=re.escape(fragments[0]))


def _check_rest(excinfo, fragments):
    message = str(excinfo.value)
    for fragment in fragments[1:]:
        assert fragment in message, f"{fragment!r} not in error message {message!r}"


# ------------------------------------------------------------------------ from_tf_config

TF_CONFIG_CASES = [
    pytest.param(
        {"cluster": {"worker": ["h1:2222", "h2:2222"]}, "task": {"type": "worker", "index": 1}},
        {"worker": ["h1:2222", "h2:2222"]},
        "worker",
        1,
        id="two-workers",
    ),
    pytest.param(
        {
            "cluster": {"ps": ["p:1"], "worker": ["w:1"], "chief": ["c:1"]},
            "task": {"type": "ps", "index": 0},
        },
        {"chief": ["c:1"], "worker": ["w:1"], "ps": ["p:1"]},
        "ps",
        0,
        id="chief-worker-ps",
    ),
    pytest.param(
        {
            "cluster": {"worker": ["h1:2222", "h2:2222"]},
            "task": {"type": "worker", "index": 0},
            "environment": "cloud",
            "rpc_layer": "grpc",
        },
        {"worker": ["h1:2222", "h2:2222"]},
        "worker",
        0,
        id="optional-keys",
    ),
    pytest.param(
        {"cluster": {"worker": ["h1:2222", "h2:2222"]}, "task": {"type": "worker"}},
        {"worker": ["h1:2222", "h2:2222"]},
        "worker",
        0,
        id="index-omitted",
    ),
    pytest.param(
        {"cluster": {"worker": ["h1:2222", "h2:2222"]}, "task": {"type": "worker", "index": "1"}},
        {"worker": ["h1:2222", "h2:2222"]},
        "worker",
        1,
        id="index-as-digit-string",
    ),
    pytest.param(
        {"cluster": {"worker": ["solo:2222"]}},
        {"worker": ["solo:2222"]},
        "worker",
        0,
        id="no-task-single-task",
    ),
    pytest.param(
        {"cluster": {"worker": {"1": "b:2", "0": "a:1"}}, "task": {"type": "worker", "index": 1}},
        {"worker": ["a:1", "b:2"]},
        "worker",
        1,
        id="job-as-index-mapping",
    ),
    pytest.param(
        {
            "cluster": {"worker": ["[::1]:2222", "[::1]:2223"]},
            "task": {"type": "worker", "index": 0},
        },
        {"worker": ["[::1]:2222", "[::1]:2223"]},
        "worker",
        0,
        id="ipv6",
    ),
    pytest.param(
        {"cluster": {"worker": [" h1:02222 ", "h2:2222"]}, "task": {"type": "worker", "index": 0}},
        {"worker": ["h1:2222", "h2:2222"]},
        "worker",
        0,
        id="address-normalised",
    ),
    pytest.param(
        {
            "cluster": {"chief": ["c:1"], "worker": ["w:1"], "evaluator": ["e:1"]},
            "task": {"type": "evaluator", "index": 0},
        },
        {"chief": ["c:1"], "worker": ["w:1"], "evaluator": ["e:1"]},
        "evaluator",
        0,
        id="evaluator",
    ),
]


@pytest.mark.parametrize("form", ["dict", "json", "bytes"])
@pytest.mark.parametrize("tf_config, cluster, task_type, task_index", TF_CONFIG_CASES)
def test_from_tf_config(form, tf_config, cluster, task_type, task_index):
    value = {
        "dict": tf_config,
        "json": json.dumps(tf_config),
        "bytes": json.dumps(tf_config).encode(),
    }[form]
    spec = ClusterSpec.from_tf_config(value)
    assert spec.cluster == cluster
    assert list(spec.cluster) == [job for job in JOB_NAMES if job in cluster]  # TF_CONFIG order
    assert (spec.task_type, spec.task_index) == (task_type, task_index)
    assert spec.task_id == task_index
    assert spec.task == f"{task_type}:{task_index}"
    assert spec.address == cluster[task_type][task_index]


def test_from_tf_config_reads_the_environment_variable(monkeypatch):
    tf_config = {
        "cluster": {"chief": ["c:1"], "worker": ["w0:1", "w1:1"]},
        "task": {"type": "worker", "index": 1},
    }
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    spec = ClusterSpec.from_tf_config()
    assert spec == ClusterSpec({"chief": ["c:1"], "worker": ["w0:1", "w1:1"]}, "worker", 1)


def test_from_tf_config_without_the_environment_variable(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ClusterConfigError, match="TF_CONFIG is not set"):
        ClusterSpec.from_tf_config()


# -------------------------------------------------------------------------------- from_hosts


@pytest.mark.parametrize(
    "workers, ps",
    [
        pytest.param(["h1:2222", "h2:2222"], ["h3:2222"], id="lists"),
        pytest.param(("h1:2222", "h2:2222"), ("h3:2222",), id="tuples"),
        pytest.param("h1:2222,h2:2222", "h3:2222", id="comma-strings"),
        pytest.param(" h1:2222 , h2:2222 ,", "h3:2222,", id="comma-strings-with-spaces"),
    ],
)
def test_from_hosts_lists_and_comma_strings(workers, ps):
    spec = ClusterSpec.from_hosts(workers=workers, ps=ps, chief="c:1", task_index=1)
    assert spec.cluster == {"chief": ["c:1"], "worker": ["h1:2222", "h2:2222"], "ps": ["h3:2222"]}
    assert (spec.task_type, spec.task_index) == ("worker", 1)


def test_from_hosts_every_job():
    spec = ClusterSpec.from_hosts(
        workers="w0:1,w1:1", ps=["p0:1"], chief="c0:1", evaluator="e0:1", task_type="chief"
    )
    assert spec.cluster == {
        "chief": ["c0:1"],
        "worker": ["w0:1", "w1:1"],
        "ps": ["p0:1"],
        "evaluator": ["e0:1"],
    }
    assert spec.task == "chief:0"


@pytest.mark.parametrize(
    "kwargs, fragments",
    [
        pytest.param({}, ["needs at least one address"], id="nothing"),
        pytest.param({"workers": ""}, ["needs at least one address"], id="empty-string"),
        pytest.param(
            {"workers": "h1:2222", "task_index": 1},
            ["Task worker:1 is not in the cluster", "0 to 0"],
            id="index-out-of-range",
        ),
        pytest.param(
            {"chief": "c:1"},
            ["Task type 'worker' is not a job", "chief (1 tasks)"],
            id="chief-only-default-task",
        ),
        pytest.param(
            {"workers": "h1:2222,h1:2222"}, ["Address 'h1:2222' is used twice"], id="duplicate"
        ),
    ],
)
def test_from_hosts_errors(kwargs, fragments):
    with _raises(fragments) as excinfo:
        ClusterSpec.from_hosts(**kwargs)
    _check_rest(excinfo, fragments)


# ------------------------------------------------------------------------------------- local


@pytest.mark.parametrize(
    "workers, ps, chief, evaluator, jobs, task",
    [
        (1, 0, False, False, {"worker": 1}, "worker:0"),
        (3, 0, False, False, {"worker": 3}, "worker:0"),
        (2, 1, False, False, {"chief": 1, "worker": 2, "ps": 1}, "chief:0"),  # a coordinator
        (2, 2, True, False, {"chief": 1, "worker": 2, "ps": 2}, "chief:0"),
        (1, 0, True, True, {"chief": 1, "worker": 1, "evaluator": 1}, "chief:0"),
    ],
)
def test_local(workers, ps, chief, evaluator, jobs, task):
    spec = ClusterSpec.local(workers=workers, ps=ps, chief=chief, evaluator=evaluator)
    assert {job: len(addresses) for job, addresses in spec.cluster.items()} == jobs
    assert spec.task == task
    addresses = [a for addrs in spec.cluster.values() for a in addrs]
    hosts = {a.rsplit(":", 1)[0] for a in addresses}
    ports = [int(a.rsplit(":", 1)[1]) for a in addresses]
    assert hosts == {"127.0.0.1"}
    assert len(set(ports)) == len(ports) == sum(jobs.values())
    assert all(1 <= p <= 65535 for p in ports)


def test_local_clusters_built_back_to_back_share_no_port():
    ports = []
    for _ in range(5):
        spec = ClusterSpec.local(workers=2, ps=1, chief=True)
        ports += [a.rsplit(":", 1)[1] for addrs in spec.cluster.values() for a in addrs]
    assert len(ports) == 20
    assert len(set(ports)) == len(ports)


def test_local_task_and_host():
    spec = ClusterSpec.local(workers=3, task_type="worker", task_index=2, host="localhost")
    assert spec.task == "worker:2"
    assert all(a.startswith("localhost:") for a in spec.cluster["worker"])


@pytest.mark.parametrize(
    "kwargs, fragments",
    [
        ({"workers": 0}, ["at least one worker", "workers=0"]),
        ({"workers": -1}, ["non-negative integer for workers", "workers=-1"]),
        ({"workers": 1.5}, ["non-negative integer for workers", "workers=1.5"]),
        ({"workers": True}, ["non-negative integer for workers", "workers=True"]),
        ({"ps": -2}, ["non-negative integer for ps", "ps=-2"]),
        ({"ps": "1"}, ["non-negative integer for ps", "ps='1'"]),
        ({"workers": 2, "task_type": "ps"}, ["Task type 'ps' is not a job"]),
    ],
)
def test_local_errors(kwargs, fragments):
    with _raises(fragments) as excinfo:
        ClusterSpec.local(**kwargs)
    _check_rest(excinfo, fragments)


def test_free_ports():
    first, second = free_ports(4), free_ports(4)
    assert len(set(first + second)) == 8
    assert free_ports(0) == []
    for bad in (-1, 1.0, True, "2"):
        with pytest.raises(ValueError, match=re.escape(f"n={bad!r}")):
            free_ports(bad)


# ---------------------------------------------------------------------------------- from_slurm


def test_from_slurm_reads_the_given_mapping():
    env = {
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "1",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NODELIST": "node[1-2]",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    }
    assert ClusterSpec.from_slurm(env) == ClusterSpec(
        {"worker": ["node1:8888", "node2:8888"]}, "worker", 1
    )
    assert ClusterSpec.from_slurm(env, port=3000) == ClusterSpec(
        {"worker": ["node1:3000", "node2:3000"]}, "worker", 1
    )


def test_from_slurm_with_parameter_servers():
    env = {
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "1",
        "SLURM_STEP_NUM_TASKS": "3",
        "SLURM_STEP_NODELIST": "a,b,c",
        "SLURM_STEP_TASKS_PER_NODE": "1(x3)",
    }
    assert ClusterSpec.from_slurm(env, num_ps=1) == ClusterSpec(
        {"chief": ["a:8888"], "ps": ["b:8888"], "worker": ["c:8888"]}, "ps", 0
    )


# ----------------------------------------------------------------------------------- outputs


@pytest.mark.parametrize("task_type, task_index", FULL_TASKS)
def test_to_tf_config_for_any_task(task_type, task_index):
    spec = ClusterSpec(FULL)  # this process is the chief
    config = spec.to_tf_config(task_type, task_index)
    assert config == {"cluster": FULL, "task": {"type": task_type, "index": task_index}}
    # The returned dict is a fresh copy: editing it does not touch the spec.
    config["cluster"]["worker"].append("x:1")
    assert spec.cluster == FULL


def test_to_tf_config_defaults():
    spec = ClusterSpec(FULL, "worker", 1)
    assert spec.to_tf_config()["task"] == {"type": "worker", "index": 1}
    assert spec.to_tf_config(task_index=0)["task"] == {"type": "worker", "index": 0}
    assert spec.to_tf_config("ps")["task"] == {"type": "ps", "index": 0}


@pytest.mark.parametrize("task_type, task_index", FULL_TASKS)
def test_to_json_round_trips_through_from_tf_config(task_type, task_index):
    spec = ClusterSpec(FULL, "worker", 1)
    text = spec.to_json(task_type, task_index)
    assert " " not in text and "\n" not in text  # one compact line, ready for an env var
    assert json.loads(text) == spec.to_tf_config(task_type, task_index)
    back = ClusterSpec.from_tf_config(text)
    assert back == spec.replace_task(task_type, task_index)
    assert back.task == f"{task_type}:{task_index}"


def test_to_json_round_trips_through_the_environment(monkeypatch):
    spec = ClusterSpec.local(workers=2, ps=1, chief=True, task_type="worker", task_index=1)
    monkeypatch.setenv("TF_CONFIG", spec.to_json())
    assert ClusterSpec.from_tf_config() == spec


@pytest.mark.parametrize(
    "args, fragments",
    [
        (("worker", 2), ["Task worker:2 is not in the cluster", "0 to 1"]),
        (("master", 0), ["Task type 'master' is not a job"]),
        (("worker", -1), ["Received: -1"]),
    ],
)
def test_to_tf_config_of_a_task_outside_the_cluster(args, fragments):
    with _raises(fragments) as excinfo:
        ClusterSpec(FULL).to_tf_config(*args)
    _check_rest(excinfo, fragments)


def test_single_process_has_no_tf_config():
    with pytest.raises(ClusterConfigError, match="single-process spec has no TF_CONFIG"):
        ClusterSpec({}).to_tf_config()


# ------------------------------------------------------------------------------------ counts


@pytest.mark.parametrize(
    "cluster, num_workers, num_ps, has_chief",
    [
        pytest.param({}, 1, 0, False, id="single-process"),
        pytest.param({"worker": ["a:1"]}, 1, 0, False, id="one-worker"),
        pytest.param({"worker": ["a:1", "b:1", "c:1"]}, 3, 0, False, id="three-workers"),
        pytest.param({"chief": ["c:1"], "worker": ["a:1", "b:1"]}, 3, 0, True, id="chief-counts"),
        pytest.param({"chief": ["c:1"]}, 1, 0, True, id="chief-only"),
        pytest.param(
            {"chief": ["x:1"], "worker": ["a:1", "b:1", "c:1"], "ps": ["p:1", "q:1"]},
            3,
            2,
            True,
            id="workers-and-ps",
        ),
        pytest.param(
            {"chief": ["c:1"], "worker": ["a:1", "b:1"], "ps": ["p:1"]},
            2,
            1,
            True,
            id="ps-chief-coordinates",
        ),
        pytest.param(
            {"worker": ["a:1"], "evaluator": ["e:1"]}, 1, 0, False, id="evaluator-not-counted"
        ),
    ],
)
def test_counts(cluster, num_workers, num_ps, has_chief):
    spec = ClusterSpec(cluster)
    assert spec.num_workers == num_workers
    assert spec.num_ps == num_ps
    assert spec.has_chief == has_chief
    assert spec.is_single_process == (not cluster)


@pytest.mark.parametrize(
    "cluster, task_type, task_index, is_chief",
    [
        ({"chief": ["c:1"], "worker": ["a:1", "b:1"]}, "chief", 0, True),
        ({"chief": ["c:1"], "worker": ["a:1", "b:1"]}, "worker", 0, False),
        ({"worker": ["a:1", "b:1"]}, "worker", 0, True),
        ({"worker": ["a:1", "b:1"]}, "worker", 1, False),
        ({"chief": ["c:1"], "worker": ["a:1"], "ps": ["p:1"]}, "ps", 0, False),
        ({"chief": ["c:1"], "worker": ["a:1"], "ps": ["p:1"]}, "worker", 0, False),
        ({"worker": ["a:1"], "evaluator": ["e:1"]}, "evaluator", 0, False),
        ({}, None, None, True),
    ],
)
def test_is_chief(cluster, task_type, task_index, is_chief):
    assert ClusterSpec(cluster, task_type, task_index).is_chief is is_chief


def test_single_process_spec():
    spec = ClusterSpec({})
    assert (spec.task_type, spec.task_index, spec.task, spec.address) == (None, None, None, None)
    assert spec.tasks == []
    assert spec.cluster == {}


def test_tasks_in_tf_config_order():
    spec = ClusterSpec(
        {"evaluator": ["e:1"], "ps": ["p:1"], "worker": ["a:1", "b:1"], "chief": ["c:1"]}
    )
    assert spec.tasks == FULL_TASKS


# ----------------------------------------------------------------------- value object


@pytest.mark.parametrize(
    "name",
    ["_jobs", "_task_type", "_task_index", "task_type", "num_workers", "cluster", "something_new"],
)
def test_immutable(name):
    spec = ClusterSpec(FULL, "worker", 1)
    with pytest.raises(AttributeError, match="immutable"):
        setattr(spec, name, "x")
    if not name.startswith("_"):
        return
    with pytest.raises(AttributeError, match="immutable"):
        delattr(spec, name)
    assert spec.to_tf_config() == {"cluster": FULL, "task": {"type": "worker", "index": 1}}


def test_cluster_is_copied_in_and_out():
    source = {"worker": ["a:1", "b:1"]}
    spec = ClusterSpec(source)
    source["worker"].append("c:1")
    spec.cluster["worker"].append("d:1")
    assert spec.cluster == {"worker": ["a:1", "b:1"]}
    assert spec.num_workers == 2


def test_equality_and_hashing():
    c = {"chief": ["c:1"]}
    a = ClusterSpec({**c, "worker": ["a:1", "b:1"], "ps": ["p:1"]}, "worker", 1)
    same = [
        ClusterSpec({"ps": ("p:1",), "worker": ("a:1", "b:1"), **c}, "worker", 1),  # order, tuples
        ClusterSpec.from_hosts(workers="a:1,b:1", ps="p:1", chief="c:1", task_index=1),
        ClusterSpec.from_tf_config(a.to_json()),
        ClusterSpec({**c, "worker": ["a:01", "b:1"], "ps": ["p:1"]}, "worker", "1"),
    ]
    different = [
        a.replace_task("worker", 0),
        a.replace_task("ps", 0),
        ClusterSpec({**c, "worker": ["b:1", "a:1"], "ps": ["p:1"]}, "worker", 1),  # order matters
        ClusterSpec({**c, "worker": ["a:1", "b:1"], "ps": ["p:2"]}, "worker", 1),
        ClusterSpec({"worker": ["a:1", "b:1"]}, "worker", 1),
    ]
    for other in same:
        assert a == other and not a != other
        assert hash(a) == hash(other)
    for other in different:
        assert a != other
    assert len({a, *same, *different}) == 1 + len(different)
    assert ClusterSpec({}) == ClusterSpec({})
    assert a != a.to_tf_config() and a != "worker:1" and a is not None


@pytest.mark.parametrize(
    "clone",
    [
        pytest.param(copy.copy, id="copy"),
        pytest.param(copy.deepcopy, id="deepcopy"),
        pytest.param(lambda s: pickle.loads(pickle.dumps(s)), id="pickle"),
    ],
)
@pytest.mark.parametrize(
    "spec",
    [
        ClusterSpec(FULL, "worker", 1),
        ClusterSpec({}),
    ],
    ids=["cluster", "single-process"],
)
def test_copy_and_pickle(clone, spec):
    other = clone(spec)
    assert other == spec and hash(other) == hash(spec)
    assert other.task == spec.task


@pytest.mark.parametrize(
    "spec, text",
    [
        (
            ClusterSpec({"worker": ["a:1", "b:1"]}, "worker", 1),
            "<ClusterSpec worker=2, task=worker:1>",
        ),
        (ClusterSpec(FULL), "<ClusterSpec chief=1, worker=2, ps=1, evaluator=1, task=chief:0>"),
        (
            ClusterSpec({"ps": ["p:1"], "worker": ["a:1"], "chief": ["c:1"]}, "ps", 0),
            "<ClusterSpec chief=1, worker=1, ps=1, task=ps:0>",
        ),
        (ClusterSpec({}), "<ClusterSpec single process>"),
    ],
)
def test_repr(spec, text):
    assert repr(spec) == text


# ------------------------------------------------------------------------------------ errors


def _tf(cluster, task=None):
    config = {"cluster": cluster}
    if task is not None:
        config["task"] = task
    return config


W2 = {"worker": ["h1:2222", "h2:2222"]}
W0 = {"type": "worker", "index": 0}

TF_CONFIG_ERRORS = [
    # The TF_CONFIG document itself.
    pytest.param("{not json", ["TF_CONFIG is not valid JSON", "'{not json'"], id="not-json"),
    pytest.param("", ["TF_CONFIG is not valid JSON", "Received: ''"], id="empty-string"),
    pytest.param("[1, 2]", ["must be a JSON object", "[1, 2]", "of type list"], id="json-list"),
    pytest.param(
        '"worker"', ["must be a JSON object", "'worker'", "of type str"], id="json-string"
    ),
    pytest.param(42, ["must be a JSON object", "42", "of type int"], id="python-int"),
    pytest.param(
        {"cluster": W2, "task": W0, "tasks": {}, "Cluster": {}},
        ["unknown key(s) ['Cluster', 'tasks']"],
        id="unknown-keys",
    ),
    pytest.param({"task": W0}, ["TF_CONFIG has no 'cluster' jobs"], id="missing-cluster"),
    pytest.param(_tf({}, W0), ["TF_CONFIG has no 'cluster' jobs"], id="empty-cluster"),
    pytest.param(
        _tf(["h1:2222"], W0),
        ["The cluster must map job names", "['h1:2222']", "of type list"],
        id="cluster-is-a-list",
    ),
    # Job names.
    pytest.param(
        _tf({"workers": ["h1:2222"]}, W0),
        ["Unknown job name(s) ['workers']", "chief, worker, ps, evaluator"],
        id="unknown-job",
    ),
    pytest.param(
        _tf({"master": ["m:1"], "worker": ["h1:2222"]}, W0),
        ["Unknown job name(s) ['master']", "'master' is the old name of 'chief'"],
        id="master-hint",
    ),
    # The task.
    pytest.param(_tf(W2), ["no 'task'", "several tasks"], id="missing-task-multi-task"),
    pytest.param(
        _tf(W2, "worker:0"),
        ["'task' must look like", "Received: 'worker:0'"],
        id="task-is-a-string",
    ),
    pytest.param(
        _tf(W2, {"index": 0}), ["'task' must look like", "{'index': 0}"], id="task-without-type"
    ),
    pytest.param(
        _tf(W2, {"type": "boss", "index": 0}),
        ["task type 'boss' is not a known job", "chief, worker, ps, evaluator"],
        id="unknown-task-type",
    ),
    pytest.param(
        _tf(W2, {"type": "ps", "index": 0}),
        ["Task type 'ps' is not a job of this cluster", "worker (2 tasks)"],
        id="task-type-not-in-cluster",
    ),
    pytest.param(
        _tf(W2, {"type": "worker", "index": 2}),
        ["Task worker:2 is not in the cluster", "has 2 task(s)", "0 to 1"],
        id="index-out-of-range",
    ),
    pytest.param(
        _tf(W2, {"type": "worker", "index": -1}),
        ["non-negative integer", "Received: -1"],
        id="negative-index",
    ),
    pytest.param(
        _tf(W2, {"type": "worker", "index": True}),
        ["non-negative integer", "Received: True (of type bool)"],
        id="bool-index",
    ),
    pytest.param(
        _tf(W2, {"type": "worker", "index": 1.5}),
        ["non-negative integer", "Received: 1.5 (of type float)"],
        id="float-index",
    ),
    pytest.param(
        _tf(W2, {"type": "worker", "index": 1.0}),
        ["non-negative integer", "Received: 1.0 (of type float)"],
        id="float-1.0",
    ),
    pytest.param(
        _tf(W2, {"type": "worker", "index": "x"}),
        ["non-negative integer", "Received: 'x' (of type str)"],
        id="str-index",
    ),
    pytest.param(
        _tf(W2, {"type": "worker", "index": "-1"}),
        ["non-negative integer", "Received: '-1' (of type str)"],
        id="negative-str",
    ),
    pytest.param(
        _tf(W2, {"type": "worker", "index": "\u00b9"}),
        ["non-negative integer", "Received: '\u00b9'"],
        id="superscript-digit-index",
    ),
    pytest.param(
        _tf(W2, {"type": "worker", "index": None}),
        ["non-negative integer", "Received: None"],
        id="none-index",
    ),
    # Jobs and addresses.
    pytest.param(_tf({"worker": []}, W0), ["job 'worker' has no addresses"], id="empty-job"),
    pytest.param(
        _tf({"worker": "h1:2222"}, W0),
        ["job 'worker'", "Received the string 'h1:2222'", "['h1:2222']"],
        id="job-as-string",
    ),
    pytest.param(
        _tf({"worker": 2222}, W0), ["job 'worker'", "Received: 2222 (of type int)"], id="job-as-int"
    ),
    pytest.param(
        _tf({"worker": {"0": "a:1", "2": "b:1"}}, W0),
        ["job 'worker': task indices [0, 2] are not 0..1"],
        id="index-mapping-gap",
    ),
    pytest.param(
        _tf({"worker": {"a": "a:1"}}, W0),
        ["job 'worker'", "Received keys ['a']"],
        id="index-mapping-bad-key",
    ),
    pytest.param(
        _tf({"worker": ["h1:2222", "h1:2222"]}, W0),
        ["Address 'h1:2222' is used twice: by worker:0 and by worker:1"],
        id="duplicate-address",
    ),
    pytest.param(
        _tf({"chief": ["h:1"], "worker": ["h:1"]}, W0),
        ["Address 'h:1' is used twice: by chief:0 and by worker:0"],
        id="duplicate-across-jobs",
    ),
    pytest.param(
        _tf({"worker": ["h:2222", "h:02222"]}, W0),
        ["Address 'h:2222' is used twice"],
        id="duplicate-after-normalising",
    ),
    pytest.param(
        _tf({"worker": ["h1:2222", "h2"]}, W0),
        ["job 'worker', task 1: 'h2' is not a 'host:port' address"],
        id="no-port",
    ),
    pytest.param(
        _tf({"worker": ["h1:"]}, W0), ["job 'worker', task 0: port '' in 'h1:'"], id="empty-port"
    ),
    pytest.param(
        _tf({"worker": ["a:b:c"]}, W0), ["'a:b:c' is not a 'host:port' address"], id="two-colons"
    ),
    pytest.param(
        _tf({"worker": [":2222"]}, W0), ["':2222' is not a 'host:port' address"], id="no-host"
    ),
    pytest.param(_tf({"worker": ["h:0"]}, W0), ["port '0' in 'h:0'", "1 to 65535"], id="port-0"),
    pytest.param(
        _tf({"worker": ["h:70000"]}, W0),
        ["port '70000' in 'h:70000'", "1 to 65535"],
        id="port-70000",
    ),
    pytest.param(_tf({"worker": ["h:abc"]}, W0), ["port 'abc' in 'h:abc'"], id="port-abc"),
    pytest.param(_tf({"worker": ["h:-1"]}, W0), ["port '-1' in 'h:-1'"], id="port-negative"),
    pytest.param(
        _tf({"worker": ["h:\u00b2\u00b2"]}, W0),
        ["port '\u00b2\u00b2'"],
        id="port-superscript-digits",
    ),
    pytest.param(
        _tf({"worker": [2222]}, W0),
        ["job 'worker', task 0: expected a 'host:port' string", "Received: 2222 (of type int)"],
        id="address-not-a-string",
    ),
    # Job structure.
    pytest.param(
        _tf({"chief": ["c1:1", "c2:1"], "worker": ["w:1"]}, W0),
        ["at most one chief", "Received 2: ['c1:1', 'c2:1']"],
        id="two-chiefs",
    ),
    pytest.param(
        _tf({"evaluator": ["e1:1", "e2:1"], "worker": ["w:1"]}, W0),
        ["at most one evaluator", "['e1:1', 'e2:1']"],
        id="two-evaluators",
    ),
    pytest.param(
        _tf({"ps": ["p:1"]}, {"type": "ps", "index": 0}),
        ["A 'ps' job (['p:1']) needs a 'worker' job"],
        id="ps-without-workers",
    ),
    pytest.param(
        _tf({"chief": ["c:1"], "ps": ["p:1"]}, {"type": "chief", "index": 0}),
        ["A 'ps' job (['p:1']) needs a 'worker' job"],
        id="ps-and-chief-no-workers",
    ),
    pytest.param(
        _tf({"worker": ["w:1", "w:2"], "ps": ["p:1"]}, W0),
        [
            "A parameter-server cluster needs a 'chief' job",
            "{'worker': ['w:1', 'w:2'], 'ps': ['p:1']}",
            'HINT: add "chief"',
        ],
        id="ps-without-a-chief",
    ),
    pytest.param(
        _tf({"evaluator": ["e:1"]}, {"type": "evaluator", "index": 0}),
        ["no 'chief' or 'worker' job", "{'evaluator': ['e:1']}"],
        id="evaluator-only",
    ),
]


@pytest.mark.parametrize("tf_config, fragments", TF_CONFIG_ERRORS)
def test_from_tf_config_errors(tf_config, fragments):
    with _raises(fragments) as excinfo:
        ClusterSpec.from_tf_config(tf_config)
    _check_rest(excinfo, fragments)


def _constructor_case(param):
    """A TF_CONFIG error case that ClusterSpec(cluster, type, index) can express as well."""
    config = param.values[0]
    if not isinstance(config, dict) or set(config) != {"cluster", "task"} or not config["cluster"]:
        return False
    task = config["task"]
    # index None means "the default index" for the constructor, so it is no error there.
    return (
        isinstance(task, dict)
        and task.get("type") in JOB_NAMES
        and task.get("index", 0) is not None
    )


@pytest.mark.parametrize(
    "tf_config, fragments", [p for p in TF_CONFIG_ERRORS if _constructor_case(p)]
)
def test_constructor_errors_match_tf_config_errors(tf_config, fragments):
    """ClusterSpec(cluster, type, index) validates exactly like TF_CONFIG does."""
    task = tf_config["task"]
    with _raises(fragments) as excinfo:
        ClusterSpec(tf_config["cluster"], task["type"], task.get("index", 0))
    _check_rest(excinfo, fragments)


@pytest.mark.parametrize(
    "args, fragments",
    [
        (({}, "worker", 0), ["Task worker:0 was given for an empty cluster"]),
        (({}, None, 1), ["Task None:1 was given for an empty cluster"]),
        ((["h:1"],), ["The cluster must map job names", "['h:1'] (of type list)"]),
        ((None,), ["The cluster must map job names", "None (of type NoneType)"]),
    ],
)
def test_constructor_errors(args, fragments):
    with _raises(fragments) as excinfo:
        ClusterSpec(*args)
    _check_rest(excinfo, fragments)


def test_cluster_config_error_is_a_value_error():
    assert issubclass(ClusterConfigError, ValueError)
    with pytest.raises(ValueError):
        ClusterSpec.from_tf_config("{")


def test_long_tf_config_is_shortened_in_the_message():
    text = "[" + ", ".join(["1"] * 500) + "]"
    with pytest.raises(ClusterConfigError, match=r"JSON object") as excinfo:
        ClusterSpec.from_tf_config(text)
    assert len(str(excinfo.value)) < 400
    assert "..." in str(excinfo.value)
