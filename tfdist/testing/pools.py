"""Strategy pools: long-lived local processes that hold strategies and run functions under them.

Starting a TensorFlow process costs seconds on a small machine, and a multi-worker job more. A
pool starts its processes once (`tfdist.launcher.job`, in a private network namespace where the
system allows it) and then runs any number of calls, each a module-level function called with
the pool's strategy (`strategy_server`). `assert_same_training` and the `tfdist_strategies`
pytest marker share the pools of a process (`pool_for`); `close_pools` ends them (at exit, or
when pytest ends).

The pools (`strategy_server.POOL_KINDS`; a strategy's record names the one that serves it:
`Strategy.pool` of `tfdist.strategy.registry`; `STRATEGIES` are the strategies some pool
serves):

    local             one process with `replicas` virtual CPUs, and no cluster
    workers           `workers` processes of a local job, each a worker (its TF_CONFIG)
    parameter_server  one process: a chief, with one worker and one ps as in-process servers

Every wait is bounded: start-up by `START_TIMEOUT`, each call by its timeout. A call that fails
in one task of a multi-worker pool, or times out, ends the pool (its peers may wait in a
collective forever); the next call starts a fresh one. Nothing here imports TensorFlow.

The processes connect back over a Unix socket and prove they hold the pool's key; a client that
does not (a wrong key, junk bytes, silence) is refused and logged, and the pool goes on waiting
for its own. A pool's process dies with the process that started the pool, even by `kill -9`
and while it is blocked in an import or a C++ call (`strategy_server`: PR_SET_PDEATHSIG and a
watchdog of the owner; the preloaders it forks from are started by one thread that lives as
long as this process, since the kernel's parent-death signal follows the *thread* that
started a process). Pools do not nest: a pool's own process refuses to start one
(`refuse_inside_a_pool`), as a file that calls `assert_same_training` at module level, without
an `if __name__ == "__main__":` guard, would otherwise make every process that imports it
start pools of its own.
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import dataclasses
import logging
import os
import queue
import shutil
import socket
import struct
import tempfile
import threading
import time
import warnings
from multiprocessing import connection as mp_connection
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from tfdist import settings
from tfdist.launcher import preload as preloading
from tfdist.launcher.job import plan_job, run_job
from tfdist.launcher.run_function import child_pythonpath
from tfdist.strategy import registry
from tfdist.testing.strategy_server import POOL_KINDS, refuse_inside_a_pool

__all__ = [
    "STRATEGIES",
    "PoolError",
    "Reply",
    "StrategyPool",
    "close_pools",
    "pool_for",
    "refuse_inside_a_pool",
]

log = logging.getLogger("tfdist")

STRATEGIES = registry.POOLED
POOLS = {name: registry.STRATEGIES[name].pool for name in STRATEGIES}  # strategy -> its pool
START_TIMEOUT = 180.0  # seconds for a pool's processes to start and connect
PEER_GRACE = 10.0  # seconds the other tasks get to answer once one task failed
HANDSHAKE_TIMEOUT = 30.0  # seconds a process that connects gets to prove it holds the key


class PoolError(AssertionError):
    """A pool's process died, did not start, or a call timed out. Holds the pool's output."""


@dataclasses.dataclass
class Reply:
    """What one task of a pool answered to a call."""

    task: str
    ok: bool
    value: Any = None
    error: str = ""  # "TypeName: message"
    traceback: str = ""
    output: str = ""  # what the call printed


class _Lines:
    """The last lines a pool's tasks printed (run_job writes them here, prefixed with the task)."""

    def __init__(self, keep: int = 200):
        self.lines = collections.deque(maxlen=keep)

    def write(self, text: str) -> None:
        for line in text.splitlines():
            if not line.strip():
                continue
            if line.startswith("[tfdist] WARNING: "):  # run_job's own (once a process)
                warnings.warn(line[len("[tfdist] ") :], RuntimeWarning, stacklevel=2)
            self.lines.append(line)

    def flush(self) -> None:
        pass

    def tail(self, n: int = 40) -> str:
        return "\n".join(list(self.lines)[-n:])


# ----------------------------------------------- the thread that starts the preloaders
# Linux sends a process's parent-death signal (PR_SET_PDEATHSIG, which every preloader
# sets) when the *thread* that started it ends. A preloader started by a pool's job
# thread would die when that pool closes, and take the other pools' processes forked from
# it along: they are started by this thread instead, which lives as long as the process.
_STARTER: Dict[str, Any] = {"pid": None, "queue": None}
_STARTER_LOCK = threading.Lock()


