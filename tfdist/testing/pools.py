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
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import os
import shutil
import tempfile
import threading
import time
from multiprocessing.connection import Listener
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from tfdist import settings
from tfdist.launcher.job import plan_job, run_job
from tfdist.strategy import registry
from tfdist.testing.clusters import child_pythonpath
from tfdist.testing.strategy_server import POOL_KINDS

__all__ = ["STRATEGIES", "PoolError", "Reply", "StrategyPool", "close_pools", "pool_for"]

STRATEGIES = registry.POOLED
POOLS = {name: registry.STRATEGIES[name].pool for name in STRATEGIES}  # strategy -> its pool
START_TIMEOUT = 180.0  # seconds for a pool's processes to start and connect
PEER_GRACE = 10.0  # seconds the other tasks get to answer once one task failed


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
        self.lines.extend(line for line in text.splitlines() if line.strip())

    def flush(self) -> None:
        pass

    def tail(self, n: int = 40) -> str:
        return "\n".join(list(self.lines)[-n:])


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

    # ------------------------------------------------------------------ start and stop

    @property
    def running(self) -> bool:
        return bool(self._connections) and self._job is not None and self._job.is_alive()

    def _plans(self, address: str, key: str):
        extra = {"PYTHONPATH": child_pythonpath(), settings.POOL_KEY.name: key}
        extra.update(self.env)
        plans = plan_job(
            "tfdist.testing.strategy_server",
            [self.pool, address, str(self.replicas)],
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
        """Starts the processes and waits (bounded) until each has connected."""
        self._closing = False
        self._lines = _Lines()
        self._directory = tempfile.mkdtemp(prefix="tfdist-pool-")
        address = os.path.join(self._directory, "pool.sock")
        key = os.urandom(16)
        listener = Listener(address, family="AF_UNIX", authkey=key)
        plans = self._plans(address, key.hex())
        self._names = [plan.task for plan in plans]
        accepted: List[Any] = []

        def accept():
            for _ in plans:
                try:
                    accepted.append(listener.accept())
                except Exception:  # closed below, or a connection that failed to authenticate
                    return

        def run():
            self._result = run_job(
                plans,
                quiet=True,
                out=self._lines,
                grace=3.0,
                stop_when=lambda: "closed" if self._closing else None,
                preload=settings.PRELOAD.get(),
            )

        threading.Thread(target=accept, daemon=True, name="tfdist-pool-accept").start()
        self._job = threading.Thread(target=run, daemon=True, name=f"tfdist-pool-{self.pool}")
        self._job.start()
        deadline = time.monotonic() + START_TIMEOUT
        try:
            while len(accepted) < len(plans):
                if not self._job.is_alive():
                    raise PoolError(self._describe("ended while starting"))
                if time.monotonic() > deadline:
                    raise PoolError(self._describe(f"did not start in {START_TIMEOUT:g} s"))
                time.sleep(0.05)
            for connection in accepted:
                connection.recv()  # ("ready", pid)
        except BaseException:
            self.close()
            raise
        finally:
            listener.close()
        self._connections = accepted

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
        return (
            f"The {self.pool} strategy pool ({', '.join(self._names)}) {what}{reason}. "
            f"Its last output:\n{self._lines.tail()}"
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
    """The shared pool that serves `strategy` with these settings (made, not started, once)."""
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
