"""Child side of a strategy pool (`tfdist.testing.pools`): one long-lived process that holds
strategies and runs functions under them on request.

    python -m tfdist.testing.strategy_server POOL ADDRESS REPLICAS [OWNER]

POOL is one of `POOL_KINDS`: "local" (virtual CPUs, no cluster), "workers" (this process is one
worker of a local job, from TF_CONFIG) or "parameter_server" (a chief with one worker and one ps
as in-process servers). The process sets its pool up; its strategies are those whose record
names the pool (`Strategy.pool` of `tfdist.strategy.registry`), made on the pool's cluster at
start or at first use. It connects to the pool's Unix socket ADDRESS (its key in
TFDIST_POOL_KEY, `tfdist.settings`), says it is ready (its pid and task), then runs each
request `("call", strategy_name, (module, qualname, source), args, kwargs, strategy_kwarg)`:
`fn(strategy, *args, **kwargs)`, or with `strategy_kwarg`, `fn(*args, **kwargs,
**{strategy_kwarg: strategy})`. Before each call Keras' session is cleared and the global
dtype policy reset, so calls do not see each other's models. The reply is `("ok", value,
output)` or `("error", summary, traceback, output)`, where output is what the call printed.

The process dies with its parent and with OWNER (the pid of the process that started the pool),
however they end, `kill -9` included, and even while it is blocked in an import or a C++ call:
first thing, before TensorFlow or any function's module is imported, it asks Linux for SIGKILL
when its parent ends (PR_SET_PDEATHSIG) and starts a watchdog thread that looks for the owner
and the parent every quarter second. It marks itself as a pool's process
(`refuse_inside_a_pool`): a function's file that starts pools at module level, imported
here, fails at once and the call says why, instead of starting pools of its own.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Client
from typing import Any, Callable, List, NamedTuple

from tfdist import settings
from tfdist.strategy import registry


def _local(replicas: int):
    """One process with `replicas` virtual CPUs, and no cluster."""
    import tfdist

    tfdist.virtual_cpus(replicas)
    return tfdist.ClusterSpec({})


def _worker(replicas: int):
    """A worker of a local job: the cluster is TF_CONFIG's (`tfdist.detect_cluster`)."""
    return None


def _parameter_server(replicas: int):
    """A chief, with one worker and one ps as in-process servers."""
    import tfdist
    from tfdist.strategy import start_local_servers

    spec = tfdist.ClusterSpec.local(workers=1, ps=1, chief=True, task_type="chief")
    start_local_servers(spec)
    return spec


class PoolKind(NamedTuple):
    """How the processes of a pool are set up."""

    processes: str  # "workers": the `workers` processes of a local job; "one": one process
    setup: Callable[[int], Any]  # replicas -> the cluster of its strategies (None: TF_CONFIG's)
    at_start: bool  # its strategies are made at start, before any other op (else at first use)


POOL_KINDS = {
    "local": PoolKind("one", _local, False),
    # a multi-worker job connects its peers when its strategy is made: first thing
    "workers": PoolKind("workers", _worker, True),
    "parameter_server": PoolKind("one", _parameter_server, True),
}


def _strategies(pool: str, replicas: int) -> dict:
    """Strategy name -> a function that makes it (called once, on first use)."""
    import tfdist

    if pool not in POOL_KINDS:
        raise ValueError(f"Unknown strategy pool {pool!r}. HINT: one of {', '.join(POOL_KINDS)}.")
    cluster = POOL_KINDS[pool].setup(replicas)
    return {
        name: functools.partial(tfdist.make_strategy, name, cluster=cluster)
        for name, record in registry.STRATEGIES.items()
        if record.pool == pool
    }


def _fresh_keras() -> None:
    from tfdist import flavour

    keras = flavour.keras()
    keras.backend.clear_session()
    keras.mixed_precision.set_global_policy("float32")


def _call(strategies: dict, made: dict, request) -> tuple:
    from tfdist.launcher.run_function import load_function

    _, name, reference, args, kwargs, strategy_kwarg = request
    output = io.StringIO()
    try:
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            if name not in made:
                made[name] = strategies[name]()
            _fresh_keras()
            fn = load_function(*reference)
            if strategy_kwarg:
                value = fn(*args, **kwargs, **{strategy_kwarg: made[name]})
            else:
                value = fn(made[name], *args, **kwargs)
        pickle.dumps(value)  # an unpicklable value is the caller's error, not a lost pool
        return ("ok", value, output.getvalue())
    except BaseException as err:  # everything goes back to the caller
        summary = f"{type(err).__name__}: {err}"
        return ("error", summary, traceback.format_exc(), output.getvalue())