def _starter_loop(requests: "queue.Queue") -> None:
    while True:
        future, fn, args = requests.get()
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(*args))
            except BaseException as err:  # the caller's to raise
                future.set_exception(err)


def _in_the_starter(fn, *args) -> "concurrent.futures.Future":
    """`fn(*args)` run by this process's long-lived starter thread."""
    with _STARTER_LOCK:
        if _STARTER["pid"] != os.getpid():  # none yet, or a forked copy of this process
            requests: "queue.Queue" = queue.Queue()
            threading.Thread(
                target=_starter_loop, args=(requests,), daemon=True, name="tfdist-pool-starter"
            ).start()
            _STARTER.update(pid=os.getpid(), queue=requests)
        future: "concurrent.futures.Future" = concurrent.futures.Future()
        _STARTER["queue"].put((future, fn, args))
    return future


def _start_preloaders(plans) -> Optional["concurrent.futures.Future"]:
    """Starts, in the starter thread, the preloaders `run_job` will fork the plans' tasks
    from (it finds them running and uses them); None where tasks are not preloaded."""
    if not (settings.PRELOAD.get() and preloading.available()):
        return None
    wanted = {}
    for plan in plans:
        env = {**os.environ, **plan.env}
        wanted.setdefault(preloading.key(env), (plan.argv, env))

    def start_them():
        for argv, env in wanted.values():
            preloading.task_argv(argv, env)

    return _in_the_starter(start_them)


# ------------------------------------------------------------------ the pool's socket
def _set_timeouts(sock: socket.socket, seconds: float) -> None:
    """Bounds (0: unbounds) each blocking read and write on `sock`, at the kernel's level, so
    that a multiprocessing Connection on its descriptor (os.read) is bounded too."""
    whole = int(seconds)
    value = struct.pack("ll", whole, int((seconds - whole) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)


def _authenticate(sock: socket.socket, key: bytes, timeout: float):
    """The Connection of a process that proved it holds `key` and said it is ready (within
    `timeout` seconds), and the task it said it is.

    Raises:
        Exception: anything else (a wrong key, junk, silence, a closed connection).
    """
    sock.setblocking(True)
    _set_timeouts(sock, timeout)
    connection = mp_connection.Connection(sock.detach())
    try:
        mp_connection.deliver_challenge(connection, key)  # as Listener.accept does
        mp_connection.answer_challenge(connection, key)
        message = connection.recv()
        if not (isinstance(message, tuple) and len(message) == 3 and message[0] == "ready"):
            raise ValueError(f"said {message!r} instead of ('ready', pid, task)")
        with socket.socket(fileno=os.dup(connection.fileno())) as same:
            _set_timeouts(same, 0)  # calls wait as long as their own timeout says
    except BaseException:
        connection.close()
        raise
    return connection, message[2]


def _refused(err: BaseException, timeout: float) -> str:
    if isinstance(err, (BlockingIOError, TimeoutError)):
        return f"it did not answer within {timeout:g} s"
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


class _Door:
    """The pool's socket: it keeps the connections of the processes that prove they hold the
    key and say they are ready, and refuses (and logs) any other, each in a thread of its own,
    so that a client that sends junk or nothing delays no one."""

    def __init__(self, address: str, key: bytes, wanted: int, pool: str, lines: _Lines):
        self.address, self.key, self.wanted = address, key, wanted
        self.pool, self.lines = pool, lines
        self.ready: List[Tuple[str, Any]] = []  # (task, its connection)
        self._lock = threading.Lock()
        self._open = threading.Event()
        self._open.set()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(address)
        self._server.listen(64)
        self._server.settimeout(0.1)  # so that the accept loop sees `close` soon
        self._thread = threading.Thread(target=self._accept, daemon=True, name="tfdist-pool-door")
        self._thread.start()

    def complete(self) -> bool:
        with self._lock:
            return len(self.ready) >= self.wanted

    def close(self, tasks: Sequence[str]) -> List[Any]:
        """Stops accepting; returns the ready connections (the caller's to close), in the
        order of `tasks`."""
        self._open.clear()
        self._thread.join(timeout=5)
        self._server.close()
        with self._lock:
            ready, self.ready = self.ready, []
        order = {task: i for i, task in enumerate(tasks)}
        ready.sort(key=lambda item: order.get(item[0], len(order)))
        return [connection for _, connection in ready]

    def _accept(self) -> None:
        while self._open.is_set():
            try:
                sock, _ = self._server.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self._handshake, args=(sock,), daemon=True).start()

    def _handshake(self, sock: socket.socket) -> None:
        try:
            connection, task = _authenticate(sock, self.key, HANDSHAKE_TIMEOUT)
        except Exception as err:  # not one of the pool's processes: refused, the pool waits on
            why = _refused(err, HANDSHAKE_TIMEOUT)
            log.warning(
                "The %s strategy pool refused a connection to %s: %s", self.pool, self.address, why
            )
            self.lines.write(f"[pool] refused a connection to its socket: {why}")
            return
        with self._lock:
            if self._open.is_set() and len(self.ready) < self.wanted:
                self.ready.append((task, connection))
                return
        connection.close()


