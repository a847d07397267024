"""One proof per fix of `tfdist.fixes.FIXES`: the smallest run that shows the bug the fix removes.

A `Proof` names its fix, the strategy kind it needs ("mirrored": virtual CPUs in one process;
"multi_worker_mirrored": 2 local processes; "parameter_server": a chief, workers and ps tasks as
in-process servers), a function that exercises exactly that bug and returns plain data (or
raises the upstream error), the upstream error texts (their wording differs between Keras
releases), and a `check` of the data that names the wrong number when the bug is there.

`verdict(proof, outcomes)` says what a run showed: PASS (no bug), BUG (the upstream error or the
wrong number) or OTHER (an unrelated failure). tests/cluster/test_each_fix.py runs every proof
with all fixes on and with its fix alone removed (TFDIST_KERAS_FIXES=-name). The `in_*`
functions are what one process (or every task of a cluster) runs: several proofs with the same
fixes, one result each, so one process start serves many proofs.

Scenarios of tests/helpers/keras_scenarios.py are reused where one already shows the bug.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
import traceback
from typing import Callable, Optional, Sequence, Tuple

import numpy as np

from helpers import keras_scenarios as scenarios
from helpers.compression import NOT_BFLOAT16

MIRRORED, MULTI_WORKER, PARAMETER_SERVER = "mirrored", "multi_worker_mirrored", "parameter_server"
KINDS = (MIRRORED, MULTI_WORKER, PARAMETER_SERVER)
TASKS = {MIRRORED: 1, MULTI_WORKER: 2, PARAMETER_SERVER: 1}  # processes a run of each kind starts
CPUS = 4  # replicas of the mirrored proofs
PASS, BUG, OTHER = "pass", "bug", "other"


@dataclasses.dataclass(frozen=True)
class Proof:
    """How to show the bug one fix removes.

    Attributes:
        fix: str. The fix's name in FIXES.
        kind: str. The strategy the proof runs under (one of KINDS).
        shows: str. What the proof does and what goes wrong without the fix, in one line.
        run: callable(strategy) -> plain data, or callable(strategy, directory) when
            `directory` is set (a directory every task of the run shares).
        check: callable(list of each task's data) -> None when right, else what is wrong.
        errors: tuple of str. The upstream error texts: any of them in an error is the bug.
        directory: bool. `run` takes the shared directory.
    """

    fix: str
    kind: str
    shows: str
    run: Callable
    check: Callable[[list], Optional[str]]
    errors: Tuple[str, ...] = ()
    directory: bool = False


def verdict(proof: Proof, outcomes: Sequence[dict]) -> Tuple[str, str]:
    """(PASS | BUG | OTHER, why) for one proof's outcomes ({"ok": data} or {"error": text})."""
    failed = [o for o in outcomes if "error" in o]
    if failed:
        for outcome in failed:
            if any(text in outcome["error"] for text in proof.errors):
                return BUG, outcome["error"]
        return OTHER, "\n".join(f"{o['error']}\n{o.get('where', '')}" for o in failed)
    problem = proof.check([o["ok"] for o in outcomes])
    return (BUG, problem) if problem else (PASS, "")


# --------------------------------------------------------------------------- helpers


def _tf():
    return scenarios.tf()


def _keras():
    return scenarios.keras()


def _one_device():
    return _tf().distribute.get_strategy()


def _close(a, b, rel=1e-5) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-8)


def _each(values, problem: Callable) -> Optional[str]:
    """The first task's problem (with its task number), or None."""
    for i, value in enumerate(values):
        found = problem(value)
        if found:
            return found if len(values) == 1 else f"task {i}: {found}"
    return None


# ------------------------------------------------------------- mirrored (and every strategy)


def _plain_data(tf):
    """Tensor slices, batched and repeated: a dataset with nothing for tf.data to tune."""
    return tf.data.Dataset.from_tensor_slices(tf.zeros((64, 4))).batch(8).repeat()


def _summing_step(strategy):
    """A traced step that reads one element of a distributed iterator on every replica."""
    tf = _tf()

    @tf.function
    def step(iterator):
        return strategy.run(tf.reduce_sum, args=(next(iterator),))

    return step


def _read_for(step, iterators, seconds: float) -> None:
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        for iterator in iterators:
            step(iterator)


def _slow_drops(drops, what: str) -> Optional[str]:
    if any(seconds > 0.25 for seconds in drops):
        return f"dropping {what} took {drops} s (more than 0.25 s)"
    return None


def device_iterator_drops(strategy):
    """Iterators of a distributed dataset read for 0.75-1.4 s in a traced loop, then their
    per-device parts dropped: the seconds each drop took."""
    dataset = strategy.experimental_distribute_dataset(_plain_data(_tf()))
    step = _summing_step(strategy)
    drops = []
    for age in (0.75, 1.4, 0.75, 1.4):
        iterator = iter(dataset)
        _read_for(step, [iterator], age)
        parts = []
        for worker in iterator._iterators:  # one per worker; each owns a MultiDeviceIterator
            owner = worker._iterator
            parts += owner._device_iterators
            owner._device_iterators = []
        dropped = time.monotonic()
        del parts
        drops.append(round(time.monotonic() - dropped, 3))
        del iterator
    return {"drops": drops}


def _device_iterators_dropped_at_once(result) -> Optional[str]:
    return _slow_drops(result["drops"], "the per-device iterators")


