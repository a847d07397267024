"""Parameter-server training of Keras models through a `ClusterCoordinator`.

Keras 3's own `fit` has no ParameterServerStrategy support (keras-team/keras#18624), so tfdist
drives a compiled Keras 3 model itself: on the coordinator (the chief) it builds the model, its
metrics and its optimizer inside the strategy's scope (every variable then lives on the ps
tasks), makes one dataset per worker from a dataset function, and schedules functions that each
run `steps_per_execution` of the model's own `train_step` / `test_step` on whichever worker is
free. Metric variables live on the ps tasks too, so after `coordinator.join()` the coordinator
reads the aggregate over all workers. Under tf_keras the same calls go to tf_keras's `fit` with
a `DatasetCreator`, which supports parameter-server training natively.

Exact step counts and metrics need the Keras fixes of `tfdist.fixes` (atomic assign_add on
ps variables); sharded variables (a `variable_partitioner`) need the sharding fixes there too.
`tfdist.make_strategy` and `tfdist.fit` apply them.

Callbacks run on the coordinator: `on_train_batch_begin` when a group of steps is scheduled,
`on_train_batch_end` when it has run (in scheduling order), with that group's logs: the metrics
as its worker read them from the ps after its last step, so the aggregate over all workers so
far. Other workers keep updating while a metric's variables are read, so a batch log is a
snapshot (a ratio such as accuracy can be momentarily off). Epoch logs are read after every
scheduled group has run, so they are exact. Without batch-level callbacks (no progress bar,
verbose=0 or 2) no group's logs are read but the epoch's last: groups run back to back.
Under tf_keras, tf_keras refuses batch-level callbacks with a parameter-server strategy;
epoch-level ones work.

Faults. A worker that dies (SIGKILL, a lost node) costs nothing but its share of the work:
ClusterCoordinator runs its unfinished group again on another worker, and tfdist makes that run
apply only the steps the lost worker had not applied (a progress slot per group on the ps, see
`_Runner`), so `optimizer.iterations` stays exact and nothing is applied twice; training goes
on with the workers left (a worker restarted at the same address rejoins). A ps that dies takes
the model's variables with it: fit / evaluate raise `TaskUnavailableError` naming it (tfdist
probes the ps tasks on any TensorFlow error, and every WATCHDOG_SECONDS while it waits), and
the job must be restarted from its last checkpoint.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from typing import Callable, Dict, Optional

from tfdist import flavour, settings
from tfdist.errors import TaskUnavailableError, is_count

__all__ = [
    "TaskUnavailableError",
    "build_model",
    "coordinator_for",
    "evaluate_parameter_server",
    "fit_parameter_server",
    "plan_groups",
]

log = logging.getLogger("tfdist")

# How many scheduled groups may wait for their on_*_batch_end per worker: enough to keep every
# worker busy while the coordinator waits for the oldest group, few enough that batch callbacks
# stay close to the training they report.
IN_FLIGHT_PER_WORKER = 4

# Progress slots on the ps (see _Runner): at most this many scheduled groups are unfinished at
# once. Without batch-level callbacks the coordinator schedules that far ahead.
PROGRESS_SLOTS = 512

# While the coordinator waits for scheduled groups, it checks every WATCHDOG_SECONDS that the
# ps tasks still accept connections: a lost ps ends training with a TaskUnavailableError
# even where TensorFlow would wait on (a host that vanished without closing its sockets).
WATCHDOG_SECONDS = 5.0
PROBE_TIMEOUT_SECONDS = 2.0
LOST_TASK_GRACE_SECONDS = 5.0


def _direct_schedule_allowed() -> bool:
    """Hand groups to the coordinator's cluster directly, so that only a retried group reads
    its progress slot (see _Runner). TFDIST_PS_DIRECT_SCHEDULE=0 (read when a model's runner
    is made): every group reads it, through the public ClusterCoordinator.schedule (slower
    with few steps per group; as exact)."""
    return settings.PS_DIRECT_SCHEDULE.get()


_LOCK = threading.Lock()


# ---------------------------------------------------------------------------- small helpers


def plan_groups(steps: int, steps_per_execution: int) -> list:
    """Splits `steps` steps into scheduled groups of at most `steps_per_execution` steps.

    A pure function. Returns (first_step, last_step) pairs, inclusive, in order; the last group
    holds the remainder when `steps` is not a multiple of `steps_per_execution`.

    Example: plan_groups(7, 3) == [(0, 2), (3, 5), (6, 6)].
    """
    return [
        (begin, min(begin + steps_per_execution, steps) - 1)
        for begin in range(0, steps, steps_per_execution)
    ]


def _count(name: str, value, *, minimum: int = 1) -> int:
    if not is_count(value, minimum):
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"`{name}` must be {kind}. Received: {name}={value!r}.")
    return value


def _check_strategy(strategy) -> None:
    import tensorflow as tf

    if not isinstance(strategy, tf.distribute.ParameterServerStrategy):
        raise TypeError(
            "Parameter-server training needs a tf.distribute.ParameterServerStrategy (the "
            f"coordinator side). Received: strategy={strategy!r} (of type "
            f"{type(strategy).__name__}). HINT: tfdist.make_strategy('parameter_server') in the "
            "chief of a job with ps tasks."
        )


def _check_dataset_fn(name: str, dataset_fn) -> None:
    if not callable(dataset_fn):
        raise TypeError(
            f"`{name}` must be a function of a tf.distribute.InputContext that returns a "
            f"tf.data.Dataset of batches. Received: {name}={dataset_fn!r} (of type "
            f"{type(dataset_fn).__name__})."
        )


def coordinator_for(strategy):
    """The one `ClusterCoordinator` of `strategy` (TensorFlow allows only one per strategy)."""
    import tensorflow as tf

    _check_strategy(strategy)
    with _LOCK:
        return tf.distribute.coordinator.ClusterCoordinator(strategy)  # cached by TensorFlow


def _repeating(name: str, dataset_fn: Callable) -> Callable:
    """`dataset_fn`, checked, and repeated so that a fixed number of steps never runs out."""
    import tensorflow as tf

    def make(input_context):
        dataset = dataset_fn(input_context)
        if not isinstance(dataset, tf.data.Dataset):
            raise TypeError(
                f"`{name}` must return a tf.data.Dataset of batches. Received: "
                f"{dataset!r} (of type {type(dataset).__name__})."
            )
        return dataset.repeat()  # a no-op in effect on an infinite dataset

    return make


def _per_worker_dataset(coordinator, strategy, name: str, dataset_fn: Callable):
    # tfdist's function of a dataset made here: rebuilt from its graph on each worker
    dataset_fn = getattr(dataset_fn, "for_workers", lambda: dataset_fn)()
    make = _repeating(name, dataset_fn)
    return coordinator.create_per_worker_dataset(
        lambda: strategy.distribute_datasets_from_function(make)
    )


def _local_batch(name: str, dataset_fn: Callable):
    """One batch of `dataset_fn`, made on the coordinator (to learn shapes and dtypes)."""
    import tensorflow as tf

    dataset = _repeating(name, dataset_fn)(tf.distribute.InputContext())
    try:
        return next(iter(dataset.take(1)))
    except StopIteration:
        raise ValueError(
            f"`{name}` returned an empty dataset (no batch at all, even on one input pipeline)."
            " HINT: check the data source, and that batch(..., drop_remainder=True) leaves a "
            "batch."
        ) from None


def _to_python(logs) -> dict:
    """Step logs as Python numbers (nested dicts flattened), as Keras gives them to callbacks."""
    result = {}
    for key, value in sorted((logs if isinstance(logs, dict) else {}).items()):
        if isinstance(value, dict):
            result.update(_to_python(value))
            continue
        try:
            value = float(value)  # a scalar tensor or number; anything else is kept as it is
        except (TypeError, ValueError):
            pass
        result[key] = value
    return result


def _history(callbacks):
    keras = flavour.keras()
    for callback in callbacks.callbacks:
        if isinstance(callback, keras.callbacks.History):
            return callback
    return None


# -------------------------------------------------------------------------------- building


def _check_model(model, strategy, method: str) -> None:
    model._assert_compile_called(method)
    if getattr(model, "_distribute_strategy", None) is not strategy:
        raise ValueError(
            f"The model passed to {method} was not created inside this parameter-server "
            "strategy's scope, so its variables do not live on the ps tasks. HINT: build and "
            "compile it inside the scope: `with strategy.scope(): model = build(); "
            "model.compile(...)`."
        )


def build_model(model, strategy, dataset_fn: Optional[Callable] = None, *, sample_batch=None):
    """Builds `model`'s weights, metrics, loss and optimizer on the ps tasks of `strategy`.

    `fit_parameter_server` / `evaluate_parameter_server` call this; call it yourself to restore
    a checkpoint into the built model (immediate restore) before training.

    Args:
        model: a compiled Keras model (Keras 3 or tf_keras), created inside
            `strategy.scope()`.
        strategy: tf.distribute.ParameterServerStrategy.
        dataset_fn: callable(InputContext) -> tf.data.Dataset. Used for one local batch when
            `sample_batch` is None.
        sample_batch: one batch (x, y[, sample_weight]) with the shapes and dtypes of the
            training data. Defaults to the first batch of `dataset_fn`.
    """
    if flavour.uses_legacy_keras():
        _check_strategy(strategy)
        _tf_keras_prepare(model, strategy, dataset_fn, None, sample_batch)
        with strategy.scope():
            model.optimizer.build(model.trainable_variables)
        return
    _build(model, strategy, dataset_fn, sample_batch, "build_model")


def _build(model, strategy, dataset_fn, sample_batch, method: str) -> None:
    _check_strategy(strategy)
    _check_model(model, strategy, method)
    if sample_batch is None:
        if dataset_fn is None:
            raise ValueError("build_model needs `dataset_fn` or `sample_batch` (one batch).")
        sample_batch = _local_batch("dataset_fn", dataset_fn)
    with strategy.scope():
        model._symbolic_build(data_batch=sample_batch)


# ------------------------------------------------------------------------- lost tasks


def _cluster_addresses(strategy, jobs) -> list:
    """[(task name, "host:port")] of `jobs` in the strategy's cluster."""
    # ParameterServerStrategyV2 keeps its resolver on itself; `cluster_resolver` looks at
    # `extended` and returns None.
    resolver = getattr(strategy, "_cluster_resolver", None) or strategy.cluster_resolver
    try:
        spec = resolver.cluster_spec().as_dict()
    except Exception:  # pylint: disable=broad-except
        return []
    out = []
    for job in jobs:
        addresses = spec.get(job) or []
        items = sorted(addresses.items()) if isinstance(addresses, dict) else enumerate(addresses)
        out.extend((f"{job}:{index}", address) for index, address in items)
    return out