def check_strategies(strategies: Sequence[str], what: str = "strategies") -> Tuple[str, ...]:
    """The names, checked: a clear error for an unknown or repeated one."""
    if isinstance(strategies, str):
        strategies = (strategies,)
    names = tuple(strategies)
    unknown = [name for name in names if name not in STRATEGIES]
    if unknown or not names or len(set(names)) != len(names):
        raise ValueError(
            f"{what}={list(names)!r} is not a list of distinct strategy names. HINT: choose from "
            f"{list(STRATEGIES)}."
        )
    return names


class StrategyPool:
    """The processes of one pool (see the module's docstring). Thread-safe; one call at a time."""

    def __init__(
        self,
        pool: str,
        *,
        replicas: int = 2,
        workers: int = 2,
        env: Optional[Mapping[str, str]] = None,
    ):
        self.pool = pool
        self.replicas = replicas
        self.tasks = workers if POOL_KINDS[pool].processes == "workers" else 1
        self.env = dict(env or {})
        self._lock = threading.Lock()
        self._connections: List[Any] = []
        self._names: List[str] = []
        self._job: Optional[threading.Thread] = None
        self._closing = False
        self._lines = _Lines()
        self._directory: Optional[str] = None
        self._result = None
        self._error: Optional[BaseException] = None  # what run_job raised, if it did

    # ------------------------------------------------------------------ start and stop

    @property
    def running(self) -> bool:
        return bool(self._connections) and self._job is not None and self._job.is_alive()

    def _plans(self, address: str, key: str):
        extra = {"PYTHONPATH": child_pythonpath(), settings.POOL_KEY.name: key}
        extra.update(self.env)
        plans = plan_job(
            "tfdist.testing.strategy_server",
            [self.pool, address, str(self.replicas), str(os.getpid())],
            workers=self.tasks,
            module=True,
            extra_env=extra,
        )
        if POOL_KINDS[self.pool].processes == "workers":
            return plans
        # one process that makes its own cluster (or none): no TF_CONFIG to confuse it
        return [
            dataclasses.replace(plan, env={k: v for k, v in plan.env.items() if k != "TF_CONFIG"})
            for plan in plans
        ]

    def start(self) -> None:
        """Starts the processes and waits (bounded) until each has connected.

        Raises:
            PoolError: a process ended, or they did not all connect within `START_TIMEOUT`
                seconds (with the pool's last output).
            RuntimeError: called in a pool's own process (`refuse_inside_a_pool`).
        """
        refuse_inside_a_pool("StrategyPool.start")
        deadline = time.monotonic() + START_TIMEOUT
        self._closing = False
        self._lines = _Lines()
        self._result = self._error = None
        self._directory = tempfile.mkdtemp(prefix="tfdist-pool-")
        address = os.path.join(self._directory, "pool.sock")
        key = os.urandom(16)
        plans = self._plans(address, key.hex())
        self._names = [plan.task for plan in plans]
        door = _Door(address, key, len(plans), self.pool, self._lines)
        try:
            self._wait_for_preloaders(plans, deadline)
            self._job = threading.Thread(
                target=self._run, args=(plans,), daemon=True, name=f"tfdist-pool-{self.pool}"
            )
            self._job.start()
            while not door.complete():
                if not self._job.is_alive():
                    raise PoolError(self._describe("ended while starting")) from self._error
                if time.monotonic() > deadline:
                    raise PoolError(self._describe(f"did not start in {START_TIMEOUT:g} s"))
                time.sleep(0.05)
        except BaseException:
            self._connections = door.close(self._names)  # closed by close(), as the processes
            self.close()
            raise
        self._connections = door.close(self._names)  # in task order, as `_names`

    def _wait_for_preloaders(self, plans, deadline: float) -> None:
        started = _start_preloaders(plans)
        if started is None:
            return
        try:
            started.result(timeout=max(0.0, deadline - time.monotonic()))
        except concurrent.futures.TimeoutError:
            raise PoolError(self._describe(f"did not start in {START_TIMEOUT:g} s")) from None

    def _run(self, plans) -> None:
        try:
            self._result = run_job(
                plans,
                out=self._lines,  # every task's lines but TensorFlow's noise, for errors
                grace=3.0,
                stop_when=lambda: "closed" if self._closing else None,
                preload=settings.PRELOAD.get(),
            )
        except BaseException as err:  # start's error to raise, not a thread's traceback
            self._error = err

    def ensure_started(self) -> None:
        """Starts the processes unless they run."""
        with self._lock:
            if not self.running:
                self.close()
                self.start()

    def close(self) -> None:
        """Stops the processes (SIGTERM, then SIGKILL); the next call starts them again."""
        for connection in self._connections:
            try:
                connection.send(("stop",))
            except OSError:
                pass
        self._closing = True
        if self._job is not None:
            self._job.join(timeout=30)
        for connection in self._connections:
            connection.close()
        self._connections = []
        self._job = None
        if self._directory:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None

    def _describe(self, what: str) -> str:
        reason = f" ({self._result.reason})" if self._result is not None else ""
        if self._error is not None:
            reason += f" ({type(self._error).__name__}: {self._error})"
        output = self._lines.tail() or "(none)"
        return (
            f"The {self.pool} strategy pool ({', '.join(self._names)}) {what}{reason}. "
            f"Its last output:\n{output}"
        )

    # ------------------------------------------------------------------------- calls

    def call(
        self,
        strategy: str,
        reference: Tuple[str, str, str],
        args: Sequence = (),
        kwargs: Optional[Mapping] = None,
        *,
        strategy_kwarg: Optional[str] = None,
        timeout: float = 300.0,
    ) -> List[Reply]:
        """Runs the function `reference` (module, qualname, source file) under `strategy` in
        every task of the pool; returns each task's Reply, in task order.

        Raises:
            PoolError: a task died, or the call did not end within `timeout` seconds.
        """
        self.ensure_started()
        with self._lock:
            request = ("call", strategy, tuple(reference), tuple(args), dict(kwargs or {}))
            request += (strategy_kwarg,)
            for connection in self._connections:
                connection.send(request)
            try:
                replies = self._wait(timeout)
            except BaseException:
                self.close()
                raise
            if self.tasks > 1 and not all(reply.ok for reply in replies):
                self.close()  # peers of a failed call may be out of step
            return replies

    def _wait(self, timeout: float) -> List[Reply]:
        answers: Dict[int, tuple] = {}
        deadline = time.monotonic() + timeout
        failed_at = None
        while len(answers) < len(self._connections):
            for i, connection in enumerate(self._connections):
                if i in answers or not connection.poll(0.02):
                    continue
                try:
                    answers[i] = connection.recv()
                except (EOFError, OSError):
                    raise PoolError(self._describe(f"lost {self._names[i]}")) from None
                if answers[i][0] != "ok" and failed_at is None:
                    failed_at = time.monotonic()
            now = time.monotonic()
            if failed_at is not None and now > failed_at + PEER_GRACE:
                for i in range(len(self._names)):  # still waiting for a failed peer
                    answers.setdefault(i, ("error", "stopped: a peer task failed first", "", ""))
                break
            if now > deadline:
                raise PoolError(self._describe(f"did not answer a call in {timeout:g} s"))
            if not self._job.is_alive():
                raise PoolError(self._describe("ended during a call"))
        return [_reply(self._names[i], answers[i]) for i in range(len(self._connections))]