def host_iterator_threads(strategy):
    """Threads per live iterator of a plain distributed dataset (tensor slices, batch,
    repeat), and of the same dataset with autotuning turned off by its user; then 4 iterators
    of the plain one read for 1.4 s in a traced loop and dropped: the seconds each drop took."""
    tf = _tf()
    plain = _plain_data(tf)
    options = tf.data.Options()
    options.autotune.enabled = False
    datasets = {
        "plain": strategy.experimental_distribute_dataset(plain),
        "autotune_off": strategy.experimental_distribute_dataset(plain.with_options(options)),
    }
    step = _summing_step(strategy)

    def threads_per_iterator(dataset, count=4):
        warm = iter(dataset)
        step(warm)
        del warm
        time.sleep(0.2)
        before = len(os.listdir("/proc/self/task"))
        iterators = [iter(dataset) for _ in range(count)]
        for iterator in iterators * 3:
            step(iterator)
        time.sleep(0.2)
        return (len(os.listdir("/proc/self/task")) - before) / count

    threads = {name: [] for name in datasets}
    for _ in range(2):  # the fewest of two, against threads that start late
        for name, dataset in datasets.items():
            threads[name].append(threads_per_iterator(dataset))
    iterators = [iter(datasets["plain"]) for _ in range(4)]
    _read_for(step, iterators, 1.4)
    drops = []
    while iterators:
        dropped = time.monotonic()
        iterators.pop()
        drops.append(round(time.monotonic() - dropped, 3))
    return {"threads": {name: min(counts) for name, counts in threads.items()}, "drops": drops}


def _host_iterators_dropped_at_once(result) -> Optional[str]:
    threads = result["threads"]
    if threads["plain"] > threads["autotune_off"]:
        return (
            f"an iterator of a dataset with nothing to tune runs {threads['plain']} threads, "
            f"{threads['autotune_off']} with autotuning off: the host's autotuning thread, "
            f"which a drop waits for (drops: {result['drops']} s)"
        )
    return _slow_drops(result["drops"], "the iterators")


def replica_copies(strategy):
    """fit on even batches, then the largest difference between the replicas' copies."""
    tf = _tf()
    x, y = scenarios.regression_data(64)
    model = scenarios.mlp(strategy)
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), epochs=2, verbose=0)
    spread = 0.0
    for variable in model.trainable_variables:
        copies = [np.asarray(c) for c in strategy.experimental_local_results(variable.value)]
        spread = max([spread] + [float(np.max(np.abs(c - copies[0]))) for c in copies])
    return {
        "replicas": len(strategy.experimental_local_results(model.trainable_variables[0].value)),
        "spread": spread,
        "moved": scenarios.max_difference(
            scenarios.weights(model), scenarios.weights(scenarios.mlp(_one_device()))
        ),
    }


def _replica_copies_agree(result) -> Optional[str]:
    if result["replicas"] != CPUS or result["moved"] < 0.05:
        return f"not a trained model on {CPUS} replicas: {result}"
    if result["spread"] > 1e-6:
        return (
            f"the replicas' copies of the weights differ by {result['spread']:.3g}: each "
            "replica applied its own gradient"
        )
    return None


def metric_totals(strategy):
    """evaluate (loss and mae) under the strategy and on one device, with the same weights."""
    tf = _tf()
    x, y = scenarios.regression_data(64)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    return {
        name: scenarios.mlp(s).evaluate(data, verbose=0, return_dict=True)
        for name, s in (("strategy", strategy), ("one_device", _one_device()))
    }


def empty_replica_loss(strategy):
    """evaluate and fit of 42 examples in batches of 8 on 4 replicas: the last batch gives 2 of
    them none; the logged loss and mae, and one device's with the same weights."""
    tf = _tf()
    x, y = scenarios.regression_data(42)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    result = {}
    for name, s in (("strategy", strategy), ("one_device", _one_device())):
        model = scenarios.mlp(s, optimizer=lambda: _keras().optimizers.SGD(0.0))
        logs = model.evaluate(data, verbose=0, return_dict=True)
        history = model.fit(data, epochs=1, verbose=0).history
        result[name] = dict(logs, fit_loss=history["loss"][-1])
    return result


def _metrics_equal_one_device(result) -> Optional[str]:
    strategy, one = result["strategy"], result["one_device"]
    wrong = {k: (strategy[k], one[k]) for k in one if not _close(strategy[k], one[k])}
    if wrong:
        return f"evaluate differs from one device (strategy, one device): {wrong}"
    return None


def _trains_as_one_device(result) -> Optional[str]:
    if result["moved"] < 0.05:
        return f"the weights did not train: {result}"
    if result["max_weight_difference"] > 1e-5:
        return (
            f"the weights differ from one-device training by {result['max_weight_difference']:.3g}"
        )
    return None


def _uneven_split_as_one_device(result) -> Optional[str]:
    problem = _trains_as_one_device(result)
    if problem:
        return problem
    if result["max_log_difference"] > 1e-5:
        return (
            "the logged loss and mae of a step differ from one device's by "
            f"{result['max_log_difference']:.3g} (relative)"
        )
    return None


def guide_custom_steps(strategy):
    """The custom train_step and test_step of the Keras guide "Customizing what happens in
    fit()" (the loss metric updated with compute_loss's value): what evaluate and one step of
    fit log, from the same weights, under the strategy and on one device. (Both read the loss
    before any update, so the proof does not depend on how the step trains.)"""
    tf, k = _tf(), _keras()

    class GuideModel(k.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(y=y, y_pred=y_pred)
            gradients = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply(gradients, self.trainable_variables)
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred)
            return {m.name: m.result() for m in self.metrics}

        def test_step(self, data):
            x, y = data
            y_pred = self(x, training=False)
            loss = self.compute_loss(y=y, y_pred=y_pred)
            for metric in self.metrics:
                if metric.name != "loss":
                    metric.update_state(y, y_pred)
                else:
                    metric.update_state(loss)
            return {m.name: m.result() for m in self.metrics}

    x, y = scenarios.regression_data(64)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    initial = [np.full([4, 1], 0.1, "float32"), np.zeros([1], "float32")]
    results = {}
    for name, s in (("strategy", strategy), ("one_device", _one_device())):
        with s.scope():
            inputs = k.Input((4,))
            model = GuideModel(inputs, k.layers.Dense(1)(inputs))
            model.set_weights(initial)
            model.compile(optimizer=k.optimizers.SGD(0.1), loss="mse", metrics=["mae"])
        evaluated = model.evaluate(data, verbose=0, return_dict=True)
        history = model.fit(data.take(1), epochs=1, verbose=0)
        results[name] = {
            **{f"evaluate {key}": evaluated[key] for key in ("loss", "mae")},
            **{f"fit {key}": history.history[key][0] for key in ("loss", "mae")},
        }
    return results