def _unreachable(strategy, jobs=("ps",), timeout: float = PROBE_TIMEOUT_SECONDS) -> list:
    """[(task, address)] of the tasks of `jobs` that refuse or time out a TCP connection."""
    import socket

    lost = []
    for task, address in _cluster_addresses(strategy, jobs):
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
                pass
        except (OSError, ValueError):
            lost.append((task, address))
    return lost


def _lost_ps_error(lost, cause=None) -> TaskUnavailableError:
    tasks = [task for task, _ in lost]
    named = ", ".join(f"{task} ({address})" for task, address in lost)
    said = ""
    if cause is not None:
        first = next((line.strip() for line in str(cause).splitlines() if line.strip()), "")
        said = f" TensorFlow said: {type(cause).__name__}: {first[:300]}"
    return TaskUnavailableError(
        f"Parameter-server training stopped: {'task' if len(tasks) == 1 else 'tasks'} "
        f"{named} of the job {'is' if len(tasks) == 1 else 'are'} unreachable (the "
        "process died, or its host is down). The ps tasks hold the model's variables, so "
        "this job cannot go on. HINT: restart the whole job (every task) and restore the "
        "last checkpoint (tf.train.Checkpoint, ModelCheckpoint or BackupAndRestore) before "
        f"training on.{said}",
        tasks,
        [address for _, address in lost],
    )


