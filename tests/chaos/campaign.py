"""A fault-injection campaign: real jobs under `tfdist launch`, faults at random steps, every
trial judged.

    python tests/chaos/campaign.py [--trials 100] [--seed 1] [--out DIR] [--faults a,b]
                                   [--only 57,80] [--keep]

Each trial runs tests/chaos/chaos_job.py under `tfdist launch --max-restarts 3 --grace 10`:
multi_worker_mirrored with 2 or 3 workers, or parameter_server with a chief, 2 workers and 1
or 2 ps; Keras 3 or tf_keras. The seeded plan draws each trial's scenario, its shape (the
worker count of multi_worker_mirrored, the ps count of parameter_server), its faults, their
steps and the tasks they hit: the same seed, the same plan. It injects one or two faults
(FAULTS), each once the leading task's optimizer step reached a step drawn at random:

    kill_worker     SIGKILL to a worker other than worker 0
    kill_leader     SIGKILL to worker 0 (multi_worker_mirrored) or the chief
    kill_ps         SIGKILL to a ps
    preempt         SIGTERM to the leader or another worker (they save and exit 143)
    freeze          SIGSTOP to a worker other than worker 0 for FROZEN seconds, longer than
                    the collective timeout (TFDIST_COLLECTIVE_TIMEOUT=8), then SIGCONT
    network_cut     the job's network cut for FROZEN seconds, then restored: the loopback
                    device of the job's private network namespace down (every task's links
                    at once: one task alone cannot be cut off in a namespace they share)
    disk_full       RLIMIT_FSIZE of 4 KiB on the tasks that write the checkpoint data (the
                    leader, or every ps: each writes the shard of its variables): the next
                    save fails
    corrupt_backup  SIGKILL to the launcher, half the data of the newest checkpoint that the
                    backup's state file lists truncated or overwritten, the same command again
    kill_launcher   SIGKILL to the launcher, the same command again

and then judges the trial (`judge`):

- the job ends with exit code 0 (after its restarts), having trained every step;
- multi_worker_mirrored: its final weights equal, exactly, those of an uninterrupted run of the
  same scenario and the same worker count (run once per scenario and shape: `reference`; the
  global batch is split among the workers, so the sums, and the last bits of the weights,
  depend on their count); parameter_server: the optimizer step is EPOCHS * STEPS, each step
  the coordinator counted applied once;
- no process of the trial outlives it (any process whose environment has its CHAOS_TRIAL);
- nothing is left in its TMPDIR (the launcher's report folder, scratch checkpoints, ...);
- a corrupt newest backup was reported in one warning naming it, and the first start of
  training after it resumed at the optimizer step of the backup before it (the step the job
  restored, OUT/starts.log; the state file's "previous"), never from scratch;
- each fault was recovered from within RECOVERY_BOUND seconds: a restart trained past the step
  training had reached (or, for a freeze or a network cut, which a job may ride out, training
  went on after it); a frozen worker too, and every task the job's output names as having
  "stopped sending heartbeats" after a freeze is the frozen one (a job that stops after a
  freeze must name it).

A trial whose whole job ended before one of its faults could be injected (on a host slow
enough that the campaign sees the step only after the job's last) tested nothing: it is run
again, the same faults at the same steps, at most MAX_LATE times, and counts as not survived
after that. `--only 57,80` runs chosen trials of the seeded plan again.

A fault that could not be injected is recorded as "not injected: <why>" and counted nowhere:
a network cut where the job has no private network namespace (TFDIST_NETWORK_NAMESPACE=off,
or a system that refuses them) or it cannot be entered (it needs nsenter, ip and root, or
the launcher's user namespace); a corrupt backup before any backup was written. A trial none
of whose faults was injected tested nothing: it is neither survived nor failed. When
`--faults` names network_cut and this host cannot cut a job's network, the campaign stops
before its first trial.

It writes chaos.md (a table: fault, trials, survived, median and worst recovery; then a row
per trial with its shape) and chaos.json (every trial) to --out (default
build/chaos-<time>), and exits 1 unless every trial that injected a fault survived.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import random
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
JOB = os.path.join(HERE, "chaos_job.py")
EPOCHS, STEPS = 3, 10
TOTAL = EPOCHS * STEPS
GRACE = 10
COLLECTIVE_TIMEOUT = 8  # seconds: a frozen peer is given up on after this
FROZEN = COLLECTIVE_TIMEOUT + 4  # seconds a frozen worker stays stopped
RECOVERY_BOUND = 150.0  # seconds from a fault to training past the step it had reached
TRIAL_TIMEOUT = 420.0
MAX_LATE = 2  # runs again of a trial whose job ended before a fault could be injected
SETTLE = 10.0  # seconds the processes of a job that ended get to be gone
AUTOGRAPH_FILES = "__autograph_generated_file"
FILE_LIMIT = 4096  # bytes: the leader's RLIMIT_FSIZE for the disk-full fault
STATE_FILE = "tfdist-backup.json"  # tfdist.preemption.backup.STATE_FILE
NO_NAMESPACE = "no private network namespace"
# TensorFlow's coordination service, on the tasks whose heartbeats it missed.
_HEARTBEATS = re.compile(
    r"stopped sending heartbeats\)?:?\s*((?:/job:\w+/replica:\d+/task:\d+[,\s]*)+)"
)
_TF_TASK = re.compile(r"/job:(\w+)/replica:\d+/task:(\d+)")
# A line of a task's output as the launcher forwards it: "[worker:0] ...".
_FORWARDED = re.compile(r"\[([\w:-]+)\] ?(.*)")

SCENARIOS = [
    ("multi_worker_mirrored", "keras3"),
    ("multi_worker_mirrored", "tf_keras"),
    ("parameter_server", "keras3"),
    ("parameter_server", "tf_keras"),
]


def _leader(strategy):
    return "chief:0" if strategy == "parameter_server" else "worker:0"


# fault -> (strategies it applies to, the tasks it may hit: "worker" is any worker but worker 0,
# "ps" any ps, "leader" worker 0 or the chief, "writer" the task that writes the checkpoint data)
FAULTS: Dict[str, tuple] = {
    "kill_worker": (("multi_worker_mirrored", "parameter_server"), ("worker",)),
    "kill_leader": (("multi_worker_mirrored", "parameter_server"), ("leader",)),
    "kill_ps": (("parameter_server",), ("ps",)),
    "preempt": (("multi_worker_mirrored", "parameter_server"), ("leader", "worker")),
    "freeze": (("multi_worker_mirrored",), ("worker",)),
    "network_cut": (("multi_worker_mirrored", "parameter_server"), ("worker",)),
    "disk_full": (("multi_worker_mirrored", "parameter_server"), ("writer",)),
    "corrupt_backup": (("multi_worker_mirrored", "parameter_server"), ("launcher",)),
    "kill_launcher": (("multi_worker_mirrored", "parameter_server"), ("launcher",)),
}


# Faults a job may ride out without a restart (parameter_server waits for a worker that comes
# back); every other fault must restart the job from its backup.
RIDDEN_OUT = ("freeze", "network_cut")

# The shapes a trial may have: multi_worker_mirrored's worker counts, parameter_server's ps
# counts (with a chief and PS_WORKERS workers).
MWMS_WORKERS = (2, 3)
PS_COUNTS = (1, 2)
PS_WORKERS = 2


def _targets(kind: str, workers: int, ps: int) -> List[str]:
    """The tasks a fault of `kind` may hit in a job of that shape (FAULTS' tokens expanded)."""
    targets = []
    for token in FAULTS[kind][1]:
        if token == "worker":
            targets += [f"worker:{i}" for i in range(1, workers)]
        elif token == "ps":
            targets += [f"ps:{i}" for i in range(ps)]
        else:
            targets.append(token)
    return targets


@dataclasses.dataclass
class Fault:
    kind: str
    task: str
    at_step: int
    injected_at: Optional[float] = None
    step_then: Optional[int] = None
    starts_then: int = 0  # the leader's starts of training before the fault
    recovery: Optional[float] = None  # seconds until training went past the fault's step
    note: str = ""
    skipped: str = ""  # "not injected: <why>": the fault tested nothing, and counts nowhere
    log_at: int = 0  # the size of launcher.log when the fault was injected
    # corrupt_backup: the optimizer step of the backup before the corrupted one (the state
    # file's "previous"; None: there was none), and the step the next start restored
    resume_expected: Optional[int] = None
    resumed_at: Optional[int] = None

    @property
    def injected(self) -> bool:
        return self.injected_at is not None and not self.skipped


@dataclasses.dataclass
class Trial:
    index: int
    strategy: str
    flavour: str
    faults: List[Fault]
    directory: str
    problems: List[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    exit_code: Optional[int] = None
    late: str = ""  # the fault the job ended before (the trial is run again: nothing was tested)
    reruns: List[str] = dataclasses.field(default_factory=list)  # each run voided so
    workers: int = 2  # the job's workers (besides a chief)
    ps: int = 0  # its ps tasks (parameter_server)

    def reset(self) -> None:
        """For a run again: the faults as drawn, no outcome, an empty directory."""
        self.problems, self.late, self.exit_code = [], "", None
        self.faults = [Fault(f.kind, f.task, f.at_step) for f in self.faults]
        shutil.rmtree(self.directory, ignore_errors=True)

    @property
    def tested(self) -> bool:
        """False when faults were planned and none was injected (it tested nothing)."""
        return not self.faults or any(not f.skipped for f in self.faults)

    @property
    def survived(self) -> bool:
        return not self.problems and self.tested

    @property
    def shape(self) -> str:
        return f"{self.workers} workers" + (f" + {self.ps} ps" if self.ps else "")


def reference_key(strategy: str, flavour: str, workers: int, ps: int = 0) -> str:
    """Which uninterrupted run a trial's weights are compared with: one per scenario and shape."""
    return f"{strategy}-{flavour}-{workers}w-{ps}ps"


# ------------------------------------------------------------------------- processes
def _environ(pid: int) -> Dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return {}
    out = {}
    for item in items:
        key, _, value = item.partition(b"=")
        out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _stat(pid: int):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None, None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return fields[0].decode(), int(fields[1])


def trial_processes(marker: str) -> List[int]:
    """The live (not zombie) processes whose environment holds CHAOS_TRIAL=marker."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and _environ(int(name)).get("CHAOS_TRIAL") == marker:
            state, _ = _stat(int(name))
            if state not in (None, "Z"):
                found.append(int(name))
    return found


def task_pid(marker: str, task: str) -> Optional[int]:
    """The pid of the trial's task `task` itself (the child of its keeper)."""
    for pid in trial_processes(marker):
        if _environ(pid).get("TFDIST_TASK") != task or "keeper.py" in _cmdline(pid):
            continue
        _, parent = _stat(pid)
        if parent is not None and "keeper.py" in _cmdline(parent):
            return pid
    return None


# ------------------------------------------------------------------------- one trial
class Run:
    """One trial's job: its launcher (started again after a fault that killed it)."""

    def __init__(self, trial: Trial, marker: str):
        self.trial, self.marker = trial, marker
        d = trial.directory
        self.out, self.backup, self.tmp = (os.path.join(d, n) for n in ("out", "backup", "tmp"))
        for folder in (self.out, self.tmp):
            os.makedirs(folder, exist_ok=True)
        self.env = dict(
            os.environ,
            CHAOS_TRIAL=marker,
            TMPDIR=self.tmp,
            TFDIST_COLLECTIVE_TIMEOUT=str(COLLECTIVE_TIMEOUT),
            CHAOS_EPOCHS=str(EPOCHS),
            CHAOS_STEPS=str(STEPS),
            TF_CPP_MIN_LOG_LEVEL="2",
        )
        self.env.pop("TF_CONFIG", None)
        if trial.flavour == "tf_keras":
            self.env["TF_USE_LEGACY_KERAS"] = "1"
        else:
            self.env.pop("TF_USE_LEGACY_KERAS", None)
        self.argv = [sys.executable, "-m", "tfdist", "launch", "--workers", str(trial.workers)]
        if trial.ps:
            self.argv += ["--ps", str(trial.ps)]
        self.argv += ["--max-restarts", "3", "--grace", str(GRACE), JOB, self.out, self.backup]
        self.log = open(os.path.join(d, "launcher.log"), "ab")
        self.proc = None
        self.launches = 0

    def start(self) -> None:
        self.launches += 1
        self.log.write(f"=== launch {self.launches}: {' '.join(self.argv)}\n".encode())
        self.log.flush()
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def starts(self) -> int:
        """How many times the leader started training (a line each in OUT/starts.log)."""
        return len(_starts(self.out))

    def progress(self) -> int:
        try:
            with open(os.path.join(self.out, "progress")) as f:
                return int(f.read().strip() or -1)
        except (OSError, ValueError):
            return -1

    def wait_for(self, condition, until: float) -> bool:
        while time.monotonic() < until:
            if condition():
                return True
            if self.proc.poll() is not None:
                return condition()
            time.sleep(0.05)
        return False


def _starts(out: str) -> List[Optional[int]]:
    """The optimizer step each start of training restored (OUT/starts.log: "PID STEP" a line)."""
    try:
        with open(os.path.join(out, "starts.log")) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    steps = []
    for line in lines:
        try:
            steps.append(int(line.split()[1]))
        except (IndexError, ValueError):
            steps.append(None)
    return steps


def _backup_state(backup: str) -> Optional[dict]:
    try:
        with open(os.path.join(backup, STATE_FILE)) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def _newest_checkpoint_file(backup: str) -> Optional[str]:
    """A data file of the newest checkpoint the state file lists (the one a restart reads
    first; a newer one that a kill mid-save left unlisted is never read), else the newest."""
    state = _backup_state(backup)
    if state is not None and isinstance(state.get("checkpoint"), str):
        listed = sorted(glob.glob(os.path.join(backup, state["checkpoint"] + ".data-*")))
        if listed:
            return listed[-1]
    files = [
        p
        for p in glob.glob(os.path.join(backup, "**", "*"), recursive=True)
        if ".data-" in os.path.basename(p) and os.path.isfile(p)
    ]
    return max(files, key=os.path.getmtime) if files else None


def _corrupt(path: str, rng: random.Random) -> str:
    size = os.path.getsize(path)
    if rng.random() < 0.5:
        with open(path, "r+b") as f:
            f.truncate(size // 2)
        return f"truncated {os.path.basename(path)} to {size // 2} of {size} bytes"
    with open(path, "r+b") as f:
        f.seek(size // 4)
        f.write(bytes(rng.randrange(256) for _ in range(max(size // 2, 1))))
    return f"overwrote half of {os.path.basename(path)} with random bytes"


def _same_namespace(pid: int, kind: str) -> bool:
    return os.stat(f"/proc/{pid}/ns/{kind}").st_ino == os.stat(f"/proc/self/ns/{kind}").st_ino


def _set_loopback(pid: int, state: str) -> str:
    """Sets the loopback device of process `pid`'s network namespace up or down; "" when done,
    else why not: that namespace is this process's own (a job without a private one), or it
    cannot be entered."""
    try:
        if _same_namespace(pid, "net"):
            return NO_NAMESPACE
        user = not _same_namespace(pid, "user")  # the launcher's own: entered with the network
    except OSError as err:
        return f"cannot see the task's namespaces ({err})"
    if not (shutil.which("nsenter") and shutil.which("ip")):
        return "nsenter or ip is not installed"
    enter = ["nsenter", "-t", str(pid), "-n"] + (["-U", "--preserve-credentials"] if user else [])
    try:
        done = subprocess.run(
            enter + ["ip", "link", "set", "lo", state], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"cannot enter the job's network namespace ({err})"
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return f"cannot enter the job's network namespace ({said})"
    return ""


def network_cut_unavailable() -> str:
    """Why this host cannot cut a job's network (network_cut), or "" when it can: the launcher
    gives the job no private network namespace, or nsenter / ip are missing. (Whether such a
    namespace can be entered is only known once a job runs: the fault then says so.)"""
    if os.environ.get("TFDIST_NETWORK_NAMESPACE", "").strip().lower() == "off":
        return f"{NO_NAMESPACE} (TFDIST_NETWORK_NAMESPACE=off)"
    if not (shutil.which("nsenter") and shutil.which("ip")):
        return "nsenter or ip is not installed"
    try:
        from tfdist import netns
    except ImportError as err:
        return f"tfdist cannot be imported ({err})"
    try:
        netns.create().close()
    except OSError as err:  # netns.Unavailable
        return f"{NO_NAMESPACE} ({err})"
    return ""


def _tasks_of(fault: Fault, trial: Trial) -> List[str]:
    """The tasks a fault hits: "writer" is every task that writes checkpoint data (the leader,
    or every ps: each writes the shard of its variables), "leader" worker 0 or the chief."""
    if fault.task == "writer" and trial.strategy == "parameter_server":
        return [f"ps:{i}" for i in range(trial.ps)]
    if fault.task in ("writer", "leader"):
        return [_leader(trial.strategy)]
    return [fault.task]


def _log_size(run: Run) -> int:
    try:
        return os.path.getsize(os.path.join(run.trial.directory, "launcher.log"))
    except OSError:
        return 0


def inject(run: Run, fault: Fault, rng: random.Random) -> None:
    trial = run.trial
    tasks = _tasks_of(fault, trial)
    fault.injected_at, fault.step_then = time.monotonic(), run.progress()
    fault.starts_then, fault.log_at = run.starts(), _log_size(run)
    if fault.kind in ("kill_launcher", "corrupt_backup"):
        os.kill(run.proc.pid, signal.SIGKILL)
        run.proc.wait()
        left = trial_processes(run.marker)
        deadline = time.monotonic() + GRACE + 10
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = trial_processes(run.marker)
        if left:
            trial.problems.append(
                f"{fault.kind}: {len(left)} process(es) outlived the launcher killed with "
                f"SIGKILL: {[_cmdline(p)[:120] for p in left]}"
            )
            for pid in left:
                os.kill(pid, signal.SIGKILL)
        fault.starts_then = run.starts()  # the job is gone: the next start is the next line
        if fault.kind == "corrupt_backup":
            path = _newest_checkpoint_file(run.backup)
            if path is None:
                fault.skipped = fault.note = "not injected: no backup to corrupt yet"
            else:
                previous = (_backup_state(run.backup) or {}).get("previous") or {}
                fault.resume_expected = previous.get("iterations")
                fault.note = _corrupt(path, rng) + f" ({path})"
        run.start()
        return
    pids = [task_pid(run.marker, name) for name in tasks]
    if None in pids and run.proc.poll() is not None:
        trial.late = f"{fault.kind}@{fault.at_step}"  # the job ended while the campaign looked
        return
    if None in pids:
        missing = tasks[pids.index(None)]
        fault.note = f"{missing} not found"
        trial.problems.append(
            f"{fault.kind}: task {missing} was not running at step {fault.at_step}"
        )
        return
    for pid in pids:
        _hit(pid, fault)
    fault.note = fault.note or ", ".join(f"{name} (pid {pid})" for name, pid in zip(tasks, pids))


def _hit(pid: int, fault: Fault) -> None:
    """The fault itself, on the task `pid`."""
    if fault.kind.startswith("kill_"):
        os.kill(pid, signal.SIGKILL)
    elif fault.kind == "preempt":
        os.kill(pid, signal.SIGTERM)
    elif fault.kind == "freeze":
        os.kill(pid, signal.SIGSTOP)
        time.sleep(FROZEN)
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    elif fault.kind == "network_cut":
        why = _set_loopback(pid, "down")
        if why:
            fault.skipped = fault.note = f"not injected: {why}"
            return
        time.sleep(FROZEN)
        _set_loopback(pid, "up")  # the namespace may be gone already (its tasks ended)
    elif fault.kind == "disk_full":
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))


def run_trial(trial: Trial, rng: random.Random, references: Dict[str, list]) -> Trial:
    started = time.monotonic()
    marker = f"{os.getpid()}-{trial.index}-{rng.randrange(10**9)}"
    run = Run(trial, marker)
    until = started + TRIAL_TIMEOUT
    run.start()
    try:
        for fault in trial.faults:
            if not run.wait_for(lambda f=fault: run.progress() >= f.at_step, until):
                trial.problems.append(
                    f"{fault.kind}: training never reached step {fault.at_step} "
                    f"(at {run.progress()}; launcher exit {run.proc.poll()})"
                )
                break
            if run.proc.poll() is not None:  # the whole job ended before the fault could land
                trial.late = f"{fault.kind}@{fault.at_step}"
                break
            inject(run, fault, rng)
            if trial.late:
                break
            if fault.skipped:  # nothing was done: nothing to recover from
                continue
            after = run.progress()  # where training stood once the fault was over

            def recovered(f=fault, after=after):
                if run.starts() > f.starts_then:  # restarted, and trained past the fault
                    return run.progress() > f.step_then
                return f.kind in RIDDEN_OUT and run.progress() > after

            if run.wait_for(recovered, until):  # judged by `judge`
                fault.recovery = time.monotonic() - fault.injected_at
        try:
            trial.exit_code = run.proc.wait(timeout=max(until - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            trial.problems.append(f"the job did not end within {TRIAL_TIMEOUT:.0f} s")
            os.killpg(run.proc.pid, signal.SIGKILL)
            trial.exit_code = run.proc.wait()
    finally:
        if run.proc.poll() is None:  # the campaign itself is stopping: so does its job
            os.killpg(run.proc.pid, signal.SIGTERM)
            try:
                run.proc.wait(timeout=GRACE + 10)
            except subprocess.TimeoutExpired:
                os.killpg(run.proc.pid, signal.SIGKILL)
                run.proc.wait()
        run.log.close()
        trial.seconds = time.monotonic() - started
    if not trial.late:
        judge(trial, run, references)
    return trial


def _final(out: str) -> Optional[dict]:
    try:
        with open(os.path.join(out, "final.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def unresponsive_tasks(text: str) -> List[str]:
    """The tasks that `text` (a job's output, each line "[task] ..." as the launcher forwards
    it) says stopped sending heartbeats. TensorFlow lists them on the lines after its message:
    each task's lines are read together, apart from the others' that come in between."""
    streams: Dict[str, List[str]] = {}
    for line in text.splitlines():
        match = _FORWARDED.match(line)
        source, body = match.groups() if match else ("", line)
        streams.setdefault(source, []).append(body)
    named = set()
    for lines in streams.values():
        for match in _HEARTBEATS.finditer("\n".join(lines)):
            named.update(f"{job}:{task}" for job, task in _TF_TASK.findall(match.group(1)))
    return sorted(named)


def _judge_recovery(trial: Trial, fault: Fault) -> None:
    """A fault injected is recovered from within RECOVERY_BOUND seconds."""
    if not fault.injected:
        return
    if fault.recovery is None:
        trial.problems.append(
            f"{fault.kind}: no restart trained past step {fault.step_then} (launcher exit "
            f"{trial.exit_code})"
        )
    elif fault.recovery > RECOVERY_BOUND:
        trial.problems.append(
            f"{fault.kind}: recovered after {fault.recovery:.0f} s, more than "
            f"{RECOVERY_BOUND:.0f} s"
        )


def _judge_freeze(trial: Trial, fault: Fault, segment: str) -> None:
    """The tasks named as unresponsive after a freeze (in the job's output from the freeze to
    the next fault) are the frozen one; a job that stopped after it named it."""
    (frozen,) = _tasks_of(fault, trial)
    named = unresponsive_tasks(segment)
    wrong = [task for task in named if task != frozen]
    if wrong:
        trial.problems.append(
            f"freeze: the job said {wrong} stopped sending heartbeats, but {frozen} was the "
            "frozen task"
        )
    if trial.exit_code != 0 and frozen not in named:
        trial.problems.append(
            f"freeze: the job stopped without a message naming the frozen task {frozen}"
        )


def _judge_corrupt_backup(trial: Trial, fault: Fault, run: Run, log: str) -> None:
    """One warning from the leader naming the corrupted checkpoint, and the next start of
    training resumed at the step of the backup before it: never from scratch."""
    name = os.path.basename(fault.note.rsplit("(", 1)[1].rstrip(")"))
    prefix = name.split(".data-")[0]
    leader = f"[{_leader(trial.strategy)}]"
    warned = [
        line
        for line in log.splitlines()
        if line.startswith(leader) and prefix in line and "Warning" in line
    ]
    if len(warned) != 1:
        trial.problems.append(
            f"corrupt_backup: the leader printed {len(warned)} warning(s) naming {prefix}, not one"
        )
    starts = _starts(run.out)
    if len(starts) > fault.starts_then:
        fault.resumed_at = starts[fault.starts_then]
    expected, resumed = fault.resume_expected, fault.resumed_at
    if expected is None:  # no backup before it: the job must refuse to go on, not start over
        if len(starts) > fault.starts_then:
            trial.problems.append(
                f"corrupt_backup: no backup was left before {prefix}, yet training started "
                f"again (at step {resumed}), from scratch"
            )
    elif resumed is None:
        trial.problems.append(
            f"corrupt_backup: no start of training after the corruption of {prefix} said which "
            "step it restored"
        )
    elif resumed != expected or resumed <= 0:
        what = "from scratch (step 0)" if resumed == 0 else f"at step {resumed}"
        trial.problems.append(
            f"corrupt_backup: training resumed {what} after {prefix} was corrupted, not at step "
            f"{expected} of the backup before it"
        )


def judge(trial: Trial, run: Run, references: Dict[str, list]) -> None:
    problems = trial.problems
    if trial.exit_code != 0:
        problems.append(f"the launcher exited with {trial.exit_code}")
    final = _final(run.out)
    if final is None:
        problems.append("the job wrote no final weights")
    else:
        if final["iterations"] != TOTAL:
            problems.append(f"the optimizer step is {final['iterations']}, not {TOTAL}")
        key = reference_key(trial.strategy, trial.flavour, trial.workers, trial.ps)
        reference = references.get(key)  # None for the uninterrupted run itself
        if key not in references and trial.strategy == "multi_worker_mirrored":
            problems.append(f"no uninterrupted run of {key} to compare the final weights with")
        elif reference is not None and final["weights"] != reference:
            problems.append(
                f"the final weights differ from those of an uninterrupted run ({trial.shape})"
            )
    deadline = time.monotonic() + SETTLE
    left = trial_processes(run.marker)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = trial_processes(run.marker)
    if left:
        problems.append(
            f"{len(left)} process(es) outlived the job: {[_cmdline(p)[:120] for p in left]}"
        )
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    # TensorFlow's autograph writes its generated code to temporary files that it removes at
    # exit: a task killed with SIGKILL cannot; they are TensorFlow's, not tfdist's.
    leftovers = sorted(n for n in os.listdir(run.tmp) if not n.startswith(AUTOGRAPH_FILES))
    if leftovers:
        problems.append(f"left in TMPDIR: {leftovers[:5]}")
    with open(os.path.join(trial.directory, "launcher.log"), "rb") as f:
        raw = f.read()
    log = raw.decode(errors="replace")
    if "MultiDeviceSaver" in log:  # TensorFlow's warning at every save: tfdist hides it
        problems.append("the output has TensorFlow's retracing warnings of the checkpoint saver")
    for index, fault in enumerate(trial.faults):
        _judge_recovery(trial, fault)
        if fault.kind == "freeze" and fault.injected:
            later = [f.log_at for f in trial.faults[index + 1 :] if f.injected_at is not None]
            end = later[0] if later else len(raw)
            _judge_freeze(trial, fault, raw[fault.log_at : end].decode(errors="replace"))
        if fault.kind == "corrupt_backup" and fault.note.startswith(("truncated", "overwrote")):
            _judge_corrupt_backup(trial, fault, run, log)


# ------------------------------------------------------------------------- the campaign
def reference(strategy: str, flavour: str, workers: int, ps: int, root: str) -> Optional[list]:
    """The final weights of an uninterrupted run of that scenario and shape
    (multi_worker_mirrored only)."""
    if strategy != "multi_worker_mirrored":
        return None
    key = reference_key(strategy, flavour, workers, ps)
    trial = Trial(-1, strategy, flavour, [], os.path.join(root, f"reference-{key}"))
    trial.workers, trial.ps = workers, ps
    os.makedirs(trial.directory, exist_ok=True)
    run_trial(trial, random.Random(0), {key: None})  # None: itself the run compared with
    final = _final(os.path.join(trial.directory, "out"))
    if not trial.survived or final is None:
        raise SystemExit(f"the uninterrupted {key} run failed: {trial.problems}")
    return final["weights"]


def plan_trials(n: int, seed: int, faults: List[str], root: str) -> List[Trial]:
    rng = random.Random(seed)
    trials = []
    for index in range(n):
        kind = faults[index % len(faults)]  # every fault as often as the others
        strategies = [s for s in SCENARIOS if s[0] in FAULTS[kind][0]]
        strategy, flavour = rng.choice(strategies)
        if strategy == "parameter_server":
            workers, ps = PS_WORKERS, rng.choice(PS_COUNTS)
        else:
            workers, ps = rng.choice(MWMS_WORKERS), 0
        kinds = [kind]
        if rng.random() < 0.3:  # a second fault, later in the same trial
            kinds.append(rng.choice([k for k in faults if strategy in FAULTS[k][0]]))
        # A corrupt backup is judged on its fallback to the one before: from step 5 there are
        # two (saves at 2 and 4); a job whose only backup is unreadable stops with an error.
        low = 5 if "corrupt_backup" in kinds else 3
        steps = sorted(rng.sample(range(low, TOTAL - 8), len(kinds)))
        if len(steps) == 2 and steps[1] - steps[0] < 4:
            steps[1] = min(steps[0] + 4, TOTAL - 4)
        chosen = [Fault(k, rng.choice(_targets(k, workers, ps)), s) for k, s in zip(kinds, steps)]
        directory = os.path.join(root, f"trial-{index:03d}")
        trials.append(Trial(index, strategy, flavour, chosen, directory, workers=workers, ps=ps))
    return trials


def _faults_text(trial: Trial) -> str:
    return ", ".join(
        f"{f.kind}@{f.at_step}({f.task})" + (" not injected" if f.skipped else "")
        for f in trial.faults
    )


def _verdict(trial: Trial) -> str:
    if trial.problems:
        return "FAILED: " + "; ".join(trial.problems)
    if not trial.tested:
        return "; ".join(sorted({f.skipped for f in trial.faults}))
    return "survived"


def report(trials: List[Trial], root: str, seconds: float) -> str:
    rows, skipped = {}, {}
    for trial in trials:
        for fault in trial.faults:
            if fault.skipped:  # tested nothing: counted nowhere, listed below the table
                skipped.setdefault((fault.kind, fault.skipped), []).append(trial.index)
                continue
            row = rows.setdefault(fault.kind, {"trials": 0, "survived": 0, "recovery": []})
            row["trials"] += 1
            row["survived"] += trial.survived
            if fault.recovery is not None:
                row["recovery"].append(fault.recovery)
    tested = [t for t in trials if t.tested]
    untested = len(trials) - len(tested)
    lines = [
        f"# Fault-injection campaign: {sum(t.survived for t in tested)} of {len(tested)} trials "
        f"survived ({seconds / 60:.0f} min)"
        + (f"; {untested} more injected no fault" if untested else ""),
        "",
        "| fault | trials | survived | median recovery | worst recovery |",
        "| --- | --- | --- | --- | --- |",
    ]
    for kind in FAULTS:
        if kind not in rows:
            continue
        row = rows[kind]
        rec = row["recovery"]
        median = f"{statistics.median(rec):.1f} s" if rec else "-"
        worst = f"{max(rec):.1f} s" if rec else "-"
        lines.append(f"| {kind} | {row['trials']} | {row['survived']} | {median} | {worst} |")
    if skipped:
        lines.append("")
        for (kind, why), indices in sorted(skipped.items()):
            lines.append(
                f"Not counted: {kind} in {len(indices)} trial(s), {why} (trials "
                f"{', '.join(map(str, indices))})."
            )
    lines += [
        "",
        "## Trials",
        "",
        "| trial | strategy | Keras | workers | ps | faults | seconds | result |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for t in trials:
        result = "survived" if t.survived else ("FAILED" if t.problems else "not injected")
        lines.append(
            f"| {t.index} | {t.strategy} | {t.flavour} | {t.workers} | {t.ps} | "
            f"{_faults_text(t)} | {t.seconds:.0f} | {result} |"
        )
    failed = [t for t in trials if t.problems]
    if failed:
        lines += ["", "## Trials that did not survive", ""]
        for t in failed:
            problems = "; ".join(t.problems)
            lines.append(
                f"- trial {t.index} ({t.strategy}, {t.shape}, {t.flavour}; {_faults_text(t)}): "
                f"{problems}"
            )
    text = "\n".join(lines) + "\n"
    with open(os.path.join(root, "chaos.md"), "w") as f:
        f.write(text)
    with open(os.path.join(root, "chaos.json"), "w") as f:
        records = [
            dataclasses.asdict(t) | {"survived": t.survived, "tested": t.tested} for t in trials
        ]
        json.dump(records, f, indent=1)
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--faults",
        default=None,
        help=f"comma-separated, of {', '.join(FAULTS)} (default: all; network_cut named here "
        "must be injectable, else the campaign stops)",
    )
    parser.add_argument("--out", default=os.environ.get("OUT"))
    parser.add_argument("--keep", action="store_true", help="keep each trial's folder")
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated trial indices of the seeded plan to run (the same faults at the "
        "same steps), e.g. to run a failed trial again",
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    asked = args.faults is not None
    faults = [f for f in (args.faults or ",".join(FAULTS)).split(",") if f]
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown or not faults or args.trials < 1:
        known = ", ".join(FAULTS)
        parser.error(f"unknown faults {unknown}; known: {known}" if faults else "--trials >= 1")
    cut_required = asked and "network_cut" in faults
    if cut_required:
        why = network_cut_unavailable()
        if why:
            parser.error(f"--faults names network_cut, which this host cannot inject: {why}")
    root = args.out or os.path.join(ROOT, "build", time.strftime("chaos-%Y%m%d-%H%M%S"))
    os.makedirs(root, exist_ok=True)
    print(f"chaos: {args.trials} trials, seed {args.seed}, results in {root}", flush=True)
    started = time.monotonic()
    trials = plan_trials(args.trials, args.seed, faults, root)
    if args.only:
        chosen = {int(i) for i in args.only.split(",") if i.strip()}
        trials = [t for t in trials if t.index in chosen]
    references = {}
    for shape in sorted({(t.strategy, t.flavour, t.workers, t.ps) for t in trials}):
        weights = reference(*shape, root)
        if weights is not None:
            references[reference_key(*shape)] = weights
    rng = random.Random(args.seed + 1)
    for trial in trials:
        run_trial(trial, rng, references)
        while trial.late and len(trial.reruns) < MAX_LATE:
            print(
                f"chaos: trial {trial.index}: the job ended before {trial.late} could be "
                "injected (nothing was tested); running it again",
                flush=True,
            )
            trial.reruns.append(trial.late)
            trial.reset()
            run_trial(trial, rng, references)
        if trial.late:
            trial.problems.append(
                f"the job ended before {trial.late} could be injected, {MAX_LATE + 1} times: "
                "this host is too slow for the campaign's pace"
            )
        for fault in trial.faults:
            if cut_required and fault.kind == "network_cut" and fault.skipped:
                trial.problems.append(f"network_cut was asked for (--faults): {fault.skipped}")
        print(
            f"chaos: trial {trial.index} {trial.strategy} ({trial.shape}) {trial.flavour} "
            f"[{_faults_text(trial)}] {trial.seconds:.0f} s: {_verdict(trial)}",
            flush=True,
        )
        if not trial.problems and not args.keep:
            shutil.rmtree(trial.directory, ignore_errors=True)
    print(report(trials, root, time.monotonic() - started), flush=True)
    return 0 if all(t.survived or not (t.tested or t.problems) for t in trials) else 1


if __name__ == "__main__":
    sys.exit(main())