def _guide_steps_log_one_device_values(result) -> Optional[str]:
    strategy, one = result["strategy"], result["one_device"]
    if not one["fit loss"] > 0.01:
        return f"no loss to compare: {result}"
    wrong = {key: (strategy[key], one[key]) for key in one if not _close(strategy[key], one[key])}
    if wrong:
        return f"the custom steps log other values than one device (strategy, one device): {wrong}"
    return None


def optimizer_outside_the_scope(strategy):
    """An optimizer made before strategy.scope(): refused by tfdist, with where to create it."""
    try:
        scenarios.optimizer_made_outside_the_scope(strategy)
    except ValueError as err:
        if "was created outside the strategy's scope" not in str(err):
            raise
        return {"refused": "HINT: create it inside the scope" in str(err)}
    return {"refused": False}


def _refused(result) -> Optional[str]:
    return None if result["refused"] else f"not refused with tfdist's message: {result}"


def _finite(result) -> Optional[str]:
    return None if result["finite"] else "inf/NaN reached the weights"


def _uneven_batches_train(result) -> Optional[str]:
    loss = result["loss"]
    if not loss[-1] < loss[0] or result["predict_shape"] != [70, 1]:
        return f"did not train or predict: {result}"
    return None


def _accumulates_as_one_device(result) -> Optional[str]:
    if result["iterations"] != result["one_device_iterations"]:
        return f"{result['iterations']} iterations, {result['one_device_iterations']} on one device"
    if result["moved"] < 0.01 or result["max_weight_difference"] > 1e-5:
        return f"differs from one device: {result}"
    return None


def _a_mask_per_replica(result) -> Optional[str]:
    if result["replicas"] != CPUS or not result["reproducible"]:
        return f"not {CPUS} replicas drawing reproducibly: {result}"
    if result["distinct_masks"] != CPUS:
        return f"{result['distinct_masks']} distinct Dropout mask(s) on {CPUS} replicas"
    return None


def _jit_trains_without_xla(result) -> Optional[str]:
    plain, jit = result["jit_False"], result["jit_True"]
    if not jit["warnings"] or "tfdist runs the step without XLA" not in jit["warnings"][0]:
        return f"no warning that the step runs without XLA: {jit['warnings']}"
    if not all(_close(a, b) for a, b in zip(plain["loss"], jit["loss"])):
        return f"jit_compile=True trains differently: {jit['loss']} vs {plain['loss']}"
    return None


# -------------------------------------------------------------------- multi_worker_mirrored


def _same_global_training(values) -> Optional[str]:
    first = values[0]
    for key in ("xy_loss", "weighted_loss", "dict_loss"):
        if not first[key][-1] < first[key][0]:
            return f"{key} did not decrease: {first[key]}"
    for key in ("xy_loss", "xy_weights", "evaluate"):
        if any(v[key] != first[key] for v in values):
            return f"{key} differs between the workers: {[v[key] for v in values]}"
    return None


def _steps_per_execution_chosen(result) -> Optional[str]:
    # (a release older than the fix's first variant keeps 1: nothing to choose there)
    from tfdist.fixes.record import NOT_NEEDED

    chosen = 1 if result["state"] == NOT_NEEDED else 15
    if result["seen"] != [chosen] * 2 or result["seen_with_a_step_callback"] != [1, 1]:
        return f"steps per call {result['seen']}, {result['seen_with_a_step_callback']}"
    if result["after"] != 1 or result["iterations"] != [60, 60]:
        return f"compile's setting after fit {result['after']}, {result['iterations']} steps"
    if result["max_weight_difference"] > 1e-6 or result["max_log_difference"] > 1e-6:
        return f"15 steps per call train differently from 1: {result}"
    return None


def _steps_per_execution_exact(values) -> Optional[str]:
    def problem(result):
        if result["iterations"] != result["one_device_iterations"]:
            return f"{result['iterations']} iterations, {result['one_device_iterations']} on one"
        if result["one_device_iterations"] == 20 and (
            result["max_weight_difference"] > 1e-6 or result["max_log_difference"] > 1e-5
        ):
            return f"steps_per_execution=3 trains differently from 1: {result}"
        return None  # Keras 3.3-3.6 run extra steps at an epoch's end on one device too

    return _each(values, problem) or (
        None if values[0]["loss"] == values[-1]["loss"] else "the workers' losses differ"
    )


def tensorboard_files(strategy, directory):
    """fit with Keras' TensorBoard callback into one directory on every worker: the event files
    in it once every worker's fit has begun, and where their scalars stop."""
    import glob

    k = _keras()
    tf = _tf()
    logs = os.path.abspath(os.path.join(directory, "tensorboard"))
    model = scenarios.mlp(strategy)
    x, y = scenarios.regression_data(32)
    model.fit(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(8),
        epochs=2,
        verbose=0,
        callbacks=[k.callbacks.TensorBoard(logs)],
    )
    strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)  # all have fit
    return {"train": sorted(os.path.basename(p) for p in glob.glob(f"{logs}/train/events.*"))}


def _one_event_file(result) -> Optional[str]:
    if len(result["train"]) != 1:
        return f"{len(result['train'])} event files in the shared train/ directory, not 1"
    return None