def _names_a_ps(error, strategy) -> bool:
    text = str(error)
    return "/job:ps/" in text or any(
        address in text for _, address in _cluster_addresses(strategy, ("ps",))
    )


@contextlib.contextmanager
def _naming_lost_tasks(strategy):
    """Turns TensorFlow's errors after a ps task is lost into a TaskUnavailableError.

    TensorFlow reports a dead ps as an UnavailableError naming at best an address ("recvmsg:
    Connection reset by peer"); on any TensorFlow error tfdist probes the ps tasks, and
    names the ones that cannot be reached. A process being killed resets its connections a
    moment before its listening port closes, so an error that names a ps gets
    LOST_TASK_GRACE_SECONDS for the probe to see it gone.
    """
    import tensorflow as tf

    try:
        yield
    except TaskUnavailableError:
        raise
    except tf.errors.OpError as err:
        lost = _unreachable(strategy)
        if not lost and _names_a_ps(err, strategy):
            deadline = time.monotonic() + LOST_TASK_GRACE_SECONDS
            while not lost and time.monotonic() < deadline:
                time.sleep(0.25)
                lost = _unreachable(strategy)
        if not lost:
            raise
        raise _lost_ps_error(lost, err) from err


# ---------------------------------------------------------------------------- the step loop


@contextlib.contextmanager
def _without_metric_results(model):
    """While tracing: `model.get_metrics_result()` returns {} (Keras' train/test_step return it)."""
    object.__setattr__(model, "get_metrics_result", dict)
    try:
        yield
    finally:
        object.__delattr__(model, "get_metrics_result")


def _raw_variable(variable):
    """The tf.Variable under a Keras variable and the strategy's wrappers (on its ps task)."""
    variable = getattr(variable, "_value", variable)  # a Keras 3 variable wraps it
    while getattr(variable, "_v", None) is not None:  # AggregatingVariable, CachingVariable
        variable = variable._v
    return variable


def _has_batch_hooks(callbacks, mode: str) -> bool:
    """True when a callback does something per batch (so each group's logs must be read)."""
    from keras.src.utils.python_utils import is_default

    keras = flavour.keras()
    if type(callbacks) is not keras.callbacks.CallbackList:  # pylint: disable=unidiomatic-typecheck
        return True
    names = (
        ("on_batch_begin", "on_batch_end", "on_train_batch_begin", "on_train_batch_end")
        if mode == "train"
        else ("on_test_batch_begin", "on_test_batch_end")
    )
    for callback in callbacks.callbacks:
        if type(callback) is keras.callbacks.ProgbarLogger:  # pylint: disable=unidiomatic-typecheck
            # It shows batch logs with verbose=1 only, and none while validating in fit.
            if callback.verbose != 1 or (mode == "test" and callback._called_in_fit):
                continue
        if any(not is_default(getattr(callback, name, None) or (lambda: None)) for name in names):
            return True
    return False


class _Group:
    """One scheduled group as ClusterCoordinator runs it: the first run takes the fast function;
    a run after its worker failed (ClusterCoordinator retries it on another worker) takes the
    resuming one, which first reads how many of the group's steps already ran."""

    __slots__ = ("fast", "resume", "runs", "size")

    def __init__(self, fast, resume, size: int):
        self.fast, self.resume, self.runs, self.size = fast, resume, 0, size

    def __call__(self, iterator, meta):
        self.runs += 1
        if self.runs == 1:
            return self.fast(iterator, meta)
        out = self.resume(iterator, meta)
        done = int(out["done"].numpy())
        from tensorflow.python.eager import context

        log.warning(
            "tfdist: a group of %d step(s) ran again on %s after its worker failed: %d of its "
            "steps had been applied, so it ran the other %d.",
            self.size,
            context.context().device_name or "another worker",
            done,
            max(self.size - done, 0),
        )
        return out["logs"]


