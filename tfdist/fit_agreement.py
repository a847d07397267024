"""Under multi_worker_mirrored, the workers check that they train the same thing.

Workers whose models differ (a layer of another size, a variable more or fewer), or whose fits
differ in epochs or in steps per epoch (a worker with fewer batches), otherwise fail at their
first collective that differs, with TensorFlow's text only ("Shape mismatch in the collective
instance 100 ... [4,32] ... [4,16]", "Collective instance 129 expected type 0 and data_type
9 ..."), or hang at the end of the shorter epoch. Two checks name the difference instead, each
through the coordination service's key-value store, each peer read within
TFDIST_STARTUP_TIMEOUT seconds (a worker that is not there in time is named too):

- each variable made in the strategy's scope, before the chief broadcasts its initial value
  (`check_variable`, called by the fix `multi_worker_differing_variables_named` of
  tfdist.fixes.tensorflow): its shape and dtype on every worker. A model built differently
  is a ValueError while it is built, and the strategy stays usable;
- at the start of every fit (Keras 3's and tf_keras', `CallbackList.on_train_begin`, after
  the callbacks' own: a restored backup counts): what each worker is about to train (`Plan`:
  the shapes and dtypes of the model's variables, in order, with their names; epochs and steps
  per epoch). A difference is a ValueError on every worker, before any step.

`install()` is called by `make_strategy` for a multi_worker_mirrored job of several workers; a
fit of a model made outside the strategy's scope (one device) is not checked.
Holds the count of fits of this process (the key of each fit's plans).
"""

from __future__ import annotations

import json
import threading
from typing import Callable, List, Optional

from tfdist import flavour, settings, task

__all__ = ["Plan", "check_variable", "difference", "exchange", "install", "variable_difference"]

_PREFIX = "tfdist/fit"
_VARIABLES = "tfdist/variable"
_POLL_MS = 1000
_LOCK = threading.Lock()
_STATE = {"installed": False, "fits": 0}


class Plan(dict):
    """What one worker's fit trains: {"variables": [[name, shape, dtype], ...], "epochs",
    "steps"} (steps per epoch; None when Keras does not know them)."""

    @classmethod
    def of(cls, callbacks) -> Optional["Plan"]:
        model = getattr(callbacks, "model", None)
        if model is None:
            return None
        params = getattr(callbacks, "params", None) or {}
        variables = []
        for variable in list(getattr(model, "weights", [])):
            shape = getattr(variable, "shape", None)
            variables.append(
                [
                    str(getattr(variable, "path", None) or getattr(variable, "name", "?")),
                    None if shape is None else [d if d is None else int(d) for d in shape],
                    str(getattr(getattr(variable, "dtype", None), "name", variable.dtype)),
                ]
            )
        return cls(variables=variables, epochs=params.get("epochs"), steps=params.get("steps"))


def difference(plans: List[dict], names: List[str]) -> Optional[str]:
    """What differs between the plans of the tasks `names` (in the same order), or None: the
    first task's against each other's. A pure function."""
    first, one = plans[0], names[0]
    for plan, other in zip(plans[1:], names[1:]):
        ours, theirs = first["variables"], plan["variables"]
        for index, (a, b) in enumerate(zip(ours, theirs)):
            if a[1:] != b[1:]:
                return (
                    f"the models differ: variable {index} is {a[0]} {a[1]} {a[2]} on {one}, "
                    f"{b[0]} {b[1]} {b[2]} on {other}"
                )
        if len(ours) != len(theirs):
            (more, most), (fewer, least) = sorted(
                [(one, ours), (other, theirs)], key=lambda pair: -len(pair[1])
            )
            extra = most[len(least)]
            return (
                f"the models differ: {more} has {len(most)} variables, {fewer} {len(least)} "
                f"(the first of the others is {extra[0]} {extra[1]})"
            )
        for key, what in (("epochs", "epochs"), ("steps", "steps per epoch")):
            if first.get(key) != plan.get(key):
                return (
                    f"the fits differ in {what}: {first.get(key)} on {one}, {plan.get(key)} "
                    f"on {other}"
                )
    return None


_MODEL_HINT = (
    "HINT: every worker must build the same model in strategy.scope(): the same layers, of "
    "the same sizes and dtypes, in the same order (read the sizes from the same files or "
    "flags on every worker, not from the task index)."
)

_HINT = (
    "HINT: every worker must build the same model and fit it with the same epochs and the same "
    "number of batches per epoch: give each worker its shard of one dataset (Keras shards a "
    "tf.data.Dataset by itself), or the same steps_per_epoch."
)


