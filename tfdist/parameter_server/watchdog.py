"""Lost tasks: probes the ps and worker tasks, and names a lost ps in a TaskUnavailableError.

A ps that dies takes the model's variables with it, and TensorFlow reports it at best as an
UnavailableError naming an address, or not at all (it may wait on for a host that vanished
without closing its sockets). tfdist probes the ps tasks (a TCP connection to each) on any
TensorFlow error (`naming_lost_tasks`), and the runner probes them every WATCHDOG_SECONDS
while it waits for scheduled groups; a lost ps ends fit / evaluate with a TaskUnavailableError
naming it, and the job must be restarted from its last checkpoint.

TensorFlow is imported inside functions only. Holds no state; opens and closes TCP connections
to the cluster's tasks.
"""

from __future__ import annotations

import contextlib
import time

from tfdist.errors import TaskUnavailableError

# While the coordinator waits for scheduled groups, it checks every WATCHDOG_SECONDS that the
# ps tasks still accept connections: a lost ps ends training with a TaskUnavailableError
# even where TensorFlow would wait on (a host that vanished without closing its sockets).
WATCHDOG_SECONDS = 5.0
PROBE_TIMEOUT_SECONDS = 2.0
LOST_TASK_GRACE_SECONDS = 5.0


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


def unreachable(strategy, jobs=("ps",), timeout: float = PROBE_TIMEOUT_SECONDS) -> list:
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


def lost_ps_error(lost, cause=None) -> TaskUnavailableError:
    """The TaskUnavailableError for the lost ps tasks `lost` ([(task, address)]), with what
    TensorFlow said (`cause`), if anything."""
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
def naming_lost_tasks(strategy):
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
        lost = unreachable(strategy)
        if not lost and _names_a_ps(err, strategy):
            deadline = time.monotonic() + LOST_TASK_GRACE_SECONDS
            while not lost and time.monotonic() < deadline:
                time.sleep(0.25)
                lost = unreachable(strategy)
        if not lost:
            raise
        raise lost_ps_error(lost, err) from err


# the former names, which runner.py imports