class _Runner:
    """Schedules groups of `train_step` / `test_step` on the workers and reports each group.

    A retried group applies only its missing steps. ClusterCoordinator runs a scheduled
    function again, on another worker, when its worker fails (WorkerPreemptionHandler puts the
    closure back in the queue), but the failed run may already have applied some of its steps
    to the ps variables: running the whole group again applies those twice (one worker killed
    in the middle of a group of 10 left `optimizer.iterations` at 303 for 300 scheduled steps).
    So each group has a slot of a progress counter that lives on the ps, next to
    `optimizer.iterations`: every step adds 1 to its group's slot right after the optimizer
    counted the step (on the ps: iterations' increment, a read of it, then the slot's
    increment; no worker in between). A retried group starts by reading its slot and runs
    only the steps not yet counted. The coordinator knows each slot's value when it schedules
    a group (`base`: the slot's previous group has finished), so slots are never reset.

    The first run of a group does not read its slot: that read is a ps round trip before the
    group's first step, which cost about a third of the throughput at one step per group
    (benchmarks/bench_ps.py, 2 workers on a loaded 2-core host). ClusterCoordinator.schedule
    takes only tf.functions, so tfdist hands each group to the coordinator's cluster as a
    callable that counts its runs (`_Group`), with both functions traced as schedule() traces
    them. Where that private path is missing, every run reads its slot (`_direct` is False;
    also with TFDIST_PS_DIRECT_SCHEDULE=0).

    Exactness holds for training steps: a step is counted on the ps together with the
    optimizer's `iterations` (no worker in between). A worker lost between those two ps ops
    (microseconds on the ps) would make one step count twice; a worker lost after applying a
    step's weight update but before `iterations` counted it loses that one gradient, as
    asynchronous training tolerates. For `test_step` groups (validation, evaluate) the count
    is not tied to the metric updates: a retried evaluation group may count one batch twice
    or miss one.
    """

    def __init__(self, model, strategy, coordinator):
        self.model, self.strategy, self.coordinator = model, strategy, coordinator
        self.window = min(
            IN_FLIGHT_PER_WORKER * max(1, strategy.extended._num_workers), PROGRESS_SLOTS - 1
        )
        self._functions: Dict[tuple, Callable] = {}
        self._specs: Dict[str, object] = {}  # the structure of each mode's logs, when traced
        self._progress = None  # int64[PROGRESS_SLOTS] on the ps, next to optimizer.iterations
        self._counted = None  # the raw tf.Variable whose increment counts a training step
        self._bases: Optional[list] = None  # each slot's value on the ps; None: read it
        self._next_slot = 0
        self._lost_workers: set = set()
        self._direct = _direct_schedule_allowed() and callable(
            getattr(getattr(coordinator, "_cluster", None), "schedule", None)
        )

    # ------------------------------------------------------------------ the progress slots

    def _progress_variable(self):
        if self._progress is None:
            import tensorflow as tf

            iterations = getattr(getattr(self.model, "optimizer", None), "iterations", None)
            self._counted = None if iterations is None else _raw_variable(iterations)
            with self.strategy.scope():
                colocated = (
                    contextlib.nullcontext()
                    if self._counted is None
                    else self.strategy.extended.colocate_vars_with(self._counted)
                )
                with colocated:
                    variable = tf.Variable(
                        tf.zeros([PROGRESS_SLOTS], tf.int64),
                        trainable=False,
                        name="tfdist_group_progress",
                    )
            self._progress = _raw_variable(variable)
            self._bases = [0] * PROGRESS_SLOTS
        return self._progress

    def _slot_bases(self) -> list:
        progress = self._progress_variable()
        if self._bases is None:  # after a failure: what the ps holds now
            self._bases = [int(v) for v in progress.numpy()]
        return self._bases

    def _count_step(self, mode: str, slot) -> None:
        """Adds 1 to `slot` on the ps, after the optimizer's own count of the step."""
        import tensorflow as tf

        progress = self._progress_variable()
        after = []
        if mode == "train" and self._counted is not None:
            # Ordered after the step's iterations.assign_add (same resource, program order).
            after = [
                tf.raw_ops.ReadVariableOp(resource=self._counted.handle, dtype=self._counted.dtype)
            ]
        with tf.control_dependencies(after):
            tf.raw_ops.ResourceScatterAdd(
                resource=progress.handle, indices=slot, updates=tf.constant(1, tf.int64)
            )

    # ----------------------------------------------------------------- the group functions

    def function(self, mode: str, logs: bool, size: Optional[int] = None) -> Callable:
        """tf.function(iterator, [slot, base, size]): one group; its last logs if `logs`.

        With a `size`, the fast function of groups of that many steps; without, the resuming
        one (any size: it runs the steps its slot has not counted), which returns
        {"logs": ..., "done": steps already applied} for `_Group`.
        """
        report = size is None and self._direct
        key = (mode, logs, size, report)
        if key not in self._functions:
            import tensorflow as tf

            strategy, model = self.strategy, self.model
            step = model.train_step if mode == "train" else model.test_step
            progress = self._progress_variable()

            def on_ps(slot):
                # The slot index, copied to the progress variable's ps once per group: the
                # steps' increments then need nothing from the worker.
                with tf.device(progress.device):
                    return tf.identity(slot)

            def one_step(iterator, slot):
                out = strategy.run(step, args=(next(iterator),))
                self._count_step(mode, slot)
                # Metrics are read from the ps: every replica reports the same aggregate.
                out = tf.nest.map_structure(
                    lambda v: strategy.experimental_local_results(v)[0], out
                )
                self._specs[mode] = tf.nest.map_structure(
                    lambda t: tf.TensorSpec(t.shape, t.dtype), out
                )
                return out

            def quiet_step(iterator, slot):
                # A step whose logs are dropped. Reading them would still cost one read of
                # every metric variable from the ps per step: traced with
                # get_metrics_result() -> {} they are not read; the metric updates stay.
                with _without_metric_results(model):
                    strategy.run(step, args=(next(iterator),))
                self._count_step(mode, slot)

            def no_step():
                # A retried group whose steps had all run: its logs, read from the ps.
                spec = self._specs[mode]  # set by one_step: cond traces its true branch first
                out = strategy.run(model.get_metrics_result)
                out = tf.nest.map_structure(
                    lambda v: strategy.experimental_local_results(v)[0], out
                )
                try:
                    tf.nest.assert_same_structure(spec, out)
                    if all(
                        s.dtype == t.dtype
                        for s, t in zip(tf.nest.flatten(spec), tf.nest.flatten(out))
                    ):
                        return out
                except (TypeError, ValueError):
                    pass
                return tf.nest.map_structure(  # a custom step's own outputs: zeros
                    lambda s: tf.zeros([d or 0 for d in s.shape.as_list()], s.dtype), spec
                )

            if size is not None:

                def group(iterator, meta):
                    slot = on_ps(meta[0])
                    quiet = size - 1 if logs else size
                    if quiet == 1:
                        quiet_step(iterator, slot)
                    elif quiet > 1:
                        for _ in tf.range(quiet):
                            quiet_step(iterator, slot)
                    if logs:
                        return one_step(iterator, slot)
                    return None
            else:

                def resume(iterator, meta):
                    slot, base, size_ = on_ps(meta[0]), meta[1], meta[2]
                    done = (
                        tf.raw_ops.ResourceGather(
                            resource=progress.handle, indices=slot, dtype=tf.int64
                        )
                        - base
                    )
                    todo = size_ - done
                    if not logs:
                        for _ in tf.range(todo):
                            quiet_step(iterator, slot)
                        return None, done
                    for _ in tf.range(todo - 1):
                        quiet_step(iterator, slot)
                    return tf.cond(todo > 0, lambda: one_step(iterator, slot), no_step), done

                def group(iterator, meta):
                    out, done = resume(iterator, meta)
                    return {"logs": out, "done": done} if report else out

            self._functions[key] = tf.function(group)
        return self._functions[key]

    def _concrete_function(self, function, iterator, meta):
        """`function` traced for these arguments, as ClusterCoordinator.schedule traces it."""
        from tensorflow.python.distribute.coordinator import cluster_coordinator as cc
        from tensorflow.python.util import nest

        specs = nest.map_structure(
            cc._maybe_as_type_spec, cc._select_worker_slice(0, (iterator, meta))
        )
        extended = self.strategy.extended
        with self.strategy.scope():
            extended._being_scheduled = True
            try:
                return function.get_concrete_function(*specs)
            finally:
                extended._being_scheduled = False

    def _schedule(self, mode: str, logs: bool, size: int, iterator, meta, traced: dict):
        """Schedules one group; `traced` caches its functions for this run (this iterator)."""
        if self._direct:
            try:
                key = (logs, size)
                if key not in traced:
                    traced[key] = (
                        self._concrete_function(self.function(mode, logs, size), iterator, meta),
                        self._concrete_function(self.function(mode, logs), iterator, meta),
                    )
                group = _Group(*traced[key], size)
            except (AttributeError, ImportError, TypeError) as err:  # TensorFlow changed
                log.info("tfdist: scheduling through ClusterCoordinator.schedule (%s).", err)
                self._direct = False
            else:
                return self.coordinator._cluster.schedule(group, args=(iterator, meta), kwargs=None)
        return self.coordinator.schedule(self.function(mode, logs), args=(iterator, meta))

    # ------------------------------------------------------------------------ the loop

    def _watch(self) -> None:
        """Raises TaskUnavailableError when a ps task is unreachable; warns of lost workers."""
        lost = _unreachable(self.strategy)
        if lost:
            raise _lost_ps_error(lost)
        workers = {task for task, _ in _unreachable(self.strategy, ("worker",))}
        if workers - self._lost_workers:
            log.warning(
                "tfdist: %s unreachable; their groups run again on the other workers (each "
                "step applied once). A worker restarted at the same address rejoins.",
                ", ".join(sorted(workers)),
            )
        self._lost_workers = workers

    def _join(self) -> None:
        """coordinator.join(), watching the ps tasks while it waits."""
        queue = getattr(getattr(self.coordinator, "_cluster", None), "closure_queue", None)
        if not callable(getattr(queue, "wait", None)):
            self.coordinator.join()
            return
        while not queue.wait(timeout=WATCHDOG_SECONDS):  # raises a group's error
            self._watch()

    def _value(self, remote, fetch: bool):
        """A group's logs (as numpy with `fetch`), once it has run (watching the ps tasks).

        When its worker fails just after the group ran, this thread may be the one copying its
        outputs from that worker (RemoteValue.get races the coordinator's worker thread for
        it) and get the worker's UnavailableError, while ClusterCoordinator runs the group
        again elsewhere. Then wait for that run (join) and read again.
        """
        import tensorflow as tf

        ready = getattr(remote, "_status_available_event", None)
        if ready is not None:
            while not ready.wait(WATCHDOG_SECONDS):
                self._watch()
        for attempt in range(3):
            try:
                return remote.fetch() if fetch else remote.get()
            except tf.errors.UnavailableError:
                if attempt == 2:
                    raise
                self._join()  # raises if the group itself failed
        return None

    def run(
        self,
        mode: str,
        iterator,
        steps: int,
        steps_per_execution: int,
        on_begin,
        on_end,
        should_stop,
        batch_hooks: bool = True,
    ) -> dict:
        """Runs `steps` steps; returns the logs of the last group (in scheduling order).

        With `batch_hooks`, `on_begin(first_step)` runs when a group is scheduled and
        `on_end(last_step, logs)` when it has run, in scheduling order; at most `window`
        groups wait for their `on_end`. Without, neither is called, and only the last group
        reads its logs: the others are scheduled ahead as far as the progress slots allow.
        `should_stop()` is asked after each group is scheduled (groups already scheduled
        still run).
        """
        import tensorflow as tf

        bases = self._slot_bases()
        window = self.window if batch_hooks else PROGRESS_SLOTS - 1
        groups = plan_groups(steps, steps_per_execution)
        pending = collections.deque()
        traced: dict = {}
        last = {}

        def finish():
            nonlocal last
            end, remote = pending.popleft()
            if batch_hooks:
                last = self._value(remote, fetch=True)
                on_end(end, last)
            else:
                self._value(remote, fetch=False)  # waits (and raises its error)

        try:
            for number, (begin, end) in enumerate(groups):
                logs = batch_hooks or number == len(groups) - 1
                if batch_hooks:
                    on_begin(begin)
                slot, size = self._next_slot, end - begin + 1
                self._next_slot = (slot + 1) % PROGRESS_SLOTS
                meta = tf.constant([slot, bases[slot], size], tf.int64)
                bases[slot] += size
                pending.append((end, self._schedule(mode, logs, size, iterator, meta, traced)))
                while len(pending) > window:
                    finish()
                if should_stop():
                    break
            self._join()
            if batch_hooks:
                while pending:
                    finish()
            elif pending:
                last = self._value(pending[-1][1], fetch=True) or {}
        except BaseException as err:
            self._bases = None  # unknown after a failure: read from the ps next time
            if not isinstance(err, TaskUnavailableError):
                # Leave no scheduled step running into the next fit/evaluate: wait for them,
                # then raise the first error (join reports errors of other groups; this one
                # wins).
                try:
                    self._join()
                except Exception:  # pylint: disable=broad-except
                    pass
            raise
        return last


