"""Waiting for the peers of a job: bounded, ended at once by SIGTERM or SIGINT, and naming the
tasks that never came.

TensorFlow's own waits cannot give this. Building a MultiWorkerMirroredStrategy runs
`TFE_EnableCollectiveOps`, which holds the GIL for the whole wait (no Python code, no Python
signal handler runs until it returns) and, before it waits, installs a C++ SIGTERM handler (the
coordination service's preemption notifier, preemption_notifier.cc: "SIGTERM caught") that only
logs the signal: a waiting task ignored SIGTERM. Its coordination leader waits for the other
tasks in a device barrier of one hour whatever the registration timeout, and its errors name
only the task it called. The chief of a parameter-server job waits, without a limit, for every
worker and ps.

So tfdist waits first, in Python: `wait_for_peers` probes each peer's address (a TCP connect)
until every one has answered once, while this task answers the same probes on its own port (a
plain listening socket, closed before TensorFlow binds the port). Then TensorFlow's wait is
short. It gives up after `startup_timeout` seconds with a RuntimeError naming the tasks that
never answered, and SIGTERM or SIGINT end it at once with a message (`interruptible`).

`interruptible` also guards waits inside TensorFlow that release the GIL (the exit barrier's
collective): a watchdog thread reads the signals from Python's wakeup descriptor.
Imports nothing of TensorFlow.
"""

from __future__ import annotations

import contextlib
import select
import signal
import socket
import sys
import threading
import time
from typing import Callable, Dict, Iterator, Optional, Sequence, Tuple

from tfdist import settings, signals
from tfdist.cluster import ClusterSpec

__all__ = ["answers", "guarded", "interruptible", "wait_for_peers"]

PROBE_SECONDS = 1.0  # one connection attempt
ROUND_SECONDS = 0.25  # between rounds of probes
NOTICE_SECONDS = 10.0  # after this long, say once what the task waits for


def _split(address: str) -> Tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def answers(address: str, timeout: float) -> bool:
    """True when something accepts a TCP connection at `address` ("host:port")."""
    try:
        host, port = _split(address)
        with socket.create_connection((host, port), timeout=max(timeout, 0.05)):
            return True
    except (OSError, ValueError):
        return False


def _listen(address: str) -> Optional[socket.socket]:
    """A listening socket on the port of `address`, on every interface (as TensorFlow's server
    will be), so that peers see this task before its server starts; None if the port is taken
    (TensorFlow then reports it)."""
    try:
        _, port = _split(address)
    except ValueError:
        return None
    for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind((host, port))
            sock.listen(64)
            sock.setblocking(False)
            return sock
        except OSError:
            sock.close()
    return None


def _drain(listener: Optional[socket.socket]) -> None:
    while listener is not None:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        conn.close()


def _names(missing: Dict[str, str]) -> str:
    return ", ".join(f"{task} ({address})" for task, address in missing.items()) or "none"


def wait_for_peers(
    cluster: ClusterSpec,
    peers: Sequence[Tuple[str, int]],
    timeout: float,
    *,
    purpose: str,
    listen: bool = True,
    probe: Callable[[str, float], bool] = answers,
) -> None:
    """Returns once every task in `peers` answered at its address; raises after `timeout` s.

    Args:
        cluster: ClusterSpec. The cluster, with this process's task.
        peers: list of (job, index). The tasks to wait for.
        timeout: float. Seconds before giving up.
        purpose: str. What the peers are needed for, for messages ("form the multi-worker
            cluster").
        listen: bool. Answer the peers' probes on this task's own port meanwhile.

    Raises:
        RuntimeError: some peers never answered; the message names them and their addresses.
    """
    missing = {f"{job}:{index}": cluster.cluster[job][index] for job, index in peers}
    if not missing:
        return
    listener = None
    if listen and cluster.task_type in cluster.cluster:
        listener = _listen(cluster.cluster[cluster.task_type][cluster.task_index])
    started = time.monotonic()
    deadline = started + timeout
    noticed = False
    try:
        with interruptible(cluster.task, f"waited for its peers to {purpose}", missing):
            while True:
                for task, address in list(missing.items()):
                    if probe(address, min(PROBE_SECONDS, deadline - time.monotonic())):
                        del missing[task]
                    _drain(listener)
                if not missing:
                    return
                now = time.monotonic()
                if now >= deadline:
                    break
                if not noticed and now - started >= NOTICE_SECONDS:
                    noticed = True
                    print(
                        f"tfdist: task {cluster.task} waits for its peers to {purpose}; no answer "
                        f"yet from {_names(missing)}. It gives up in {deadline - now:.0f} s.",
                        file=sys.stderr,
                        flush=True,
                    )
                time.sleep(min(ROUND_SECONDS, max(deadline - time.monotonic(), 0)))
    finally:
        if listener is not None:
            _drain(listener)
            listener.close()
    raise RuntimeError(
        f"Task {cluster.task} could not {purpose} {cluster.cluster}: no answer within "
        f"{timeout:g} s from {_names(missing)}. Missing tasks: {', '.join(missing)}. HINT: "
        "start every task of the cluster (each with its own TF_CONFIG), check that the "
        f"addresses are reachable and the ports free, or raise startup_timeout= / "
        f"{settings.STARTUP_TIMEOUT.name}."
    )