# ------------------------------------------------------------ pools do not nest
_SERVING: List[str] = []  # in a pool's own process (strategy_server): its pool's kind
_TFDIST = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the tfdist package


def serving(pool: str) -> None:
    """Marks this process as a process of a `pool` pool (`main` calls it first)."""
    _SERVING[:] = [pool]


def _module_level_file() -> str:
    """The innermost file outside tfdist that is being imported (its module-level code runs,
    called by importlib), or ""."""
    frame = sys._getframe(1)
    while frame is not None:
        code, caller = frame.f_code, frame.f_back
        name = code.co_filename
        if (
            code.co_name == "<module>"
            and caller is not None
            and caller.f_code.co_filename.startswith("<frozen importlib")
            and not name.startswith("<")
            and not os.path.abspath(name).startswith(_TFDIST + os.sep)
        ):
            return os.path.abspath(name)
        frame = caller
    return ""


def refuse_inside_a_pool(what: str) -> None:
    """Raises RuntimeError in a strategy pool's own process: pools do not nest. A file that
    calls `what` at module level is imported there to find a function (build_model, a test),
    and would start pools of its own, whose processes import it again, and so on.

    Raises:
        RuntimeError: naming the file and the guard it lacks.
    """
    if not _SERVING:
        return
    where = f"a strategy pool's own process (the {_SERVING[0]} pool, pid {os.getpid()})"
    source = _module_level_file()
    if source:
        raise RuntimeError(
            f"{what} was called at module level of {source} in {where}, which imports that file "
            'to find the function it runs: the file has no `if __name__ == "__main__":` '
            "guard, so every strategy process would start pools of its own. HINT: put the call "
            f'under `if __name__ == "__main__":` in {source}, or inside a test function.'
        )
    raise RuntimeError(
        f"{what} was called in {where}, by the function it runs: pools do not nest. HINT: call "
        f"{what} from the test process itself, not from a function run under a strategy."
    )


WATCH_EVERY = 0.25  # seconds between the watchdog's looks at the owner and the parent


def _started(pid: int) -> str:
    """When process `pid` started (its /proc stat's start time), "" when it is gone or a
    zombie; "?" where there is no /proc and it runs."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return "" if fields[0] in ("Z", "X") else fields[19]
    except FileNotFoundError:
        return ""
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return ""
        except PermissionError:
            pass
        return "?"


def die_with_owner(owner: int) -> None:
    """Ends this process (SIGKILL) when its parent or `owner` (0: none) ends: the kernel's
    parent-death signal, which needs nothing of this process, and a watchdog thread for the
    owner, which sits above a preloader or a keeper."""
    from tfdist.launcher.preload import die_with_parent

    parent = os.getppid()
    die_with_parent()
    owner_started = _started(owner) if owner else "-"

    def gone() -> bool:
        return os.getppid() != parent or bool(owner) and _started(owner) != owner_started

    def watch() -> None:
        while not gone():
            time.sleep(WATCH_EVERY)
        os.kill(os.getpid(), signal.SIGKILL)

    if not owner_started:  # the owner ended before this process got here
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=watch, daemon=True, name="tfdist-pool-watchdog").start()


def main(argv) -> int:
    pool, address, replicas = argv[0], argv[1], int(argv[2])
    die_with_owner(int(argv[3]) if len(argv) > 3 else 0)  # first: before any import of weight
    # Run as `python -m`, this module is __main__, and the package's own copy of it (which
    # pools asks, refuse_inside_a_pool) is another module object: both are marked.
    serving(pool)
    importlib.import_module("tfdist.testing.strategy_server").serving(pool)
    strategies = _strategies(pool, replicas)
    made = {}
    if POOL_KINDS[pool].at_start:
        made = {name: make() for name, make in strategies.items()}
    connection = Client(address, family="AF_UNIX", authkey=bytes.fromhex(settings.POOL_KEY.get()))
    connection.send(("ready", os.getpid(), settings.TASK.get()))
    while True:
        try:
            request = connection.recv()
        except (EOFError, OSError):  # the pool is gone
            return 0
        if request[0] == "stop":
            return 0
        connection.send(_call(strategies, made, request))


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown, where TensorFlow's gRPC threads can hang