def _runner_for(model, strategy, coordinator) -> _Runner:
    """The model's runner (its traced step functions), made again when it is recompiled."""
    key = (
        id(strategy),
        id(model.optimizer),
        id(getattr(model, "_compile_loss", None)),
        id(getattr(model, "_compile_metrics", None)),
    )
    cached = getattr(model, "_tfdist_ps_runner", None)
    if cached is None or cached[0] != key:
        cached = (key, _Runner(model, strategy, coordinator))
        # Past Keras' and TensorFlow's attribute tracking: no checkpoint or save sees it.
        object.__setattr__(model, "_tfdist_ps_runner", cached)
    return cached[1]


def _epoch_logs(model, last_logs) -> dict:
    """The model's metrics, read from the ps (exact, over all workers), as Python numbers.

    As Keras' fit: when a custom step returns other names than the model's metrics, its last
    logs are used instead.
    """
    metrics = model.get_metrics_result()
    if isinstance(last_logs, dict) and last_logs and set(last_logs) != set(metrics):
        return _to_python(last_logs)
    return _to_python(metrics)


def _evaluate_loop(model, runner, iterator, steps, steps_per_execution, callbacks) -> dict:
    model.stop_evaluating = False
    callbacks.on_test_begin()
    model.reset_metrics()
    last = runner.run(
        "test",
        iterator,
        steps,
        steps_per_execution,
        callbacks.on_test_batch_begin,
        lambda end, logs: callbacks.on_test_batch_end(end, _to_python(logs)),
        lambda: getattr(model, "stop_evaluating", False),
        batch_hooks=_has_batch_hooks(callbacks, "test"),
    )
    logs = _epoch_logs(model, last)
    callbacks.on_test_end(logs)
    return logs


