"""Every bad input is refused at once, with the value quoted and a HINT naming the fix.

One row per malformed input: TF_CONFIG, SLURM variables, host lists, CLI flags, and the
arguments of make_strategy, fit, evaluate, distribute_dataset, set_precision, launch and
scale_learning_rate. Each row asserts the error type, that the message quotes the value and
says what to do, and is bounded (a timeout per row: nothing may wait for a peer).
"""

import contextlib
import io
import json

import numpy as np
import pytest

import tfdist
import tfdist.cli
from tfdist.cluster import ClusterSpec

W2 = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}
SINGLE = ClusterSpec({})
PS_CHIEF = ClusterSpec(
    {"chief": ["127.0.0.1:3"], "worker": ["127.0.0.1:4"], "ps": ["127.0.0.1:5"]}, "chief", 0
)


def tf_config(cluster, task=None):
    return ClusterSpec.from_tf_config(
        json.dumps({"cluster": cluster, "task": task or {"type": "worker", "index": 0}})
    )


SLURM = {
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "0",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_NODELIST": "n[1-2]",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
}


def slurm(**changes):
    env = {**SLURM, **changes}
    return ClusterSpec.from_slurm({k: v for k, v in env.items() if v is not None})


class Refused(Exception):
    """The `tfdist` command exited with code 2; the message is what it printed."""


def cli(*argv):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = tfdist.cli.main(list(argv))
        except SystemExit as exit_:
            code = exit_.code
    if code == 2:
        raise Refused(err.getvalue())
    return code


def _model():
    keras = tfdist.flavour.keras()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


X, Y = np.zeros((16, 4), "float32"), np.zeros((16, 1), "float32")


def fit(**kwargs):
    kwargs.setdefault("strategy", tfdist.make_strategy("one_device", cluster=SINGLE))
    data = kwargs.pop("data", (X, Y))
    build = kwargs.pop("build", _model)
    kwargs.setdefault("global_batch_size", 8)
    return tfdist.fit(build, data, verbose=0, **kwargs)


def dataset(n=16):
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices((X[:n], Y[:n]))


def backup_of_another_model(tmp):
    """A backup written by a model of another shape, then fit with this one."""
    import os

    keras = tfdist.flavour.keras()
    other = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    other.compile(optimizer="sgd", loss="mse")
    other.fit(np.zeros((8, 3)), np.zeros((8, 2)), verbose=0)
    os.makedirs(tmp, exist_ok=True)
    keep = tfdist.BackupAndRestore(tmp, delete_checkpoint=False)
    other.fit(np.zeros((8, 3)), np.zeros((8, 2)), verbose=0, callbacks=[keep])
    return fit(callbacks=[tfdist.BackupAndRestore(tmp)])


def foreign_state_file(tmp):
    import os

    os.makedirs(tmp, exist_ok=True)
    with open(os.path.join(tmp, "tfdist-backup.json"), "w") as f:
        f.write("{not json")
    return fit(callbacks=[tfdist.BackupAndRestore(tmp)])


def _tmp(name):
    import tempfile

    return tempfile.mkdtemp(prefix=f"tfdist-bad-{name}-")