# --------------------------------------------------------------------- the guardian

# A separate process, because while TensorFlow waits no Python code of this process runs (the
# GIL is held) and SIGTERM is TensorFlow's. It shares this process's group and stderr: a SIGTERM
# or SIGINT to the group (the launcher's stop, Ctrl-C in a terminal) or the time limit makes it
# say why and SIGKILL this process; this process closing its stdin (done, or dead) dismisses it.
_GUARDIAN = r"""
import os, select, signal, sys
parent, limit, task, doing = os.getppid(), float(sys.argv[1]), sys.argv[2], sys.argv[3]
def stop(why):
    sys.stderr.write(
        f"tfdist: task {task} {why} while TensorFlow {doing}; stopping it (SIGKILL). HINT: start "
        "every task of the job, check that they can reach each other, or raise startup_timeout= "
        "/ TFDIST_STARTUP_TIMEOUT; when the job is being stopped on purpose, nothing is wrong.\n"
    )
    sys.stderr.flush()
    try:
        os.kill(parent, signal.SIGKILL)
    except OSError:
        pass
    os._exit(0)
for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda signum, frame: stop(f"received {signal.Signals(signum).name}"))
print("ready", flush=True)
ready, _, _ = select.select([sys.stdin], [], [], limit)
if not ready:
    stop(f"was still waiting after {limit:g} s")
"""


@contextlib.contextmanager
def guarded(task: Optional[str], doing: str, limit: float) -> Iterator[None]:
    """Bounds a wait inside TensorFlow that holds the GIL and swallows SIGTERM: after `limit`
    seconds, or on SIGTERM / SIGINT to the process group, a guardian process says why and
    kills this one. Without a guardian (it cannot start), the wait is as TensorFlow makes it."""
    try:
        import subprocess

        guardian = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _GUARDIAN, f"{limit:g}", task or "?", doing],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        # its handlers are in place before TensorFlow takes SIGTERM: a stop right now counts
        if select.select([guardian.stdout], [], [], 10)[0]:
            guardian.stdout.readline()
    except OSError:
        guardian = None
    try:
        yield
    finally:
        if guardian is not None:
            guardian.stdin.close()
            guardian.stdout.close()
            try:
                guardian.wait(timeout=10)
            except Exception:  # pylint: disable=broad-except
                guardian.kill()


# ------------------------------------------------------------------------- signals


@contextlib.contextmanager
def interruptible(task: Optional[str], doing: str, missing=None) -> Iterator[None]:
    """While inside: SIGTERM and SIGINT end the process at once, with a message saying what it
    was doing (and the tasks still `missing`, a mapping task -> address, read when the signal
    comes). In Python code (the handler runs) and in TensorFlow waits that release the GIL (a
    watchdog thread reads Python's wakeup descriptor). A no-op outside the main thread, and for
    a signal the program handles (or ignores) itself."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def message(signum: int) -> str:
        still = f"; still missing: {_names(missing)}" if missing else ""
        return (
            f"tfdist: task {task or 'of this process'} received {signal.Signals(signum).name} "
            f"while it {doing}{still}. Exiting. HINT: start every task of the job; when the job "
            "is being stopped on purpose, nothing is wrong."
        )

    def handler(signum, frame):
        signals.die(signum, message(signum))

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        if signals.is_default(signal.getsignal(sig)):
            previous[sig] = signal.signal(sig, handler)
    watchdog = (
        signals.Watchdog(previous, lambda signum: signals.die(signum, message(signum)))
        if previous
        else None
    )
    try:
        yield
    finally:
        if watchdog is not None:
            watchdog.stop()
        for sig, old in previous.items():
            signal.signal(sig, old)