def _steps_per_execution(model, value) -> int:
    if value is None:
        value = getattr(model, "steps_per_execution", None) or 1
    return _count("steps_per_execution", value)


# ------------------------------------------------------------------------------ public API


def fit_parameter_server(
    model,
    strategy,
    dataset_fn: Callable,
    *,
    epochs: int = 1,
    steps_per_epoch: int,
    steps_per_execution: Optional[int] = None,
    callbacks=None,
    verbose="auto",
    validation_dataset_fn: Optional[Callable] = None,
    validation_steps: Optional[int] = None,
    initial_epoch: int = 0,
    sample_batch=None,
):
    """Trains a compiled Keras model with a parameter-server strategy, from the coordinator.

    Runs on the chief of a parameter-server job; the worker and ps tasks only serve. Build and
    compile the model inside `strategy.scope()` first.

    Args:
        model: a compiled Keras model (Keras 3, or tf_keras under TF_USE_LEGACY_KERAS=1) made
            inside `strategy.scope()`.
        strategy: tf.distribute.ParameterServerStrategy.
        dataset_fn: callable(tf.distribute.InputContext) -> tf.data.Dataset of batches
            (x, y), (x, y, sample_weight), or dicts; called once per worker (shard by
            `input_context.input_pipeline_id`). It is repeated, so steps never run out.
        epochs: int. Index of the last epoch, as in Keras. Defaults to 1.
        steps_per_epoch: int. Steps (batches, over all workers) per epoch. Required.
        steps_per_execution: int. Steps per scheduled function. Defaults to the model's
            compiled `steps_per_execution`, else 1. Any remainder gets a shorter function, so
            `optimizer.iterations` grows by exactly `steps_per_epoch` per epoch.
        callbacks: list of Keras callbacks, or a `CallbackList`. History and a progress bar
            are added as in Keras.
        verbose: "auto", 0, 1 or 2, as in Keras. Defaults to "auto".
        validation_dataset_fn: callable(InputContext) -> Dataset, evaluated after every
            epoch for `validation_steps` steps; its logs get the "val_" prefix.
        validation_steps: int. Required with `validation_dataset_fn`.
        initial_epoch: int. Epoch to start at (to resume). Defaults to 0.
        sample_batch: one local batch with the shapes of the training data, to build the
            model, metrics and optimizer. Defaults to the first batch of `dataset_fn`.

    Returns:
        keras.callbacks.History.

    Raises:
        TypeError: not a ParameterServerStrategy, or `dataset_fn` is not a function of an
            InputContext returning a tf.data.Dataset.
        ValueError: bad step counts, or a model not built inside the strategy's scope.
        TaskUnavailableError: a ps task was lost (its variables with it); the job must be
            restarted from a checkpoint. A lost worker is not an error: its groups run
            again on the other workers, each step applied once.
    """
    _check_dataset_fn("dataset_fn", dataset_fn)
    _count("epochs", epochs, minimum=0)
    _count("steps_per_epoch", steps_per_epoch)
    _count("initial_epoch", initial_epoch, minimum=0)
    if steps_per_execution is not None:
        _count("steps_per_execution", steps_per_execution)
    if validation_dataset_fn is not None:
        _check_dataset_fn("validation_dataset_fn", validation_dataset_fn)
        if validation_steps is None:
            raise ValueError(
                "`validation_steps` is required with `validation_dataset_fn`: a dataset made "
                "per worker has no common end. Received: validation_steps=None."
            )
        _count("validation_steps", validation_steps)
    _check_strategy(strategy)
    options = dict(
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        steps_per_execution=steps_per_execution,
        callbacks=callbacks,
        verbose=verbose,
        validation_dataset_fn=validation_dataset_fn,
        validation_steps=validation_steps,
        initial_epoch=initial_epoch,
        sample_batch=sample_batch,
    )
    with _naming_lost_tasks(strategy):
        if flavour.uses_legacy_keras():
            return _fit_tf_keras(model, strategy, dataset_fn, **options)
        return _fit_keras3(model, strategy, dataset_fn, **options)


