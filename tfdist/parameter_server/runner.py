"""The exactly-once runner: groups of steps scheduled on the workers, each step applied once.

`coordinator_for` gives a strategy's one ClusterCoordinator. `_Runner` splits the steps into
groups of `steps_per_execution` (`plan_groups`), schedules each group on whichever worker is
free and reports it to the loop when it has run, in scheduling order. A worker that dies
(SIGKILL, a lost node) costs nothing but its share of the work: ClusterCoordinator runs its
unfinished group again on another worker, and that run applies only the steps the lost worker
had not applied (a progress slot per group on the ps, see `_Runner`), so
`optimizer.iterations` stays exact; training goes on with the workers left (a worker restarted
at the same address rejoins). While it waits, the runner probes the tasks (`watchdog`).

TensorFlow is imported inside functions. Holds `_LOCK`, the package's one module-level state.
Sets each model's runner on the model (`_tfdist_ps_runner`, past Keras' attribute tracking)
and creates a progress variable on the ps tasks. `_GroupSteps` holds the steps a group's
tf.function is made of.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
from typing import Callable, Dict, Optional

from tfdist import settings
from tfdist.errors import TaskUnavailableError
from tfdist.parameter_server.checks import check_strategy
from tfdist.parameter_server.watchdog import WATCHDOG_SECONDS, lost_ps_error, unreachable

__all__ = ["InFlight", "coordinator_for", "plan_groups", "runner_for"]

log = logging.getLogger("tfdist")


# How many scheduled groups may wait for their on_*_batch_end per worker: enough to keep every
# worker busy while the coordinator waits for the oldest group, few enough that batch callbacks
# stay close to the training they report.
IN_FLIGHT_PER_WORKER = 4

# Progress slots on the ps (see _Runner): at most this many scheduled groups are unfinished at
# once. Without batch-level callbacks the coordinator schedules that far ahead.
PROGRESS_SLOTS = 512


def _direct_schedule_allowed() -> bool:
    """Hand groups to the coordinator's cluster directly, so that only a retried group reads
    its progress slot (see _Runner). TFDIST_PS_DIRECT_SCHEDULE=0 (read when a model's runner
    is made): every group reads it, through the public ClusterCoordinator.schedule (slower
    with few steps per group; as exact)."""
    return settings.PS_DIRECT_SCHEDULE.get()


_LOCK = threading.Lock()


def coordinator_for(strategy):
    """The one `ClusterCoordinator` of `strategy` (TensorFlow allows only one per strategy)."""
    import tensorflow as tf

    check_strategy(strategy)
    with _LOCK:
        return tf.distribute.coordinator.ClusterCoordinator(strategy)  # cached by TensorFlow


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

    def __init__(self, model, strategy, coordinator, train_step: Optional[Callable] = None):
        self.model, self.strategy, self.coordinator = model, strategy, coordinator
        self.train_step = train_step or model.train_step  # one step on one replica's batch
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
        self.scheduled = 0  # steps scheduled by the latest run; all of them ran once it returned
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

            steps = _GroupSteps(self, mode)
            group = steps.resuming(logs, report) if size is None else steps.fast(size, logs)
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

    # ------------------------------------------------------------------ one group at a time

    def schedule_one(self, mode: str, iterator, size: int, flight: "InFlight"):
        """Schedules one group of `size` steps that returns its last logs; returns its
        RemoteValue. For a caller that schedules groups one by one and joins on its own
        (tf_keras' fit): `flight` (the caller's, one per fit) holds its groups in flight, and
        a slot is taken again only once its previous group has run."""
        import tensorflow as tf

        bases = self._slot_bases()
        while len(flight.groups) >= PROGRESS_SLOTS - 1:
            self._value(flight.groups.popleft(), fetch=False)  # waits (and raises its error)
        slot = self._next_slot
        self._next_slot = (slot + 1) % PROGRESS_SLOTS
        meta = tf.constant([slot, bases[slot], size], tf.int64)
        bases[slot] += size
        if flight.iterator is not iterator:  # traced anew for each iterator
            flight.iterator, flight.traced = iterator, {}
        remote = self._schedule(mode, True, size, iterator, meta, flight.traced)
        flight.groups.append(remote)
        return remote

    def forget_slots(self) -> None:
        """The slots' values are read from the ps before the next group (after a failure)."""
        self._bases = None

    # ------------------------------------------------------------------------ the loop

    def _watch(self) -> None:
        """Raises TaskUnavailableError when a ps task is unreachable; warns of lost workers."""
        lost = unreachable(self.strategy)
        if lost:
            raise lost_ps_error(lost)
        workers = {task for task, _ in unreachable(self.strategy, ("worker",))}
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
        ahead: Optional[int] = None,
    ) -> dict:
        """Runs `steps` steps; returns the logs of the last group (in scheduling order).

        With `batch_hooks`, `on_begin(first_step)` runs when a group is scheduled and
        `on_end(last_step, logs)` when it has run, in scheduling order; at most `window`
        groups wait for their `on_end`. Without, neither is called, and only the last group
        reads its logs: the others are scheduled ahead as far as the progress slots allow.
        `ahead`, when given, is the number of groups in flight instead (waiting for a group
        reads none of its logs). `should_stop()` is asked once after each group is scheduled
        (groups already scheduled still run); `scheduled` then holds the steps scheduled,
        all of which have run once this returns.
        """
        import tensorflow as tf

        bases = self._slot_bases()
        window = self.window if batch_hooks else PROGRESS_SLOTS - 1
        if ahead is not None:
            window = max(1, min(ahead, PROGRESS_SLOTS - 1))
        self.scheduled = 0
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
                self.scheduled = end + 1
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