def checkpoint_writers(strategy, directory):
    """ModelCheckpoint + BackupAndRestore into one directory: which worker writes there.

    Every save_weights call is recorded. The proof observes who writes the shared paths, not
    whether this run's writes happen to collide (upstream, a collision fails one worker in the
    middle of fit, and its peer then waits in a collective that never comes): the directories
    exist before fit (no race to create them), a non-chief worker's write there waits a second
    (the chief's write of the same file has ended), and the backup is kept at the end (the
    chief would delete it while a late peer still writes into it).
    """
    k = _keras()
    tf = _tf()
    shared = os.path.abspath(os.path.join(directory, "checkpoints"))
    os.makedirs(os.path.join(shared, "backup"), exist_ok=True)
    chief = bool(strategy.extended.should_checkpoint)
    model = scenarios.mlp(strategy)
    written = []
    save_weights = model.save_weights

    def recording(filepath, *args, **kwargs):
        path = os.path.abspath(str(filepath))
        inside = path.startswith(shared + os.sep)
        written.append(os.path.relpath(path, shared) if inside else "<elsewhere>")
        if inside and not chief:
            time.sleep(1.0)
        return save_weights(filepath, *args, **kwargs)

    object.__setattr__(model, "save_weights", recording)  # past Keras' attribute tracking
    x, y = scenarios.regression_data(32)
    model.fit(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(8),
        epochs=2,
        verbose=0,
        callbacks=[
            k.callbacks.BackupAndRestore(os.path.join(shared, "backup"), delete_checkpoint=False),
            k.callbacks.ModelCheckpoint(
                os.path.join(shared, "epoch{epoch}.weights.h5"), save_weights_only=True
            ),
        ],
    )
    return {"chief": chief, "written": written}


def _only_the_chief_writes(values) -> Optional[str]:
    chiefs = [v for v in values if v["chief"]]
    if len(chiefs) != 1 or not [p for p in chiefs[0]["written"] if p != "<elsewhere>"]:
        return f"not one chief writing the checkpoints: {values}"
    for value in values:
        shared = [p for p in value["written"] if p != "<elsewhere>"]
        if not value["chief"] and shared:
            return f"a non-chief worker wrote the shared paths {shared}"
    return None


UINT32_MAX = 2**32 - 1


def unsigned_variable(strategy):
    """A uint32 Keras variable made in the scope, with another initial value on each worker."""
    k = _keras()
    task = strategy.cluster_resolver.task_id
    with strategy.scope():
        variable = k.Variable(
            np.array([task + 1, UINT32_MAX], "uint32"), dtype="uint32", trainable=False
        )
    return {"task": task, "value": [int(v) for v in np.asarray(variable.numpy())]}


def _the_chiefs_value_everywhere(values) -> Optional[str]:
    wrong = [v for v in values if v["value"] != [1, UINT32_MAX]]
    return f"not the chief's initial value on every worker: {wrong}" if wrong else None


def differing_variable(strategy):
    """A variable of another shape on worker 1 made in the scope, then one alike on both: what
    each worker was told, and the chief's value of the second (the strategy still works)."""
    tf = _tf()
    task = strategy.cluster_resolver.task_id
    told = None
    with strategy.scope():
        try:
            tf.Variable(tf.zeros([4, 16 if task == 1 else 32]), name="narrower")
        except ValueError as err:
            told = str(err)
        after = tf.Variable(tf.fill([2], float(task + 1)), name="after")
    return {"task": task, "told": told, "after": [float(v) for v in after.numpy()]}


def _each_worker_told_the_shapes(values) -> Optional[str]:
    # The number counts every variable made in the strategy's scope, so it depends on what ran
    # on the strategy before (proofs of a kind share one strategy).
    wanted = re.compile(
        r"variable number \d+ made in the strategy's scope is narrower \[4, 32\] float32 on "
        r"worker:0, but narrower \[4, 16\] float32 on worker:1"
    )
    for v in values:
        if not v["told"] or not wanted.search(v["told"]):
            return f"worker:{v['task']} was not told {wanted.pattern!r}: {v['told']!r}"
        if v["after"] != [1.0, 1.0]:
            return f"worker:{v['task']} has {v['after']} after it, not the chief's [1.0, 1.0]"
    return None


def fit_datasets_from_function(strategy):
    """model.fit / evaluate of `strategy.distribute_datasets_from_function(...)`: the losses."""
    tf, k = _tf(), _keras()
    x, y = scenarios.regression_data()

    def dataset_fn(context):
        batch = context.get_per_replica_batch_size(32)
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch)

    data = strategy.distribute_datasets_from_function(dataset_fn)
    with strategy.scope():
        model = k.Sequential([k.Input((x.shape[1],)), k.layers.Dense(1)])
        model.compile(optimizer=k.optimizers.SGD(0.05), loss="mse")
    history = model.fit(data, steps_per_epoch=4, epochs=2, verbose=0)
    return {"fit": history.history["loss"], "evaluate": model.evaluate(data, steps=2, verbose=0)}


def _fit_and_evaluate_ran(result) -> Optional[str]:
    losses = result["fit"] + [result["evaluate"]]
    if len(result["fit"]) != 2 or not all(np.isfinite(losses)):
        return f"fit / evaluate gave {result}"
    return None