# (id, call, error type, texts the message must contain: the value, and the advice)
ROWS = [
    # ------------------------------------------------------------------------- devices
    (
        "virtual-cpus-a-million",  # it once grew past 3.6 GB without returning
        lambda: tfdist.virtual_cpus(10**6),
        "ValueError",
        ["n=1000000", "at most 1024", "HINT"],
    ),
    (
        "virtual-cpus-a-float",
        lambda: tfdist.virtual_cpus(2.0),
        "ValueError",
        ["n=2.0", "positive integer"],
    ),
    # ------------------------------------------------------------ arguments of the wrong kind
    (
        "fit-strategy-a-name",
        lambda: fit(strategy="mirrored"),
        "TypeError",
        ["strategy='mirrored'", "tfdist.make_strategy('mirrored')", "HINT"],
    ),
    (
        "fit-callbacks-not-a-list",
        lambda: fit(callbacks=tfdist.BackupAndRestore(_tmp("cb"))),
        "TypeError",
        ["callbacks=<", "callbacks=[callback]", "HINT"],
    ),
    (
        "fit-callbacks-not-callbacks",
        lambda: fit(callbacks=[5]),
        "TypeError",
        ["callbacks[0]", "Received: 5", "HINT"],
    ),
    (
        "launch-args-not-a-list",
        lambda: tfdist.launch(__file__, args=5),
        "TypeError",
        ["args=5", "HINT"],
    ),
    (
        "launch-args-a-string",
        lambda: tfdist.launch(__file__, args="--epochs 3"),
        "TypeError",
        ["args='--epochs 3'", "HINT"],
    ),
    (
        "detect-cluster-env-not-a-mapping",
        lambda: tfdist.detect_cluster(["TF_CONFIG"]),
        "TypeError",
        ["env=['TF_CONFIG']", "HINT"],
    ),
    (
        "start-local-servers-not-a-cluster",
        lambda: tfdist.start_local_servers({"worker": ["127.0.0.1:1"]}),
        "TypeError",
        ["{'worker': ['127.0.0.1:1']}", "ClusterSpec.local", "HINT"],
    ),
    (
        "exit-barrier-timeout-a-word",
        lambda: tfdist.exit_barrier(timeout="a"),
        "ValueError",
        ["timeout='a'", "HINT"],
    ),
    (
        "exit-barrier-timeout-0",
        lambda: tfdist.exit_barrier(timeout=0),
        "ValueError",
        ["timeout=0", "HINT"],
    ),
    # ------------------------------------------------------------------------- TF_CONFIG
    (
        "tf_config-not-json",
        lambda: ClusterSpec.from_tf_config("{not json"),
        "ClusterConfigError",
        ["'{not json'", "HINT"],
    ),
    (
        "tf_config-a-list",
        lambda: ClusterSpec.from_tf_config("[1, 2]"),
        "ClusterConfigError",
        ["[1, 2]", "HINT"],
    ),
    (
        "tf_config-job-a-string",
        lambda: tf_config({"worker": "a:1"}),
        "ClusterConfigError",
        ["'a:1'", "HINT"],
    ),
    (
        "tf_config-master",
        lambda: tf_config({"master": ["a:1"], "worker": ["b:1"]}),
        "ClusterConfigError",
        ["'master'", "HINT"],
    ),
    (
        "tf_config-no-port",
        lambda: tf_config({"worker": ["node1"]}),
        "ClusterConfigError",
        ["'node1'", "HINT"],
    ),
    (
        "tf_config-port-too-big",
        lambda: tf_config({"worker": ["a:70000"]}),
        "ClusterConfigError",
        ["70000", "HINT"],
    ),
    (
        "tf_config-port-not-a-number",
        lambda: tf_config({"worker": ["a:http"]}),
        "ClusterConfigError",
        ["'a:http'", "HINT"],
    ),
    (
        "tf_config-address-twice",
        lambda: tf_config({"worker": ["a:1", "a:1"]}),
        "ClusterConfigError",
        ["'a:1'", "HINT"],
    ),
    (
        "tf_config-two-chiefs",
        lambda: tf_config({"chief": ["c:1", "c:2"], "worker": ["w:1"]}),
        "ClusterConfigError",
        ["'c:2'", "HINT"],
    ),
    (
        "tf_config-index-out-of-range",
        lambda: tf_config(W2, {"type": "worker", "index": 2}),
        "ClusterConfigError",
        ["worker:2", "HINT"],
    ),
    (
        "tf_config-negative-index",
        lambda: tf_config(W2, {"type": "worker", "index": -1}),
        "ClusterConfigError",
        ["-1", "HINT"],
    ),
    (
        "tf_config-index-not-a-number",
        lambda: tf_config(W2, {"type": "worker", "index": "x"}),
        "ClusterConfigError",
        ["'x'", "HINT"],
    ),
    (
        "tf_config-task-type-not-in-cluster",
        lambda: tf_config(W2, {"type": "ps", "index": 0}),
        "ClusterConfigError",
        ["'ps'", "HINT"],
    ),
    (
        "tf_config-unknown-task-type",
        lambda: tf_config(W2, {"type": "boss", "index": 0}),
        "ClusterConfigError",
        ["'boss'", "HINT"],
    ),
    (
        "tf_config-ps-without-chief",
        lambda: tf_config({"worker": ["w:1"], "ps": ["p:1"]}),
        "ClusterConfigError",
        ["'ps': ['p:1']", "HINT"],
    ),
    (
        "tf_config-ps-without-workers",
        lambda: tf_config({"chief": ["c:1"], "ps": ["p:1"]}, {"type": "chief", "index": 0}),
        "ClusterConfigError",
        ["['p:1']", "HINT"],
    ),
    (
        "tf_config-no-task-in-a-cluster",
        lambda: ClusterSpec.from_tf_config(json.dumps({"cluster": W2})),
        "ClusterConfigError",
        ["task", "HINT"],
    ),
    # ------------------------------------------------------------------------------ SLURM
    (
        "slurm-procid-not-a-number",
        lambda: slurm(SLURM_PROCID="x"),
        "ClusterConfigError",
        ["'x'", "HINT"],
    ),
    (
        "slurm-procid-too-big",
        lambda: slurm(SLURM_PROCID="4"),
        "ClusterConfigError",
        ["SLURM_PROCID=4", "HINT"],
    ),
    (
        "slurm-decreasing-range",
        lambda: slurm(SLURM_STEP_NODELIST="n[3-1]"),
        "ClusterConfigError",
        ["'3-1'", "HINT"],
    ),
    (
        "slurm-unbalanced-bracket",
        lambda: slurm(SLURM_STEP_NODELIST="n[1-2"),
        "ClusterConfigError",
        ["'n[1-2'", "HINT"],
    ),
    (
        "slurm-tasks-per-node",
        lambda: slurm(SLURM_STEP_TASKS_PER_NODE="2(x)"),
        "ClusterConfigError",
        ["'2(x)'", "HINT"],
    ),
    (
        "slurm-tasks-do-not-add-up",
        lambda: slurm(SLURM_STEP_TASKS_PER_NODE="3(x2)"),
        "ClusterConfigError",
        ["'3(x2)'", "HINT"],
    ),
    (
        "slurm-nodes-disagree",
        lambda: slurm(SLURM_STEP_NUM_NODES="3"),
        "ClusterConfigError",
        ["SLURM_STEP_NUM_NODES=3", "HINT"],
    ),
    (
        "slurm-port-too-big",
        lambda: slurm(TFDIST_SLURM_PORT="70000"),
        "ClusterConfigError",
        ["70000", "HINT"],
    ),
    (
        "slurm-num-ps-negative",
        lambda: slurm(TFDIST_NUM_PS="-1"),
        "ClusterConfigError",
        ["'-1'", "HINT"],
    ),
    (
        "slurm-too-few-tasks-for-ps",
        lambda: slurm(TFDIST_NUM_PS="3"),
        "ClusterConfigError",
        ["num_ps=3", "HINT"],
    ),
    (
        "slurm-no-nodelist",
        lambda: slurm(SLURM_STEP_NODELIST=None),
        "ClusterConfigError",
        ["SLURM_STEP_NODELIST", "HINT"],
    ),
    # ------------------------------------------------------------------------ host lists
    (
        "local-no-workers",
        lambda: ClusterSpec.local(workers=0),
        "ClusterConfigError",
        ["workers=0", "HINT"],
    ),
    (
        "local-workers-a-bool",
        lambda: ClusterSpec.local(workers=True),
        "ClusterConfigError",
        ["workers=True", "HINT"],
    ),
    (
        "from_hosts-address-twice",
        lambda: ClusterSpec.from_hosts(workers="a:1,a:1"),
        "ClusterConfigError",
        ["'a:1'", "HINT"],
    ),
    (
        "from_hosts-ps-without-chief",
        lambda: ClusterSpec.from_hosts(workers="a:1", ps="p:1"),
        "ClusterConfigError",
        ["'p:1'", "HINT"],
    ),
    # ------------------------------------------------------------------------ the command
    (
        "cli-launch-workers-0",
        lambda: cli("launch", "--workers", "0", "x.py"),
        "Refused",
        ["0", "HINT"],
    ),
    (
        "cli-launch-ps-negative",
        lambda: cli("launch", "--ps", "-1", "x.py"),
        "Refused",
        ["-1", "HINT"],
    ),
    (
        "cli-launch-max-restarts-negative",
        lambda: cli("launch", "--max-restarts", "-1", "x.py"),
        "Refused",
        ["-1", "HINT"],
    ),
    (
        "cli-launch-unknown-strategy",
        lambda: cli("launch", "--strategy", "bogus", "x.py"),
        "Refused",
        ["'bogus'", "choose from"],
    ),
    (
        "cli-launch-no-script",
        lambda: cli("launch", "--workers", "2"),
        "Refused",
        ["launch", "required"],
    ),
    (
        "cli-tf-config-no-port",
        lambda: cli("tf-config", "--worker", "h1"),
        "Refused",
        ["'h1'", "HINT"],
    ),
    (
        "cli-tf-config-unknown-task",
        lambda: cli("tf-config", "--worker", "h:1", "--task", "boss:0"),
        "Refused",
        ["'boss'", "HINT"],
    ),
    (
        "cli-tf-config-ps-without-chief",
        lambda: cli("tf-config", "--worker", "h:1", "--ps", "p:1"),
        "Refused",
        ["'p:1'", "HINT"],
    ),
    ("cli-unknown-command", lambda: cli("train"), "Refused", ["'train'", "choose from"]),
    # ---------------------------------------------------------------------- make_strategy
    (
        "make_strategy-unknown-name",
        lambda: tfdist.make_strategy("mirroredd", cluster=SINGLE),
        "ValueError",
        ["'mirroredd'", "Choose one of"],
    ),
    (
        "make_strategy-name-false",
        lambda: tfdist.make_strategy(False, cluster=SINGLE),
        "TypeError",
        ["False", "HINT"],
    ),
    (
        "make_strategy-nccl-on-cpus",
        lambda: tfdist.make_strategy("mirrored", cluster=SINGLE, communication="nccl"),
        "ValueError",
        ["'nccl'", "HINT"],
    ),
    (
        "make_strategy-unknown-communication",
        lambda: tfdist.make_strategy("mirrored", cluster=SINGLE, communication="bogus"),
        "ValueError",
        ["'bogus'", "Choose one of"],
    ),
    (
        "make_strategy-unknown-gradient-compression",
        lambda: tfdist.make_strategy("mirrored", cluster=SINGLE, gradient_compression="int8"),
        "ValueError",
        ["'int8'", "'bf16'", "HINT"],
    ),
    (
        "make_strategy-gradient-compression-on-one-device",
        lambda: tfdist.make_strategy("one_device", cluster=SINGLE, gradient_compression="bf16"),
        "ValueError",
        ["'bf16'", "'one_device'", "HINT"],
    ),
    (
        "make_strategy-gradient-compression-on-parameter-server",
        lambda: tfdist.make_strategy(cluster=PS_CHIEF, gradient_compression="fp16"),
        "ValueError",
        ["'fp16'", "'parameter_server'", "no all-reduce", "HINT"],
    ),
    (
        "make_strategy-ring-on-mirrored",
        lambda: tfdist.make_strategy("mirrored", cluster=SINGLE, communication="ring"),
        "ValueError",
        ["'ring'", "Choose one of"],
    ),
    (
        "make_strategy-devices-a-string",
        lambda: tfdist.make_strategy("mirrored", cluster=SINGLE, devices="/cpu:0"),
        "TypeError",
        ["'/cpu:0'", "like ['/gpu:0'"],
    ),
    (
        "make_strategy-no-devices",
        lambda: tfdist.make_strategy("mirrored", cluster=SINGLE, devices=[]),
        "ValueError",
        ["devices=[]", "HINT"],
    ),
    (
        "make_strategy-gpu-that-does-not-exist",
        lambda: tfdist.make_strategy("mirrored", cluster=SINGLE, devices=["/gpu:7"]),
        "ValueError",
        ["'/gpu:7'", "HINT"],
    ),
    (
        "make_strategy-cpu-that-does-not-exist",
        lambda: tfdist.make_strategy("one_device", cluster=SINGLE, devices=["/cpu:9"]),
        "ValueError",
        ["'/cpu:9'", "HINT"],
    ),
    (
        "make_strategy-device-twice",
        lambda: tfdist.make_strategy("mirrored", cluster=SINGLE, devices=["/cpu:0", "/cpu:0"]),
        "ValueError",
        ["'/cpu:0'", "HINT"],
    ),
    (
        "make_strategy-not-a-device",
        lambda: tfdist.make_strategy("mirrored", cluster=SINGLE, devices=["cpu0"]),
        "ValueError",
        ["'cpu0'", "like '/gpu:0'"],
    ),
    (
        "make_strategy-option-of-another-strategy",
        lambda: tfdist.make_strategy("mirrored", cluster=SINGLE, variable_partitioner="fixed"),
        "TypeError",
        ["'variable_partitioner'", "Options accepted"],
    ),
    (
        "make_strategy-cluster-not-a-spec",
        lambda: tfdist.make_strategy(cluster={"worker": ["a:1"]}),
        "TypeError",
        ["{'worker': ['a:1']}", "HINT"],
    ),
    (
        "make_strategy-parameter-server-without-ps",
        lambda: tfdist.make_strategy("parameter_server", cluster=SINGLE),
        "ValueError",
        ["'parameter_server'", "HINT"],
    ),
    (
        "make_strategy-unknown-partitioner",
        lambda: tfdist.make_strategy(
            "parameter_server", cluster=PS_CHIEF, variable_partitioner="even"
        ),
        "ValueError",
        ["'even'", "Choose one of"],
    ),
    (
        "make_strategy-one-device-many-devices",
        lambda: tfdist.make_strategy("one_device", cluster=SINGLE, devices=["/cpu:0", "/cpu:1"]),
        "ValueError",
        ["'/cpu:1'", "HINT"],
    ),
    # --------------------------------------------------------------------- fit / evaluate
    ("fit-a-model-not-a-factory", lambda: fit(build=_model()), "TypeError", ["Sequential", "HINT"]),
    ("fit-factory-returns-no-model", lambda: fit(build=lambda: 3), "TypeError", ["3", "HINT"]),
    ("fit-epochs-0", lambda: fit(epochs=0), "ValueError", ["epochs=0", "HINT"]),
    ("fit-epochs-negative", lambda: fit(epochs=-1), "ValueError", ["epochs=-1", "HINT"]),
    (
        "fit-steps-per-epoch-negative",
        lambda: fit(steps_per_epoch=-3),
        "ValueError",
        ["steps_per_epoch=-3", "HINT"],
    ),
    (
        "fit-steps-per-epoch-0",
        lambda: fit(steps_per_epoch=0),
        "ValueError",
        ["steps_per_epoch=0", "HINT"],
    ),
    (
        "fit-steps-per-epoch-a-float",
        lambda: fit(steps_per_epoch=2.5),
        "ValueError",
        ["steps_per_epoch=2.5", "HINT"],
    ),
    (
        "fit-validation-steps-negative",
        lambda: fit(validation_data=(X, Y), validation_steps=-1),
        "ValueError",
        ["validation_steps=-1", "HINT"],
    ),
    (
        "fit-global-batch-0",
        lambda: fit(global_batch_size=0),
        "ValueError",
        ["global_batch_size=0", "HINT"],
    ),
    (
        "fit-global-batch-not-divisible",
        lambda: fit(strategy=tfdist.make_strategy("mirrored", cluster=SINGLE), global_batch_size=6),
        "ValueError",
        ["6", "HINT"],
    ),
    ("fit-empty-arrays", lambda: fit(data=(X[:0], Y[:0])), "ValueError", ["0 examples", "HINT"]),
    ("fit-empty-dataset", lambda: fit(data=dataset(0)), "ValueError", ["cardinality 0", "HINT"]),
    (
        "fit-dataset-filtered-to-nothing",
        lambda: fit(data=dataset().filter(lambda x, y: False)),
        "ValueError",
        ["empty", "HINT"],
    ),
    (
        "fit-arrays-of-different-lengths",
        lambda: fit(data=(X, Y[:3])),
        "ValueError",
        ["different numbers of examples", "HINT"],
    ),
    ("fit-data-a-string", lambda: fit(data="train.csv"), "TypeError", ["'train.csv'", "HINT"]),
    (
        "evaluate-steps-negative",
        lambda: tfdist.evaluate(_model(), (X, Y), steps=-2, global_batch_size=8),
        "ValueError",
        ["steps=-2", "HINT"],
    ),
    # ----------------------------------------------------------------------- data helpers
    (
        "distribute_dataset-shuffle-a-batched-dataset",
        lambda: tfdist.distribute_dataset(
            dataset().batch(4), tfdist.make_strategy("one_device", cluster=SINGLE), shuffle=True
        ),
        "ValueError",
        ["shuffle=True", "HINT"],
    ),
    (
        "distribute_dataset-arrays-without-batch",
        lambda: tfdist.distribute_dataset(
            (X, Y), tfdist.make_strategy("one_device", cluster=SINGLE)
        ),
        "ValueError",
        ["global_batch_size", "HINT"],
    ),
    (
        "scale_learning_rate-negative-warmup",
        lambda: tfdist.scale_learning_rate(0.1, 2, warmup_steps=-1),
        "ValueError",
        ["warmup_steps=-1", "HINT"],
    ),
    (
        "scale_learning_rate-replicas-0",
        lambda: tfdist.scale_learning_rate(0.1, 0),
        "ValueError",
        ["replicas=0", "HINT"],
    ),
    # ---------------------------------------------------------------------- set_precision
    (
        "set_precision-unknown-policy",
        lambda: tfdist.set_precision("float8"),
        "ValueError",
        ["'float8'", "Choose"],
    ),
    ("set_precision-a-number", lambda: tfdist.set_precision(16), "TypeError", ["16", "HINT"]),
    # ----------------------------------------------------------------------------- launch
    ("launch-nothing", lambda: tfdist.launch(""), "ValueError", ["target=''", "HINT"]),
    (
        "launch-workers-0",
        lambda: tfdist.launch("x.py", workers=0),
        "ClusterConfigError",
        ["workers=0", "HINT"],
    ),
    (
        "launch-max-restarts-negative",
        lambda: tfdist.launch("x.py", max_restarts=-1),
        "ValueError",
        ["max_restarts=-1", "HINT"],
    ),
    # ------------------------------------------------------------------- BackupAndRestore
    (
        "backup-dir-empty",
        lambda: tfdist.BackupAndRestore(""),
        "ValueError",
        ["backup_dir=''", "HINT"],
    ),
    (
        "backup-dir-none",
        lambda: tfdist.BackupAndRestore(None),
        "ValueError",
        ["backup_dir=None", "HINT"],
    ),
    (
        "backup-dir-a-file",
        lambda: tfdist.BackupAndRestore(__file__),
        "ValueError",
        [repr(__file__), "HINT"],
    ),
    (
        "backup-save-freq-0",
        lambda: tfdist.BackupAndRestore(_tmp("freq"), save_freq=0),
        "ValueError",
        ["save_freq=0", "HINT"],
    ),
    (
        "backup-save-freq-a-word",
        lambda: tfdist.BackupAndRestore(_tmp("freq"), save_freq="batch"),
        "ValueError",
        ["save_freq='batch'", "HINT"],
    ),
    (
        "backup-of-another-model",
        lambda: backup_of_another_model(_tmp("other")),
        "ValueError",
        ["does not fit this model", "HINT"],
    ),
    (
        "backup-state-not-json",
        lambda: foreign_state_file(_tmp("state")),
        "ValueError",
        ["tfdist-backup.json", "HINT"],
    ),
]


def test_the_table_is_at_least_sixty_rows_with_distinct_ids():
    ids = [row[0] for row in ROWS]
    assert len(ids) >= 60 and len(set(ids)) == len(ids)


@pytest.mark.timeout(120)  # nothing may wait: a row that hangs fails here
@pytest.mark.parametrize("call, error, texts", [row[1:] for row in ROWS], ids=[r[0] for r in ROWS])
def test_a_bad_input_is_refused_with_the_value_and_the_fix(virtual_cpus, call, error, texts):
    with pytest.raises(Exception) as caught:
        call()
    assert type(caught.value).__name__ == error, repr(caught.value)
    message = str(caught.value)
    for text in texts:
        assert text in message, f"{text!r} is not in: {message}"