def _fit_keras3(
    model,
    strategy,
    dataset_fn,
    *,
    epochs,
    steps_per_epoch,
    steps_per_execution,
    callbacks,
    verbose,
    validation_dataset_fn,
    validation_steps,
    initial_epoch,
    sample_batch,
):
    keras = flavour.keras()
    k = _steps_per_execution(model, steps_per_execution)
    coordinator = coordinator_for(strategy)
    _build(model, strategy, dataset_fn, sample_batch, "fit_parameter_server")
    runner = _runner_for(model, strategy, coordinator)
    train_iterator = iter(_per_worker_dataset(coordinator, strategy, "dataset_fn", dataset_fn))
    validation = None
    if validation_dataset_fn is not None:
        validation = _per_worker_dataset(
            coordinator, strategy, "validation_dataset_fn", validation_dataset_fn
        )
    if not isinstance(callbacks, keras.callbacks.CallbackList):
        callbacks = keras.callbacks.CallbackList(
            callbacks,
            add_history=True,
            add_progbar=verbose != 0,
            verbose=verbose,
            epochs=epochs,
            steps=steps_per_epoch,
            model=model,
        )

    model.stop_training = False
    callbacks.on_train_begin()
    # As Keras' fit: BackupAndRestore.on_train_begin restores the weights and sets the epoch
    # to resume at.
    initial_epoch = getattr(model, "_initial_epoch", None) or initial_epoch
    batch_hooks = _has_batch_hooks(callbacks, "train")
    training_logs = None
    for epoch in range(initial_epoch, epochs):
        model.reset_metrics()
        callbacks.on_epoch_begin(epoch)
        last = runner.run(
            "train",
            train_iterator,
            steps_per_epoch,
            k,
            callbacks.on_train_batch_begin,
            lambda end, logs: callbacks.on_train_batch_end(end, _to_python(logs)),
            lambda: model.stop_training,
            batch_hooks=batch_hooks,
        )
        epoch_logs = _epoch_logs(model, last)
        if validation is not None:
            # A fresh iterator: every validation starts at the beginning of its data.
            val_logs = _evaluate_loop(
                model, runner, iter(validation), validation_steps, k, callbacks
            )
            epoch_logs.update({f"val_{name}": value for name, value in val_logs.items()})
        callbacks.on_epoch_end(epoch, epoch_logs)
        training_logs = epoch_logs
        if model.stop_training:
            break
    if epochs > initial_epoch and isinstance(model.optimizer, keras.optimizers.Optimizer):
        model.optimizer.finalize_variable_values(model.trainable_weights)
    callbacks.on_train_end(logs=training_logs)
    return _history(callbacks) or getattr(model, "history", None)


def evaluate_parameter_server(
    model,
    strategy,
    dataset_fn: Callable,
    *,
    steps: int,
    steps_per_execution: Optional[int] = None,
    callbacks=None,
    verbose="auto",
    return_dict: bool = False,
    sample_batch=None,
):
    """Evaluates a compiled Keras model with a parameter-server strategy, from the coordinator.

    Args:
        model, strategy, dataset_fn, steps_per_execution, callbacks, verbose, sample_batch: as
            for `fit_parameter_server`.
        steps: int. Batches to evaluate, over all workers. Required: a dataset made per
            worker has no common end.
        return_dict: bool. Return {name: value} instead of a list in the order of
            `model.metrics_names`. Defaults to False.

    Returns:
        The loss and metrics over all `steps` batches (aggregated over every worker), as a
        list (a scalar when there is only the loss) or a dict.
    """
    _check_dataset_fn("dataset_fn", dataset_fn)
    _count("steps", steps)
    if steps_per_execution is not None:
        _count("steps_per_execution", steps_per_execution)
    _check_strategy(strategy)
    options = dict(
        steps=steps,
        steps_per_execution=steps_per_execution,
        callbacks=callbacks,
        verbose=verbose,
        return_dict=return_dict,
        sample_batch=sample_batch,
    )
    with _naming_lost_tasks(strategy):
        if flavour.uses_legacy_keras():
            return _evaluate_tf_keras(model, strategy, dataset_fn, **options)
        return _evaluate_keras3(model, strategy, dataset_fn, **options)


def _evaluate_keras3(
    model,
    strategy,
    dataset_fn,
    *,
    steps,
    steps_per_execution,
    callbacks,
    verbose,
    return_dict,
    sample_batch,
):
    keras = flavour.keras()
    k = _steps_per_execution(model, steps_per_execution)
    coordinator = coordinator_for(strategy)
    _build(model, strategy, dataset_fn, sample_batch, "evaluate_parameter_server")
    runner = _runner_for(model, strategy, coordinator)
    iterator = iter(_per_worker_dataset(coordinator, strategy, "dataset_fn", dataset_fn))
    if not isinstance(callbacks, keras.callbacks.CallbackList):
        callbacks = keras.callbacks.CallbackList(
            callbacks, add_progbar=verbose != 0, verbose=verbose, epochs=1, steps=steps, model=model
        )
    logs = _evaluate_loop(model, runner, iterator, steps, k, callbacks)
    if return_dict:
        return logs
    return model._flatten_metrics_in_order(logs)


# ------------------------------------------------- Keras 3's own fit / evaluate / predict


def _keras_data(x, y, sample_weight, batch_size, shuffle: bool, what: str):
    """(dataset_fn, steps of one pass or None) for model.fit / evaluate arguments."""
    import tensorflow as tf

    from tfdist import data as data_lib

    if isinstance(x, tf.data.Dataset):
        if y is not None or sample_weight is not None:
            raise ValueError(
                f"`{what}` got a tf.data.Dataset as x and also y or sample_weight. HINT: put "
                "them in the dataset's elements: (x, y) or (x, y, sample_weight)."
            )
        # an empty dataset gives no default step count either
        return data_lib.dataset_fn_for(x, repeat=True), data_lib.steps_per_pass(x) or None
    if x is None or callable(x):
        raise TypeError(
            f"`{what}` on parameter_server takes numpy arrays (or dicts of them) or a batched "
            f"tf.data.Dataset. Received: x={x!r} (of type {type(x).__name__}). HINT: for a "
            "dataset function of an InputContext use tfdist.fit(build_model, dataset_fn, ...)."
        )
    data = (
        x
        if y is None and sample_weight is None
        else ((x, y) if sample_weight is None else (x, y, sample_weight))
    )
    batch_size = 32 if batch_size is None else batch_size  # Keras' default
    return (
        data_lib.dataset_fn_for(data, batch_size, shuffle=shuffle, repeat=True),
        data_lib.steps_per_pass(data, batch_size),
    )


def _keras_steps(name: str, given, one_pass, what: str) -> int:
    if given is not None:
        return _count(name, given)
    if one_pass is None:
        raise ValueError(
            f"`{what}` on parameter_server needs `{name}` for a dataset of unknown or infinite "
            f"length: every worker reads its own repeated input. Received: {name}=None. HINT: "
            f"{name}=<batches per epoch>, e.g. examples // global batch size."
        )
    return one_pass