def _reply(task: str, answer: tuple) -> Reply:
    if answer[0] == "ok":
        return Reply(task, True, value=answer[1], output=answer[2])
    _, error, trace, output = answer
    return Reply(task, False, error=error, traceback=trace, output=output)


_POOLS: Dict[tuple, StrategyPool] = {}
_POOLS_LOCK = threading.Lock()


def pool_for(
    strategy: str, *, replicas: int = 2, workers: int = 2, env: Optional[Mapping[str, str]] = None
) -> StrategyPool:
    """The shared pool that serves `strategy` with these settings (made, not started, once).

    Raises:
        RuntimeError: called in a pool's own process (`refuse_inside_a_pool`).
    """
    refuse_inside_a_pool("pool_for")
    (strategy,) = check_strategies((strategy,), "strategy")
    pool = POOLS[strategy]
    key = (pool, replicas, workers if POOL_KINDS[pool].processes == "workers" else 0)
    key += (tuple(sorted((env or {}).items())),)
    with _POOLS_LOCK:
        if key not in _POOLS:
            _POOLS[key] = StrategyPool(pool, replicas=replicas, workers=workers, env=env)
        return _POOLS[key]


def close_pools() -> None:
    """Ends every shared pool's processes."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        pool.close()


atexit.register(close_pools)
