"""A private network namespace for a local job, so that no other host can reach its tasks.

TensorFlow's gRPC server listens on every interface: grpc_server_lib.cc builds its listening
address as "0.0.0.0:" + the task's port, whatever host TF_CONFIG names (every release 2.16-2.21;
ServerDef has no bind address). A local job's tasks, although TF_CONFIG says 127.0.0.1, would
accept connections from any host that reaches the machine. Run in a network namespace of their
own, whose only interface is a loopback device, they reach each other on 127.0.0.1 as before and
nothing outside the namespace reaches them.

How (Linux):

1. `create()` starts a short-lived helper (this file, run as a script) that unshares a network
   namespace (with a user namespace that maps the user to itself, unless it runs as root),
   brings `lo` up and waits. The launcher opens the helper's /proc/PID/ns/{user,net}: the open
   descriptors keep the namespaces alive, and the helper exits.
2. `Namespace.wrap(argv)` starts each task through this file again, which joins both
   namespaces (setns) and execs the task's command line. The task keeps its pid, its process
   group, its environment and its output pipe, so the launcher supervises it as before.

Elsewhere (macOS, containers without user namespaces) `create()` raises `Unavailable`, and the
launcher says once that the job's ports are open to other hosts.

Run as a script (`python -I -S netns.py ...`) this file imports the standard library only.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys

__all__ = ["Namespace", "Unavailable", "create", "is_isolated"]

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_ENTER_FAILED = 126


class Unavailable(OSError):
    """This system cannot give the job a private network namespace; the text says why."""


def _libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _call(name: str, *args) -> None:
    import ctypes

    if _libc()[name](*args) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{name}: {os.strerror(code)}")


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(text)
    except FileNotFoundError:
        if not path.endswith("setgroups"):  # kernels before 3.19 have no setgroups file
            raise


def _loopback_up() -> None:
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(sock, _SIOCGIFFLAGS, request)[:18])[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | _IFF_UP))


def _helper() -> int:
    """Unshares the namespaces, brings lo up, says "ready", waits for stdin to close."""
    uid, gid = os.geteuid(), os.getegid()
    try:
        user = True
        if uid == 0:  # root needs no user namespace (containers may forbid one)
            try:
                _call("unshare", CLONE_NEWNET)
                user = False
            except OSError:
                _call("unshare", CLONE_NEWUSER | CLONE_NEWNET)
        else:
            _call("unshare", CLONE_NEWUSER | CLONE_NEWNET)
        if user:
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
        _loopback_up()
    except OSError as err:
        print(f"error {err.strerror or err}", flush=True)
        return 1
    print("ready user" if user else "ready", flush=True)
    sys.stdin.read()  # until the launcher has opened the namespaces and closes the pipe
    return 0


def _enter(user_fd: int, net_fd: int, argv) -> int:
    """Joins the namespaces, then execs argv (never returns on success)."""
    try:
        if user_fd >= 0:
            _call("setns", user_fd, CLONE_NEWUSER)
        _call("setns", net_fd, CLONE_NEWNET)
        for fd in (user_fd, net_fd):
            if fd >= 0:
                os.close(fd)
        os.execvp(argv[0], argv)
    except OSError as err:
        sys.stderr.write(
            f"tfdist: could not start {argv[0]!r} in the job's private network namespace: "
            f"{err}. HINT: set TFDIST_NETWORK_NAMESPACE=off to run the job without one.\n"
        )
    return _ENTER_FAILED


class Namespace:
    """A private network namespace, held open by two descriptors; `wrap` starts tasks in it."""

    def __init__(self, user_fd: int, net_fd: int):
        self.user_fd, self.net_fd = user_fd, net_fd

    @property
    def fds(self) -> tuple:
        return tuple(fd for fd in (self.user_fd, self.net_fd) if fd >= 0)

    def wrap(self, argv) -> list:
        """The command line that runs `argv` inside the namespace (pass `fds` to Popen)."""
        return [
            sys.executable,
            "-I",
            "-S",
            os.path.abspath(__file__),
            "enter",
            str(self.user_fd),
            str(self.net_fd),
            "--",
            *argv,
        ]

    def close(self) -> None:
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.user_fd = self.net_fd = -1


def create(timeout: float = 20.0) -> Namespace:
    """A new private network namespace with `lo` up, checked by starting a process in it.

    Raises:
        Unavailable: not Linux, or the kernel / container refuses new namespaces.
    """
    if not sys.platform.startswith("linux"):
        raise Unavailable(errno.ENOSYS, f"{sys.platform} has no network namespaces")
    helper = subprocess.Popen(
        [sys.executable, "-I", "-S", os.path.abspath(__file__), "helper"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    fds = []
    try:
        answer = helper.stdout.readline().split()
        if answer[:1] != ["ready"]:
            reason = " ".join(answer[1:]) or "the helper ended without an answer"
            raise Unavailable(errno.EPERM, f"the kernel refused new namespaces ({reason})")
        user = answer[1:] == ["user"]
        try:
            if user:
                fds.append(os.open(f"/proc/{helper.pid}/ns/user", os.O_RDONLY))
            fds.append(os.open(f"/proc/{helper.pid}/ns/net", os.O_RDONLY))
        except OSError as err:
            raise Unavailable(err.errno, f"cannot open the helper's namespaces: {err}") from err
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    finally:
        helper.stdin.close()
        try:
            helper.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            helper.kill()
            helper.wait()
    namespace = Namespace(fds[0] if len(fds) == 2 else -1, fds[-1])
    probe = subprocess.run(
        namespace.wrap([sys.executable, "-I", "-S", "-c", "pass"]),
        pass_fds=namespace.fds,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if probe.returncode != 0:
        namespace.close()
        reason = probe.stderr.strip().splitlines()[-1:] or [f"exit {probe.returncode}"]
        raise Unavailable(errno.EPERM, f"a process cannot join it ({reason[0]})")
    return namespace


def is_isolated() -> bool:
    """True when this process's network has no interface but loopback (a private namespace)."""
    try:
        import socket

        names = [name for _, name in socket.if_nameindex()]
    except (AttributeError, OSError):
        return False
    return bool(names) and all(name == "lo" for name in names)


if __name__ == "__main__":
    if sys.argv[1:2] == ["helper"]:
        sys.exit(_helper())
    if sys.argv[1:2] == ["enter"] and sys.argv[4:5] == ["--"] and len(sys.argv) > 5:
        sys.exit(_enter(int(sys.argv[2]), int(sys.argv[3]), sys.argv[5:]))
    sys.exit("usage: netns.py helper | enter USER_FD NET_FD -- COMMAND ...")
