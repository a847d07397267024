"""Starting a job's Python tasks from a process that has already imported TensorFlow.

Importing TensorFlow costs several seconds of CPU in every process, which is most of what a
short task (a test's 2-worker job, a strategy pool, a restart) spends. A preloader is a
process that imports TensorFlow once and then forks one child per task; the child becomes the
task's Python program (`python script.py ...` or `python -m module ...`) with the task's own
environment, working directory, standard streams and network namespace.

The launcher still supervises an ordinary process per task: a small client (this file, run as
a script: it imports the standard library only) that hands its request and its standard
streams to the preloader, then stands for the task. Its exit code is the task's; a signal it
receives (SIGTERM, SIGINT, ...) is passed on to the task; when the client dies, even by SIGKILL,
the task kills itself at once (it watches the client's connection), and when the preloader
dies, its tasks die with it (PR_SET_DEATHSIG). The preloader ends when its owner closes its
standard input or dies.

What a forked task shares with the preloader is what `import tensorflow` did: the modules, and
the environment they read at import. A task whose environment differs there (TF_* other than
TF_CONFIG, KERAS_*, PYTHON* other than PYTHONPATH / PYTHONUNBUFFERED, thread and allocator
settings...) gets a preloader of its own (`Preloader.key`). Python's random generators and
numpy's are seeded anew in each task; the str hash seed is the preloader's (a fresh process
draws its own).

Used by `tfdist.testing.run_cluster` and the strategy pools, where TFDIST_PRELOAD (default on)
turns it off; `tfdist launch` starts its tasks as fresh processes. Linux only (fork, SCM_RIGHTS,
/proc); elsewhere `available()` is False and tasks start as fresh processes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading

__all__ = [
    "Preloader",
    "available",
    "close_all",
    "die_with_parent",
    "forkable",
    "key",
    "task_argv",
]

# Environment variables a task may set differently from its preloader: none of them is read
# while TensorFlow is imported. Any other difference in a variable with one of the IMPORT
# prefixes gets the task a preloader of its own.
_IMPORT_PREFIXES = (
    "TF_",
    "KERAS_",
    "XLA_",
    "CUDA_",
    "NCCL_",
    "OMP_",
    "MKL_",
    "KMP_",
    "OPENBLAS_",
    "GOTO",
    "LD_",
    "MALLOC",
    "GRPC_",
    "PYTHON",
    "CC_",
)
_PER_TASK = ("TF_CONFIG", "PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONFAULTHANDLER")
_LEN = struct.Struct("!I")
_PR_SET_PDEATHSIG = 1
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000


def available() -> bool:
    """True where tasks can be forked from a preloader (Linux, with SCM_RIGHTS)."""
    return (
        sys.platform.startswith("linux")
        and hasattr(socket, "send_fds")
        and hasattr(os, "register_at_fork")
    )


def key(env) -> tuple:
    """What a task's environment must share with its preloader: the variables read at import."""
    return tuple(
        sorted(
            (k, v) for k, v in env.items() if k.startswith(_IMPORT_PREFIXES) and k not in _PER_TASK
        )
    )


def forkable(argv) -> bool:
    """True for `python script.py ...` and `python -m module ...` with this interpreter."""
    return (
        len(argv) >= 2
        and argv[0] == sys.executable
        and (argv[1] == "-m" and len(argv) >= 3 or not argv[1].startswith("-"))
    )