def keras_fit(
    model,
    *,
    x=None,
    y=None,
    batch_size=None,
    epochs=1,
    verbose="auto",
    callbacks=None,
    validation_split=0.0,
    validation_data=None,
    shuffle=True,
    class_weight=None,
    sample_weight=None,
    initial_epoch=0,
    steps_per_epoch=None,
    validation_steps=None,
    validation_batch_size=None,
    validation_freq=1,
):
    """Keras 3's `model.fit` arguments, on the model's parameter-server strategy.

    Installed by tfdist's Keras fixes as `model.fit` for models built in a parameter_server
    scope. Arrays are sharded over the workers (each repeats its shard); an epoch is
    `steps_per_epoch` steps over all workers, by default one pass over the data
    (ceil(examples / batch_size), or the batches of a finite dataset).
    """
    if class_weight is not None:
        raise ValueError(
            "`fit` on parameter_server does not take class_weight. Received: class_weight="
            f"{class_weight!r}. HINT: weight the examples instead: "
            "sample_weight=np.take(weights, y)."
        )
    if validation_freq != 1:
        raise ValueError(
            "`fit` on parameter_server validates after every epoch. Received: "
            f"validation_freq={validation_freq!r}. HINT: leave validation_freq=1."
        )
    import tensorflow as tf

    if validation_split and validation_data is None:
        from keras.src.trainers.data_adapters import array_slicing

        if isinstance(x, tf.data.Dataset):
            raise ValueError(
                "validation_split needs arrays, not a tf.data.Dataset (as in Keras). HINT: "
                "pass validation_data= instead."
            )
        (x, y, sample_weight), validation_data = array_slicing.train_validation_split(
            (x, y, sample_weight), validation_split=validation_split
        )
    dataset_fn, one_pass = _keras_data(x, y, sample_weight, batch_size, shuffle, "fit")
    steps_per_epoch = _keras_steps("steps_per_epoch", steps_per_epoch, one_pass, "fit")
    validation_fn = None
    if validation_data is not None:
        from keras.src.trainers.data_adapters import data_adapter_utils

        if isinstance(validation_data, tf.data.Dataset):
            val = (validation_data, None, None)
        else:
            val = data_adapter_utils.unpack_x_y_sample_weight(validation_data)
        validation_fn, val_pass = _keras_data(
            *val, validation_batch_size or batch_size, False, "fit"
        )
        validation_steps = _keras_steps("validation_steps", validation_steps, val_pass, "fit")
    return fit_parameter_server(
        model,
        model._distribute_strategy,
        dataset_fn,
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        callbacks=callbacks,
        verbose=verbose,
        validation_dataset_fn=validation_fn,
        validation_steps=validation_steps,
        initial_epoch=initial_epoch,
    )


def keras_evaluate(
    model,
    *,
    x=None,
    y=None,
    batch_size=None,
    verbose="auto",
    sample_weight=None,
    steps=None,
    callbacks=None,
    return_dict=False,
):
    """Keras 3's `model.evaluate` arguments, on the model's parameter-server strategy: the
    aggregate over `steps` batches (by default one pass over the data) read by all workers."""
    dataset_fn, one_pass = _keras_data(x, y, sample_weight, batch_size, False, "evaluate")
    return evaluate_parameter_server(
        model,
        model._distribute_strategy,
        dataset_fn,
        steps=_keras_steps("steps", steps, one_pass, "evaluate"),
        callbacks=callbacks,
        verbose=verbose,
        return_dict=return_dict,
    )


# ------------------------------------------------------------------------------- tf_keras


def _tf_keras_prepare(model, strategy, dataset_fn, steps_per_execution, sample_batch):
    """tf_keras trains ps natively; build a model with no known input shape, set k."""
    if getattr(model, "distribute_strategy", None) is not strategy:
        raise ValueError(
            "The model was not created inside this parameter-server strategy's scope. HINT: "
            "build and compile it inside `with strategy.scope():`."
        )
    if not model.built:
        if sample_batch is None:
            sample_batch = _local_batch("dataset_fn", dataset_fn)
        x = sample_batch[0] if isinstance(sample_batch, (tuple, list)) else sample_batch
        with strategy.scope():
            model(x)
    if steps_per_execution is not None:
        model._configure_steps_per_execution(_count("steps_per_execution", steps_per_execution))


def _tf_keras_verbose(verbose):
    if verbose == 1:  # tf_keras refuses 1 with a ps strategy (a per-batch progress bar)
        log.info(
            "tfdist: tf_keras prints one line per epoch (verbose=2) under ParameterServerStrategy."
        )
        return 2
    return verbose


def _fit_tf_keras(
    model,
    strategy,
    dataset_fn,
    *,
    epochs,
    steps_per_epoch,
    steps_per_execution,
    callbacks,
    verbose,
    validation_dataset_fn,
    validation_steps,
    initial_epoch,
    sample_batch,
):
    keras = flavour.keras()
    creator = keras.utils.experimental.DatasetCreator
    _tf_keras_prepare(model, strategy, dataset_fn, steps_per_execution, sample_batch)
    validation = None
    if validation_dataset_fn is not None:
        validation = creator(_repeating("validation_dataset_fn", validation_dataset_fn))
    return model.fit(
        creator(_repeating("dataset_fn", dataset_fn)),
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        callbacks=callbacks,
        verbose=_tf_keras_verbose(verbose),
        validation_data=validation,
        validation_steps=validation_steps,
        initial_epoch=initial_epoch,
    )


def _evaluate_tf_keras(
    model,
    strategy,
    dataset_fn,
    *,
    steps,
    steps_per_execution,
    callbacks,
    verbose,
    return_dict,
    sample_batch,
):
    keras = flavour.keras()
    _tf_keras_prepare(model, strategy, dataset_fn, steps_per_execution, sample_batch)
    return model.evaluate(
        keras.utils.experimental.DatasetCreator(_repeating("dataset_fn", dataset_fn)),
        steps=steps,
        callbacks=callbacks,
        verbose=_tf_keras_verbose(verbose),
        return_dict=return_dict,
    )