def generator_read_once(strategy):
    """fit of a Python generator of 20 batches (counted by a callback), and of one whose 5th
    batch raises ValueError: the batches fit trained, and what it raised."""
    k = _keras()

    def batches(bad=None):
        for i in range(20):
            if i == bad:
                raise ValueError(f"bad record {i}")
            yield np.full((8, 4), 0.1, "float32"), np.ones((8, 1), "float32")

    class Count(k.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.batches = 0

        def on_train_batch_end(self, batch, logs=None):
            self.batches += 1

    counted = Count()
    scenarios.mlp(strategy).fit(batches(), epochs=1, verbose=0, callbacks=[counted])
    try:
        history = scenarios.mlp(strategy).fit(batches(bad=4), epochs=1, verbose=0)
        raised = f"nothing: fit returned {history.history}"
    except Exception as err:  # the generator's error, as TensorFlow carries it
        raised = f"{type(err).__name__}: {err}"
    return {
        "batches": counted.batches,
        "names_the_error": "ValueError: bad record 4" in raised,
        "raised": raised[:300],
    }


def _every_batch_and_the_error(result) -> Optional[str]:
    if result["batches"] != 20:
        return f"fit of a generator of 20 batches trained {result['batches']}"
    if not result["names_the_error"]:
        return f"fit of a generator whose 5th batch raises ValueError raised {result['raised']}"
    return None


LARGE = 18_000_003  # float32 elements: 72 MB, 5 pieces of 16 MiB (tfdist.fixes.collectives)


def _collective_reduces(function) -> int:
    """CollectiveReduceV2 ops in a tf.function's graph, its nested functions included."""
    graph = function.get_concrete_function().graph.as_graph_def()
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    return sum(node.op == "CollectiveReduceV2" for node in nodes)


def all_reduce_on_the_wire(strategy):
    """The strategy's own all-reduce: the collectives a 72 MB tensor takes, and the sum of
    NOT_BFLOAT16 on each worker with gradient_compression "bf16" (or why it was refused)."""
    tf = _tf()
    from tfdist.strategy.compression import compress_multi_worker

    def summed(size):
        @tf.function
        def step():
            def replica():
                ctx = tf.distribute.get_replica_context()
                return ctx.all_reduce("SUM", tf.fill([size], NOT_BFLOAT16))[:1]

            return strategy.run(replica)

        return step

    result = {"collectives": _collective_reduces(summed(LARGE))}
    try:
        compress_multi_worker(strategy, "bf16")
    except RuntimeError as err:
        result["compressed"] = f"refused: {err}"
        return result
    try:
        value = strategy.experimental_local_results(summed(2048)())[0]
        result["compressed"] = float(value[0])
    finally:
        compress_multi_worker(strategy, None)  # the other proofs of this process: uncompressed
    return result


def _compressed_in_pieces(result) -> Optional[str]:
    if result["collectives"] != 5:
        return f"a 72 MB all-reduce took {result['collectives']} collective(s), not 5 pieces"
    if result["compressed"] != 2.0:
        return f"bf16 compression: the sum is {result['compressed']!r}, not 2.0 (bfloat16)"
    return None


# -------------------------------------------------------------------------- parameter_server


def _ps_helpers():
    """tests/helpers/parameter_server.py: the datasets, models and graph helpers of the
    parameter-server tests."""
    from helpers import parameter_server as ps

    return ps


def _fit_parameter_server():
    from tfdist.parameter_server import fit_parameter_server

    return fit_parameter_server


def ps_assign_add(strategy):
    """The ops of `variable.assign_add(1)` on a variable that lives on a ps."""
    ps = _ps_helpers()
    with strategy.scope():
        on_ps = _keras().Variable(0, dtype="int64")
    return {"ops": ps._op_types(_tf().function(lambda: ps._add_one(on_ps)))}


def _one_atomic_op(result) -> Optional[str]:
    ops = set(result["ops"])
    if "AssignAddVariableOp" in ops and not {"ReadVariableOp", "AssignVariableOp"} & ops:
        return None
    return (
        "assign_add is a read, an add on the worker and an assign back (concurrent workers "
        f"lose updates): {sorted(ops)}"
    )


def ps_metric_totals(strategy):
    """The ops of a Sum and a Mean metric's update_state when their totals live on a ps."""
    ps = _ps_helpers()
    keras, tf = _keras(), _tf()
    with strategy.scope():
        total, mean = keras.metrics.Sum(), keras.metrics.Mean()
    values = tf.constant([1.0, 2.0, 3.0])
    return {
        "sum": ps._op_types(tf.function(lambda: total.update_state(values))),
        "mean": ps._op_types(tf.function(lambda: mean.update_state(values))),
    }


def _metric_totals_added_atomically(result) -> Optional[str]:
    for metric in ("sum", "mean"):
        ops = set(result[metric])
        if "AssignAddVariableOp" not in ops or {"ReadVariableOp", "AssignVariableOp"} & ops:
            return (
                f"{metric}.update_state reads its total on the worker and assigns it back "
                f"(concurrent workers lose updates): {sorted(ops)}"
            )
    return None


PS_EXAMPLES, PS_BATCH, PS_EPOCHS = 256, 16, 2


def ps_plain_fit(strategy):
    """model.fit / evaluate / predict of a model built in the scope, on numpy arrays."""
    ps = _ps_helpers()
    k = _keras()
    x, y = ps._regression_dataset_fn(None).unbatch().batch(PS_EXAMPLES).get_single_element()
    x, y = x.numpy(), y.numpy()
    with strategy.scope():
        model = k.Sequential([k.Input((4,)), k.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    model.fit(x, y, batch_size=PS_BATCH, epochs=PS_EPOCHS, verbose=0)
    return {
        "iterations": int(model.optimizer.iterations.numpy()),
        "evaluate": model.evaluate(x, y, batch_size=PS_BATCH, verbose=0),
        "predict_vs_call": float(np.max(np.abs(model.predict(x, verbose=0) - model(x).numpy()))),
    }


def _plain_fit_works(result) -> Optional[str]:
    expected = PS_EPOCHS * PS_EXAMPLES // PS_BATCH
    if result["iterations"] != expected:
        return f"{result['iterations']} iterations, not {expected}"
    if not np.isfinite(result["evaluate"]) or result["predict_vs_call"] > 1e-6:
        return f"evaluate or predict wrong: {result}"
    return None


PS_STEPS = 20

RERUN_STEPS, RERUN_K, RERUN_EPOCHS = 5, 2, 2  # per epoch: calls of 2, 2 and 1 steps


def ps_rerun_call(strategy):
    """tf_keras fit on the ps, the second call of its train function run twice, as
    ClusterCoordinator runs a closure again when its worker is lost after it ran."""
    from tfdist.parameter_server.runner import coordinator_for

    ps = _ps_helpers()
    k = _keras()
    cluster = coordinator_for(strategy)._cluster
    schedule, calls = cluster.schedule, []

    def schedule_again(function, args, kwargs):
        calls.append(function)
        remote = schedule(function, args, kwargs)
        if len(calls) == 2:  # the same function, the same arguments: a retry
            schedule(function, args, kwargs)
        return remote

    with strategy.scope():
        model = k.Sequential([k.Input((4,)), k.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse", steps_per_execution=RERUN_K)
    cluster.schedule = schedule_again
    try:
        model.fit(
            k.utils.experimental.DatasetCreator(ps._regression_dataset_fn),
            epochs=RERUN_EPOCHS,
            steps_per_epoch=RERUN_STEPS,
            verbose=0,
        )
    finally:
        del cluster.schedule
    return {"iterations": int(model.optimizer.iterations.numpy()), "calls": len(calls)}


def _each_step_applied_once(result) -> Optional[str]:
    expected = RERUN_EPOCHS * RERUN_STEPS
    if result["calls"] != RERUN_EPOCHS * 3:
        return f"{result['calls']} calls of the train function, not {RERUN_EPOCHS * 3}"
    if result["iterations"] != expected:
        return f"optimizer.iterations {result['iterations']} after {expected} steps"
    return None


def _sharded_model(strategy):
    ps = _ps_helpers()
    with strategy.scope():
        model = ps._embedding_model(_keras())
    return model, model.get_layer("table").embeddings


def ps_sharded_training(strategy):
    """tfdist's parameter-server loop trains an Embedding table sharded over both ps tasks."""
    ps = _ps_helpers()
    model, table = _sharded_model(strategy)
    before = table.numpy()
    _fit_parameter_server()(
        model, strategy, ps._embedding_dataset_fn, epochs=1, steps_per_epoch=PS_STEPS, verbose=0
    )
    return {
        "shards": len(table._value.variables),
        "iterations": int(model.optimizer.iterations.numpy()),
        "rows_changed": int((np.abs(table.numpy() - before).sum(1) > 0).sum()),
        "vocabulary": int(before.shape[0]),
    }


def _sharded_table_trains(result) -> Optional[str]:
    if result["shards"] != 2:
        return f"the table is not in 2 shards: {result}"
    if result["iterations"] != PS_STEPS or result["rows_changed"] < result["vocabulary"] // 2:
        return f"the sharded table did not train: {result}"
    return None


def ps_sharded_checkpoint(strategy, directory):
    """A sharded table through tf.train.Checkpoint and a weights file, into a model with no ps."""
    ps = _ps_helpers()
    tf, k = _tf(), _keras()
    model, table = _sharded_model(strategy)
    path = tf.train.Checkpoint(model=model).save(os.path.join(directory, "sharded", "ckpt"))
    plain = ps._embedding_model(k)  # outside the scope: its variables are in this process
    tf.train.Checkpoint(model=plain).restore(path).expect_partial()
    restored = np.array_equal(plain.get_layer("table").embeddings.numpy(), table.numpy())
    weights_file = os.path.join(directory, "sharded", "table.weights.h5")
    model.save_weights(weights_file)
    loaded = ps._embedding_model(k)
    loaded.load_weights(weights_file)
    return {
        "shards": len(table._value.variables),
        "checkpoint_restored": bool(restored),
        "weights_file_loaded": bool(
            np.array_equal(loaded.get_layer("table").embeddings.numpy(), table.numpy())
        ),
    }


def _sharded_checkpoint_restores(result) -> Optional[str]:
    if result != {"shards": 2, "checkpoint_restored": True, "weights_file_loaded": True}:
        return f"the sharded table did not come back whole: {result}"
    return None


# ---------------------------------------------------------------------------- the proofs


def _one(check):
    """A check of one task's data, for the checks of a list of tasks."""
    return lambda values: _each(values, check)


_PROOFS = [
    Proof(
        "device_iterators_dropped_at_once",
        MIRRORED,
        "4 iterators of a distributed dataset, read for 0.75-1.4 s, then dropped: their "
        "per-device parts go at once (upstream: until each device's autotuning thread wakes, "
        "up to as long again)",
        device_iterator_drops,
        _one(_device_iterators_dropped_at_once),
    ),
    Proof(
        "host_iterators_dropped_at_once",
        MIRRORED,
        "iterators of a plain dataset (tensor slices, batch, repeat) run no autotuning thread "
        "on the host, and 4 read for 1.4 s drop at once (upstream: one thread each, and a "
        "drop that loses its race waits up to as long again)",
        host_iterator_threads,
        _one(_host_iterators_dropped_at_once),
    ),
    Proof(
        "gradients_summed_over_replicas",
        MIRRORED,
        "fit on 4 replicas: the replicas' copies of every weight stay equal (upstream: each "
        "applies its own gradient)",
        replica_copies,
        _one(_replica_copies_agree),
    ),
    Proof(
        "metric_variables_summed_over_replicas",
        MIRRORED,
        "evaluate's loss and mae on 4 replicas equal one device's (upstream: one replica's "
        "share, or the totals summed again)",
        metric_totals,
        _one(_metrics_equal_one_device),
    ),
    Proof(
        "empty_replica_batch_loss_is_zero",
        MIRRORED,
        "evaluate and fit of 42 examples in batches of 8 on 4 replicas log one device's loss "
        "(upstream: nan, the 2 replicas without an example of the last batch divide 0 by 0)",
        empty_replica_loss,
        _one(_metrics_equal_one_device),
    ),
    Proof(
        "loss_scaled_for_replicas",
        MIRRORED,
        "fit on 4 replicas reaches one-device training's weights (upstream: 4 times the step)",
        scenarios.matches_one_device,
        _one(_trains_as_one_device),
    ),
    Proof(
        "custom_step_logs_the_unscaled_loss",
        MIRRORED,
        "the Keras guide's custom train_step / test_step on 4 replicas log one device's loss "
        "(upstream: the loss divided by 4)",
        guide_custom_steps,
        _one(_guide_steps_log_one_device_values),
    ),
    Proof(
        "uneven_batches_weighted_by_examples",
        MIRRORED,
        "batches of 7 on 4 replicas reach one-device training's weights and step logs "
        "(upstream: each replica's mean counts the same)",
        scenarios.uneven_split_matches_one_device,
        _one(_uneven_split_as_one_device),
    ),
    Proof(
        "optimizer_made_outside_the_scope",
        MIRRORED,
        "an optimizer made before the scope is refused with a HINT (upstream: TensorFlow's "
        '"Mixing different tf.distribute.Strategy objects")',
        optimizer_outside_the_scope,
        _one(_refused),
        ("Mixing different tf.distribute.Strategy objects",),
    ),
    Proof(
        "loss_scale_skip_agreed_by_all_replicas",
        MIRRORED,
        "mixed_float16, replicas 1-3 overflow, replica 0 does not: the weights stay finite "
        "(upstream: inf/NaN)",
        scenarios.loss_scale_disagreement,
        _one(_finite),
    ),
    Proof(
        "symbolic_build_from_a_local_batch",
        MIRRORED,
        'batches of 7 on 4 replicas: fit, evaluate, predict work (upstream: "AddN must have '
        'the same size and shape")',
        scenarios.uneven_batches,
        _one(_uneven_batches_train),
        ("AddN must have the same size and shape",),
    ),
    Proof(
        "gradient_accumulation_under_a_strategy",
        MIRRORED,
        "gradient_accumulation_steps=2 on 4 replicas equals one device (upstream: "
        '"`merge_call` called while defining a new graph")',
        scenarios.gradient_accumulation,
        _one(_accumulates_as_one_device),
        ("`merge_call` called while defining a new graph",),
    ),
    Proof(
        "different_random_draws_per_replica",
        MIRRORED,
        "Dropout on 4 replicas draws 4 different masks, reproducibly (upstream: 1 mask)",
        scenarios.dropout_masks,
        _one(_a_mask_per_replica),
    ),
    Proof(
        "no_xla_step_across_replicas",
        MIRRORED,
        "jit_compile=True on 4 replicas trains as without XLA, with a warning (upstream: "
        '"Trying to access resource ... located in device")',
        scenarios.embedding_and_jit,
        _one(_jit_trains_without_xla),
        ("Trying to access resource", "located in device"),
    ),
    Proof(
        "distributed_datasets_from_function_in_fit",
        MIRRORED,
        "model.fit / evaluate of strategy.distribute_datasets_from_function(...) on 4 replicas "
        '(upstream: "Unrecognized data type: x=<...DistributedDatasetsFromFunction ...>")',
        fit_datasets_from_function,
        _one(_fit_and_evaluate_ran),
        ("Unrecognized data type",),
    ),
    Proof(
        "python_generator_read_once",
        MIRRORED,
        "fit of a Python generator on 4 replicas trains its 20 batches, and an error raised at "
        "the 5th comes out of fit (upstream: 16 batches, and fit returns normally)",
        generator_read_once,
        _one(_every_batch_and_the_error),
    ),
    Proof(
        "multi_worker_mean_of_metric_results",
        MULTI_WORKER,
        "fit / evaluate / predict on 2 workers give the same global logs on both (upstream: "
        '"Invalid reduction dimension 0 for input with 0 dimensions")',
        scenarios.fit_evaluate_predict,
        _same_global_training,
        ("Invalid reduction dimension 0 for input with 0 dimensions",),
    ),
    Proof(
        "multi_worker_steps_per_execution",
        MULTI_WORKER,
        "steps_per_execution=3 on 2 workers trains as 1 step per call (upstream: "
        '"You must feed a value for placeholder tensor")',
        scenarios.steps_per_execution,
        _steps_per_execution_exact,
        ("You must feed a value for placeholder tensor",),
    ),
    Proof(
        "steps_per_execution_chosen",
        MULTI_WORKER,
        "fit of 30-step epochs on 2 workers runs 15 steps per call, and 1 where a callback on "
        "the chief reads every step, with the same weights and logs (upstream: 1)",
        scenarios.chosen_steps_per_execution,
        _one(_steps_per_execution_chosen),
    ),
    Proof(
        "tf_keras_steps_per_execution_chosen",
        MULTI_WORKER,
        "tf_keras fit of 30-step epochs on 2 workers runs 15 steps per call, and 1 where a "
        "callback on the chief reads every step, with the same weights and logs (upstream: 1)",
        scenarios.chosen_steps_per_execution,
        _one(_steps_per_execution_chosen),
    ),
    Proof(
        "tf_keras_parameter_server_step_applied_once",
        PARAMETER_SERVER,
        "tf_keras fit of 2 x 5 steps, 2 per call, one call run again as after a lost worker: "
        "optimizer.iterations 10 (upstream: 12, that call's steps applied twice)",
        ps_rerun_call,
        _one(_each_step_applied_once),
    ),
    Proof(
        "multi_worker_tensorboard_written_by_the_chief",
        MULTI_WORKER,
        "fit with TensorBoard into one directory on 2 workers leaves one event file of training "
        "(upstream: one per worker, every scalar twice)",
        tensorboard_files,
        _one(_one_event_file),
        directory=True,
    ),
    Proof(
        "multi_worker_checkpoint_callbacks",
        MULTI_WORKER,
        "ModelCheckpoint + BackupAndRestore on 2 workers: only the chief writes the shared "
        "paths (upstream: both do, and race)",
        checkpoint_writers,
        _only_the_chief_writes,
        ("unable to lock file",),
        directory=True,
    ),
    Proof(
        "unsigned_variables_under_multi_worker",
        MULTI_WORKER,
        "a uint32 variable made on 2 workers holds the chief's value on both (upstream: "
        "\"Value for attr 'T' of uint32 is not in the list of allowed values\")",
        unsigned_variable,
        _the_chiefs_value_everywhere,
        ("Value for attr 'T' of uint32 is not in the list of allowed values",),
    ),
    Proof(
        "multi_worker_differing_variables_named",
        MULTI_WORKER,
        "a variable of shape [4, 16] on worker:1 and [4, 32] on worker:0: a ValueError naming "
        'both on both, and the strategy goes on (upstream: "Shape mismatch in the collective '
        'instance", then every collective aborted)',
        differing_variable,
        _each_worker_told_the_shapes,
        ("Shape mismatch in the collective instance", "Collective ops is aborted"),
    ),
    Proof(
        "multi_worker_all_reduce_compressed_in_pieces",
        MULTI_WORKER,
        "a 72 MB all-reduce on 2 workers goes as 5 pieces of 16 MiB, and gradient_compression="
        '"bf16" sums bfloat16 values (upstream: one message, and no compression)',
        all_reduce_on_the_wire,
        _one(_compressed_in_pieces),
    ),
    Proof(
        "parameter_server_atomic_assign_add",
        PARAMETER_SERVER,
        "assign_add on a ps variable is one AssignAddVariableOp (upstream: read, add, assign "
        "back, which loses concurrent updates)",
        ps_assign_add,
        _one(_one_atomic_op),
    ),
    Proof(
        "parameter_server_atomic_metric_totals",
        PARAMETER_SERVER,
        "a Sum and a Mean metric on the ps add to their totals with one AssignAddVariableOp "
        "each (Keras 3.3: read, add, assign back, which loses concurrent updates)",
        ps_metric_totals,
        _one(_metric_totals_added_atomically),
    ),
    Proof(
        "parameter_server_fit_evaluate_predict",
        PARAMETER_SERVER,
        'model.fit / evaluate / predict of a ps model on arrays (upstream: "you need to pass '
        'this dataset to ClusterCoordinator.create_per_worker_dataset")',
        ps_plain_fit,
        _one(_plain_fit_works),
        ("you need to pass this dataset to ClusterCoordinator.create_per_worker_dataset",),
    ),
    Proof(
        "parameter_server_sharded_trainable_variables",
        PARAMETER_SERVER,
        "an Embedding table sharded over 2 ps trains (upstream: \"'ShardedVariable' object "
        "has no attribute 'handle'\")",
        ps_sharded_training,
        _one(_sharded_table_trains),
        ("'ShardedVariable' object has no attribute 'handle'",),
    ),
    Proof(
        "parameter_server_sharded_checkpoint",
        PARAMETER_SERVER,
        "a sharded table saves to a checkpoint and a weights file, restored whole without ps "
        "(upstream: \"'ShardedVariable' object has no attribute 'device'\")",
        ps_sharded_checkpoint,
        _one(_sharded_checkpoint_restores),
        ("'ShardedVariable' object has no attribute 'device'", "'__array__'"),
        directory=True,
    ),
]
PROOFS = {proof.fix: proof for proof in _PROOFS}


# ------------------------------------------------------------- what one process runs


def run_proofs(strategy, names, directory) -> dict:
    """Runs the proofs of `names` under `strategy`, each recorded as {"ok": data} or
    {"error": text}; with the fixes applied in this process and every fix's state."""
    import tensorflow as tf

    from tfdist import fixes, flavour

    outcomes = {}
    for name in names:
        proof = PROOFS[name]
        started = time.monotonic()
        try:
            data = proof.run(strategy, directory) if proof.directory else proof.run(strategy)
            outcomes[name] = {"ok": data}
        except Exception as err:  # recorded: the test asserts on the upstream error text
            outcomes[name] = {
                "error": f"{type(err).__name__}: {err}",
                "where": traceback.format_exc(limit=-3),
            }
        outcomes[name]["seconds"] = round(time.monotonic() - started, 1)
    return {
        "applied": fixes.applied(),
        "states": {status.name: status.state for status in fixes.report()},
        "keras": flavour.keras_version(),
        "tensorflow": tf.__version__,
        "outcomes": outcomes,
    }


def in_mirrored(names, directory):
    """For run_cluster(workers=1): mirrored on CPUS virtual CPUs in a fresh process."""
    import tfdist

    tfdist.virtual_cpus(CPUS)
    return run_proofs(
        tfdist.make_strategy("mirrored", cluster=tfdist.ClusterSpec({})), names, directory
    )


def in_multi_worker(names, directory):
    """For run_cluster(workers=2): multi_worker_mirrored from TF_CONFIG."""
    import tfdist

    return run_proofs(tfdist.make_strategy(), names, directory)


def in_parameter_server(names, directory):
    """For run_cluster(workers=1): a chief with 2 workers and 2 ps as in-process servers."""
    import tfdist
    from tfdist.strategy import start_local_servers

    spec = tfdist.ClusterSpec.local(workers=2, ps=2, chief=True, task_type="chief")
    start_local_servers(spec)
    strategy = tfdist.make_strategy(
        "parameter_server",
        cluster=spec,
        variable_partitioner="min_size",
        min_shard_bytes=_ps_helpers().SHARD_BYTES,
    )
    return run_proofs(strategy, names, directory)


RUNNERS = {
    MIRRORED: in_mirrored,
    MULTI_WORKER: in_multi_worker,
    PARAMETER_SERVER: in_parameter_server,
}