class Preloader:
    """A process that has imported TensorFlow and forks tasks on request; `wrap` makes the
    command line of a task's client. Close it (or let its owner exit) to end it and its tasks.
    """

    def __init__(self, env, timeout: float = 300.0):
        self.key = key(env)
        self._dir = tempfile.mkdtemp(prefix="tfdist-preload-")
        self.address = os.path.join(self._dir, "socket")
        base = {k: v for k, v in os.environ.items() if not k.startswith(_IMPORT_PREFIXES)}
        base.update(self.key)  # the tasks' own PYTHONPATH is theirs: this imports only TF
        if "PYTHONPATH" in os.environ:
            base["PYTHONPATH"] = os.environ["PYTHONPATH"]
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "serve", self.address],
            env=base,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            text=True,
            errors="replace",
        )
        self._ready = threading.Event()
        self._started = False
        self.output = []
        threading.Thread(target=self._read, daemon=True).start()
        if not (self._ready.wait(timeout) and self._started):
            self.close()
            raise RuntimeError(
                "tfdist's preloader did not start (it imports TensorFlow once for every task):\n"
                + "\n".join(self.output[-20:])
                + "\nHINT: TFDIST_PRELOAD=0 starts every task as a fresh process."
            )

    def _read(self):
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            if line == "tfdist-preload ready":
                self._started = True
                self._ready.set()
            else:
                self.output.append(line)  # TensorFlow's import noise, kept for errors
        self._ready.set()

    def running(self) -> bool:
        return self.proc.poll() is None

    def wrap(self, argv) -> list:
        """The command line of a client that runs `argv` forked from this preloader."""
        client = [sys.executable, "-I", "-S", os.path.abspath(__file__), "run", self.address]
        return [*client, "--", *argv]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()  # the preloader kills its tasks and exits
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        try:
            os.unlink(self.address)
        except OSError:
            pass
        try:
            os.rmdir(self._dir)
        except OSError:
            pass


_SHARED = {}  # key -> Preloader: this process's preloaders
_LOCK = threading.Lock()


def task_argv(argv, env) -> list:
    """`argv` as a task with environment `env` is started: the command line of a client of
    this process's preloader for that environment (started on first use), or `argv` itself
    where the task cannot be forked (another interpreter, Python options, not Linux).

    Raises:
        RuntimeError: the preloader did not start (its output and the way out in the text).
    """
    if not (available() and forkable(argv)):
        return list(argv)
    wanted = key(env)
    with _LOCK:
        preloader = _SHARED.get(wanted)
        if preloader is None or not preloader.running():
            if not _SHARED:
                import atexit

                atexit.register(close_all)
            preloader = _SHARED[wanted] = Preloader(env)
    return preloader.wrap(argv)


def close_all() -> None:
    """Ends this process's preloaders (and any task still running from them)."""
    with _LOCK:
        preloaders = list(_SHARED.values())
        _SHARED.clear()
    for preloader in preloaders:
        preloader.close()


# ------------------------------------------------------------------ the preloader process
def die_with_parent() -> None:
    """Asks Linux to SIGKILL this process when its parent ends, even by `kill -9` (a no-op
    where prctl is missing)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:
        pass


def _recv_exact(conn, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _serve(address: str) -> int:
    parent = os.getppid()
    die_with_parent()
    if os.getppid() != parent:
        return 1
    import selectors

    del sys.path[0]  # this file's folder: the tasks import nothing from it
    import tensorflow  # noqa: F401  (what every task would import first)

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(address)
    server.listen(64)
    print("tfdist-preload ready", flush=True)
    children = {}  # pid -> the client's connection
    selector = selectors.DefaultSelector()
    selector.register(server, selectors.EVENT_READ)
    selector.register(sys.stdin, selectors.EVENT_READ)
    try:
        while True:
            for item, _ in selector.select(timeout=0.05):
                if item.fileobj is sys.stdin:
                    if not os.read(sys.stdin.fileno(), 4096):
                        return 0  # the owner closed the pipe, or died
                    continue
                conn, _ = server.accept()
                try:
                    pid = _fork_task(conn, [server, *children.values()])
                except (EOFError, OSError, ValueError):
                    conn.close()
                    continue
                children[pid] = conn
            while children:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                conn = children.pop(pid, None)
                if conn is not None:
                    try:
                        conn.sendall(json.dumps({"status": status}).encode() + b"\n")
                    except OSError:
                        pass
                    conn.close()
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _fork_task(conn, others) -> int:
    head, fds, _, _ = socket.recv_fds(conn, _LEN.size, 3)
    (size,) = _LEN.unpack(head)
    request = json.loads(_recv_exact(conn, size))
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the task
        try:
            for other in others:  # the task holds only its own connection
                other.close()
            die_with_parent()
            _become_task(conn, fds, request)
        except BaseException:  # never return into the preloader's loop
            import traceback

            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
    for fd in fds:
        os.close(fd)
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    return pid


def _join_namespaces(client: int) -> None:
    """Joins the client's user and network namespaces where they are not this process's."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for kind, flag in (("user", _CLONE_NEWUSER), ("net", _CLONE_NEWNET)):
        theirs, ours = f"/proc/{client}/ns/{kind}", f"/proc/self/ns/{kind}"
        if os.stat(theirs).st_ino == os.stat(ours).st_ino:
            continue
        fd = os.open(theirs, os.O_RDONLY)
        try:
            if libc.setns(fd, flag) != 0:
                code = ctypes.get_errno()
                raise OSError(code, f"setns({kind}): {os.strerror(code)}")
        finally:
            os.close(fd)