def exchange(key: str, value, names: List[str], me: str, late: Callable) -> list:
    """Writes `value` (JSON) for task `me` under `key` in the coordination service's key-value
    store and returns every task's of `names`, in their order, read within
    TFDIST_STARTUP_TIMEOUT seconds each; `late(name, timeout)` is the error raised for a task
    that did not write its own in time."""
    import tensorflow as tf
    from tensorflow.python.eager import context

    ctx = context.context()
    ctx.set_config_key_value(f"{key}/{me}", json.dumps(value))
    timeout = settings.STARTUP_TIMEOUT.get()
    values = []
    for name in names:
        if name == me:
            values.append(value)
            continue
        waited = 0.0
        while True:
            try:
                values.append(json.loads(ctx.get_config_key_value(f"{key}/{name}", _POLL_MS)))
                break
            except tf.errors.DeadlineExceededError:
                waited += _POLL_MS / 1000
                if waited >= timeout:
                    raise late(name, timeout) from None
    return values


def variable_difference(records: List[list], names: List[str], number: int) -> Optional[str]:
    """What differs between the tasks `names`' records [name, shape, dtype] of the variable
    `number` they make (in the same order), or None. A pure function."""
    groups: dict = {}
    for record, name in zip(records, names):
        groups.setdefault((json.dumps(record[1]), record[2]), []).append((name, record[0]))
    if len(groups) < 2:
        return None
    said = [
        f"{made[0][1]} {shape} {dtype} on {_and([task for task, _ in made])}"
        for (shape, dtype), made in groups.items()
    ]
    return (
        f"variable number {number} made in the strategy's scope is "
        + ", ".join(said[:-1])
        + f", but {said[-1]}"
    )


def _and(names: List[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def check_variable(names: List[str], me: str, number: int, record: list) -> None:
    """Before task `me` of the multi_worker_mirrored workers `names` makes variable `number`
    (from 1, counted in its strategy), whose [name, shape, dtype] is `record`: the same on
    every worker, or a ValueError naming the workers and the shapes; a worker that does not
    make that variable within TFDIST_STARTUP_TIMEOUT seconds is named in a RuntimeError."""
    records = exchange(
        f"{_VARIABLES}/{number}",
        record,
        names,
        me,
        lambda name, timeout: RuntimeError(
            f"{name} did not make variable number {number} in the strategy's scope "
            f"({record[0]} {record[1]} {record[2]} on {me}) within {timeout:g} s "
            f"(TFDIST_STARTUP_TIMEOUT): it builds a model with fewer variables, or does "
            f"something else. {_MODEL_HINT} Look at the output of {name} for where it is."
        ),
    )
    found = variable_difference(records, names, number)
    if found:
        raise ValueError(
            "The workers of this multi_worker_mirrored job build different models, so their "
            f"variables cannot start from the chief's values: {found}. Seen on {me}, before "
            f"the broadcast of that variable. {_MODEL_HINT}"
        )


def _multi_worker(model) -> bool:
    """Whether `model` was made in the scope of a strategy over several workers."""
    strategy = getattr(model, "_distribute_strategy", None) or getattr(
        model, "distribute_strategy", None
    )
    in_multi_worker = getattr(getattr(strategy, "extended", None), "_in_multi_worker_mode", None)
    return bool(in_multi_worker is not None and in_multi_worker())


def _check(callbacks) -> None:
    here = task.current()
    cluster = here.cluster
    if here.strategy != "multi_worker_mirrored" or cluster.num_workers < 2:
        return
    names = (["chief:0"] if cluster.has_chief else []) + [
        f"worker:{i}" for i in range(cluster.num_workers - cluster.has_chief)
    ]
    me = cluster.task
    if me not in names:
        return  # an evaluator: it trains nothing with the others
    if not _multi_worker(getattr(callbacks, "model", None)):
        return  # a model of no strategy (one device, e.g. a reference on the chief)
    plan = Plan.of(callbacks)
    if plan is None:
        return
    with _LOCK:
        _STATE["fits"] += 1
        fit = _STATE["fits"]
    plans = exchange(
        f"{_PREFIX}/{fit}",
        plan,
        names,
        me,
        lambda name, timeout: RuntimeError(
            f"{name} did not start fit number {fit} of this job within {timeout:g} s of {me} "
            f"(TFDIST_STARTUP_TIMEOUT). HINT: every worker must call fit as often as the "
            f"others; look at the output of {name} for where it is."
        ),
    )
    found = difference(plans, names)
    if found:
        raise ValueError(
            "The workers of this multi_worker_mirrored job do not train the same thing, so "
            f"their collectives cannot agree: {found}. Seen on {me}, before the first step of "
            f"fit number {fit}. {_HINT}"
        )


def install() -> bool:
    """Checks the workers' plans at the start of every fit in this process (Keras 3 or
    tf_keras); returns True once installed."""
    with _LOCK:
        if _STATE["installed"]:
            return True
        _STATE["installed"] = True
    callback_list = flavour.keras().callbacks.CallbackList
    begin = callback_list.on_train_begin

    def on_train_begin(self, logs=None):
        result = begin(self, logs)
        _check(self)
        return result

    callback_list.on_train_begin = on_train_begin
    return True