class InFlight:
    """The groups one caller of `_Runner.schedule_one` has in flight, oldest first, and the
    functions traced for its iterator."""

    __slots__ = ("groups", "iterator", "traced")

    def __init__(self):
        self.groups: collections.deque = collections.deque()
        self.iterator = None
        self.traced: dict = {}


class _GroupSteps:
    """The steps a runner's group functions are made of, for one mode ("train" or "test").

    `fast(size, logs)` and `resuming(logs, report)` return the Python function of a group,
    which `_Runner.function` turns into a tf.function: steps whose logs are dropped
    (`quiet_step`), the last one's returned (`one_step`), or, for a retried group whose steps
    had all run, the logs read from the ps (`no_step`). Every step counts itself in the group's
    progress slot on the ps.
    """

    def __init__(self, runner: _Runner, mode: str):
        self.strategy, self.model, self.mode = runner.strategy, runner.model, mode
        self.step = runner.train_step if mode == "train" else self.model.test_step
        self.progress = runner._progress_variable()
        self.count_step = runner._count_step
        self.specs = runner._specs  # the structure of each mode's logs, once traced

    def on_ps(self, slot):
        """The slot index, copied to the progress variable's ps once per group: the steps'
        increments then need nothing from the worker."""
        import tensorflow as tf

        with tf.device(self.progress.device):
            return tf.identity(slot)

    def one_step(self, iterator, slot):
        """A step whose logs are returned."""
        import tensorflow as tf

        strategy = self.strategy
        out = strategy.run(self.step, args=(next(iterator),))
        self.count_step(self.mode, slot)
        # Metrics are read from the ps: every replica reports the same aggregate.
        out = tf.nest.map_structure(lambda v: strategy.experimental_local_results(v)[0], out)
        self.specs[self.mode] = tf.nest.map_structure(
            lambda t: tf.TensorSpec(t.shape, t.dtype), out
        )
        return out

    def quiet_step(self, iterator, slot) -> None:
        """A step whose logs are dropped. Reading them would still cost one read of every
        metric variable from the ps per step: traced with get_metrics_result() -> {} they are
        not read; the metric updates stay."""
        with _without_metric_results(self.model):
            self.strategy.run(self.step, args=(next(iterator),))
        self.count_step(self.mode, slot)

    def no_step(self):
        """A retried group whose steps had all run: its logs, read from the ps."""
        import tensorflow as tf

        strategy = self.strategy
        spec = self.specs[self.mode]  # set by one_step: cond traces its true branch first
        out = strategy.run(self.model.get_metrics_result)
        out = tf.nest.map_structure(lambda v: strategy.experimental_local_results(v)[0], out)
        try:
            tf.nest.assert_same_structure(spec, out)
            if all(s.dtype == t.dtype for s, t in zip(tf.nest.flatten(spec), tf.nest.flatten(out))):
                return out
        except (TypeError, ValueError):
            pass
        return tf.nest.map_structure(  # a custom step's own outputs: zeros
            lambda s: tf.zeros([d or 0 for d in s.shape.as_list()], s.dtype), spec
        )

    def fast(self, size: int, logs: bool) -> Callable:
        """group(iterator, meta): `size` steps, from the first; the last one's logs if `logs`."""
        import tensorflow as tf

        def group(iterator, meta):
            slot = self.on_ps(meta[0])
            quiet = size - 1 if logs else size
            if quiet == 1:
                self.quiet_step(iterator, slot)
            elif quiet > 1:
                for _ in tf.range(quiet):
                    self.quiet_step(iterator, slot)
            if logs:
                return self.one_step(iterator, slot)
            return None

        return group

    def resuming(self, logs: bool, report: bool) -> Callable:
        """group(iterator, meta): the steps the group's slot has not counted yet; its logs if
        `logs`, with `report` as {"logs": ..., "done": steps already applied}."""
        import tensorflow as tf

        progress = self.progress

        def resume(iterator, meta):
            slot, base, size = self.on_ps(meta[0]), meta[1], meta[2]
            done = (
                tf.raw_ops.ResourceGather(resource=progress.handle, indices=slot, dtype=tf.int64)
                - base
            )
            todo = size - done
            if not logs:
                for _ in tf.range(todo):
                    self.quiet_step(iterator, slot)
                return None, done
            for _ in tf.range(todo - 1):
                self.quiet_step(iterator, slot)
            return tf.cond(todo > 0, lambda: self.one_step(iterator, slot), self.no_step), done

        def group(iterator, meta):
            out, done = resume(iterator, meta)
            return {"logs": out, "done": done} if report else out

        return group


def runner_for(model, strategy, coordinator) -> _Runner:
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