def _watch_client(conn) -> None:
    """Kills this task as soon as its client's connection closes (the client died)."""

    def watch():
        try:
            while conn.recv(1):
                pass
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True).start()


def _become_task(conn, fds, request) -> None:
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL if sig != signal.SIGINT else signal.default_int_handler)
    _join_namespaces(request["client"])
    _watch_client(conn)
    _reseed()
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True, write_through=unbuffered)
    argv = request["argv"][1:]
    sys.argv = argv[1:] if argv[0] == "-m" else argv
    entries = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base = [p for p in sys.path[1:] if p not in entries]
    first = os.getcwd() if argv[0] == "-m" else os.path.dirname(os.path.abspath(argv[0]))
    sys.path[:] = [first, *entries, *base]
    import importlib

    importlib.invalidate_caches()
    _site_customize()
    code = _run(argv)
    _finalize()
    os._exit(code)


def _finalize() -> None:
    """What the interpreter does at exit: wait for non-daemon threads, run atexit functions."""
    import atexit

    try:
        threading._shutdown()
    except Exception:
        pass
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass


def _reseed() -> None:
    import random

    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _site_customize() -> None:
    """Runs a sitecustomize found on the task's own path, as Python's start-up would."""
    import importlib.machinery
    import importlib.util

    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{err}", file=sys.stderr)


def _run(argv) -> int:
    import runpy

    try:
        if argv[0] == "-m":
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as exit:
        code = exit.code
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
        code = code or 0
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    return code


# ------------------------------------------------------------------ the client
def _client(address: str, argv) -> int:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(address)
    except OSError as err:
        sys.stderr.write(f"tfdist: the preloader at {address} is gone ({err}).\n")
        return 1
    body = json.dumps(
        {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "client": os.getpid()}
    ).encode()
    socket.send_fds(conn, [_LEN.pack(len(body))], [0, 1, 2])
    conn.sendall(body)
    reader = conn.makefile("rb")
    pid = None
    pending = []

    def forward(signum, frame):
        if pid is None:
            pending.append(signum)
        else:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    for line in reader:
        message = json.loads(line)
        if "pid" in message:
            pid = message["pid"]
            for signum in pending:
                forward(signum, None)
        elif "status" in message:
            status = message["status"]
            if os.WIFSIGNALED(status):
                sig = os.WTERMSIG(status)
                if sig not in (signal.SIGKILL, signal.SIGSTOP):
                    signal.signal(sig, signal.SIG_DFL)
                os.kill(os.getpid(), sig)  # end as the task did
            return os.WEXITSTATUS(status)
    sys.stderr.write("tfdist: the preloader ended before the task did.\n")
    return 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"] and len(sys.argv) == 3:
        sys.exit(_serve(sys.argv[2]))
    if sys.argv[1:2] == ["run"] and sys.argv[3:4] == ["--"] and len(sys.argv) > 4:
        sys.exit(_client(sys.argv[2], sys.argv[4:]))
    sys.exit("usage: preload.py serve ADDRESS | run ADDRESS -- PYTHON ARGS ...")
