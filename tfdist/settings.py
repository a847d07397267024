"""Every TFDIST_* environment variable: its name, how it is parsed, its default and its doc.

The one place tfdist reads its own variables from. Each variable is a `Setting`:

    from tfdist import settings

    settings.STARTUP_TIMEOUT.get()            # reads os.environ: 300 when unset
    settings.NUM_PS.get({"TFDIST_NUM_PS": "1"})  # or any mapping: 1

`get` never writes the mapping. A value that cannot be parsed is a `ValueError` that quotes the
variable and the value and says what is allowed. `SETTINGS` lists them all, in the order of
docs/environment-variables.md, whose table is `markdown_table()`.

A leaf module: it imports neither TensorFlow nor other tfdist modules.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable, Mapping, NamedTuple, Optional

PREFIX = "TFDIST_"  # every variable of tfdist starts with it (`tfdist env` lists them all)


@dataclasses.dataclass(frozen=True)
class Setting:
    """One environment variable of tfdist.

    Attributes:
        name: str. The variable, e.g. "TFDIST_NUM_PS".
        parse: callable. Turns the variable's text into the value; raises ValueError saying
            what is allowed (the part after "must be") when the text is not valid.
        default: the value when the variable is not set.
        doc: str. What the variable does (the "meaning" column of the docs table).
        read_by: str. What reads it (the "read by" column).
        default_doc: str. The default as the docs table shows it; empty: `str(default)`.
    """

    name: str
    parse: Callable[[str], Any]
    default: Any
    doc: str
    read_by: str
    default_doc: str = ""

    def get(
        self,
        env: Optional[Mapping[str, str]] = None,
        check: Optional[Callable[[Any], Any]] = None,
    ) -> Any:
        """The parsed value of the variable in `env` (default `os.environ`), or the default.

        Args:
            env: mapping. Defaults to `os.environ`.
            check: callable. A further parse of the parsed value (when it is not None), by the
                module that owns the vocabulary this one does not (the strategy names are
                `tfdist.strategy.registry`'s, and this module imports no other); it raises
                ValueError saying what is allowed, as `parse` does.

        Raises:
            ValueError: the variable is set to a value it does not take.
        """
        env = os.environ if env is None else env
        value = env.get(self.name)
        if value is None:
            return self.default
        try:
            parsed = self.parse(value)
            return parsed if check is None or parsed is None else check(parsed)
        except ValueError as err:
            raise ValueError(
                f"{self.name} must be {err}. Received: {self.name}={value!r}. HINT: correct "
                f"the value, or unset {self.name} for the default."
            ) from None


# ------------------------------------------------------------------------------- parsers

_OFF = ("0", "false", "no", "off")


class KerasFixes(NamedTuple):
    """The value of TFDIST_KERAS_FIXES: are the fixes on, and which are turned off by name."""

    enabled: bool
    turned_off: frozenset


def _strategy(value: str) -> Optional[str]:
    """A strategy name as written, lower case with "_" for "-"; None when blank.

    Which names there are is the strategy registry's to say: `make_strategy` reads this
    setting with `check=tfdist.strategy.registry.known_name`.
    """
    return value.strip().lower().replace("-", "_") or None


def _lower_or_none(value: str) -> Optional[str]:
    """The value stripped and lower case; None when blank."""
    return value.strip().lower() or None


def _seconds(value: str) -> float:
    """A finite, non-negative number of seconds ("300", "2.5")."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not 0 <= number < math.inf:
        raise ValueError("a finite, non-negative number of seconds, like 300 or 2.5")
    return number


def _count(value: str) -> int:
    """A non-negative integer written plainly ("0", " 12 "; not "012", "1e3" or "+1")."""
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0 or str(number) != str(value).strip():
        raise ValueError("a non-negative integer (plain digits, no leading zero), like 1 or 8888")
    return number


def _keras_fixes(value: str) -> KerasFixes:
    """0 / false / no / off: every fix off; else the "-name" entries of a comma list are off
    (with 1 / true / yes / on, or nothing, between them)."""
    if value.strip().lower() in _OFF:
        return KerasFixes(False, frozenset())
    parts = [part.strip() for part in value.split(",")]
    odd = [part for part in parts if part.lower() not in _ON + ("",) and part[:1] != "-"]
    if odd or any(part == "-" for part in parts):
        raise ValueError(
            "0 (every fix off), or a comma list of -name entries (those fixes off), e.g. "
            f"-no_xla_step_across_replicas; {', '.join(map(repr, odd or ['-']))} is neither"
        )
    return KerasFixes(True, frozenset(part[1:] for part in parts if part.startswith("-")))


def _on_unless_off(value: str) -> bool:
    """0 / false / no / off: False; 1 / true / yes / on or empty: True."""
    key = value.strip().lower()
    if key in _OFF:
        return False
    if key in _ON or not key:
        return True
    raise ValueError("0 (or false, no, off) to turn it off, or 1 (or true, yes, on)")


def _is_all(value: str) -> bool:
    """True for "all", False for "chief" or empty (any case)."""
    key = value.strip().lower()
    if key not in ("all", "chief", ""):
        raise ValueError("all (progress bars on every worker) or chief (the default)")
    return key == "all"


def _text_or_none(value: str) -> Optional[str]:
    """The value as it is; None when empty."""
    return value or None


def _text(value: str) -> str:
    """The value as it is."""
    return value


_ON = ("1", "true", "yes", "on")


def _flag(value: str) -> bool:
    """1 / true / yes / on: True; 0 / false / no / off or empty: False."""
    key = value.strip().lower()
    if key in _ON:
        return True
    if key in _OFF or not key:
        return False
    raise ValueError("1 (or true, yes, on) or 0 (or false, no, off)")


def _steps(value: str) -> Optional[tuple]:
    """START:END, two whole numbers with 0 <= START < END (steps START to END - 1); empty:
    None."""
    if not value.strip():
        return None
    start, _, end = value.partition(":")
    try:
        first, last = int(start), int(end)
    except ValueError:
        first = last = -1
    if not 0 <= first < last:
        raise ValueError("START:END, two whole numbers of steps with 0 <= START < END, like 10:15")
    return first, last


_NAMESPACE_CHOICES = ("auto", "off", "require")
# What some strategy's `communication=` takes (tfdist.strategy.communication's tables; a test
# holds the two equal): a value none takes is a typo, not a choice for another strategy.
COMMUNICATIONS = ("auto", "ring", "nccl", "gloo", "hierarchical_copy", "reduce_to_one_device")


def _communication(value: str) -> Optional[str]:
    """A value of some strategy's `communication=` (any case); None when blank."""
    key = value.strip().lower()
    if key and key not in COMMUNICATIONS:
        raise ValueError(f"one of {', '.join(COMMUNICATIONS)}")
    return key or None


def _namespace(value: str) -> str:
    """auto, off or require (any case); "0" / "false" / "no" mean off."""
    key = value.strip().lower()
    if key in _OFF:
        return "off"
    if key not in _NAMESPACE_CHOICES:
        raise ValueError(f"one of {', '.join(_NAMESPACE_CHOICES)}")
    return key


# ------------------------------------------------------------------------------ settings

STRATEGY = Setting(
    "TFDIST_STRATEGY",
    _strategy,
    None,
    'a strategy name that replaces `"auto"` (explicit names are not replaced); `tfdist launch '
    "--strategy` sets it",
    "`make_strategy`",
    "unset",
)
COMMUNICATION = Setting(
    "TFDIST_COMMUNICATION",
    _communication,
    None,
    'replaces `communication="auto"`: `ring`, `nccl`, `gloo` (multi_worker_mirrored), `nccl`, '
    "`hierarchical_copy`, `reduce_to_one_device` (mirrored); a strategy that does not take the "
    'value keeps `"auto"`; a value no strategy takes is refused; `tfdist launch '
    "--communication` sets it",
    "`make_strategy`, `tfdist doctor`",
    "unset",
)


def _compression(value: str) -> Optional[str]:
    """bf16, fp16 (also bfloat16, float16) or none; None when blank or none."""
    key = value.strip().lower()
    spellings = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16"}
    if key in ("", "none", "off", "0"):
        return None
    if key not in spellings:
        raise ValueError("one of bf16, fp16, none")
    return spellings[key]


GRADIENT_COMPRESSION = Setting(
    "TFDIST_GRADIENT_COMPRESSION",
    _compression,
    None,
    "casts float32 gradients to `bf16` or `fp16` for the all-reduce of `mirrored` and "
    "`multi_worker_mirrored` when `make_strategy` gets no `gradient_compression=`; `none` "
    "turns it off; other strategies ignore it; `tfdist launch --gradient-compression` sets it",
    "`make_strategy`",
    "unset (no compression)",
)
# A peer that never joins becomes an error after this many seconds instead of a hang.
STARTUP_TIMEOUT = Setting(
    "TFDIST_STARTUP_TIMEOUT",
    _seconds,
    300,
    "seconds to wait for every peer to join (the workers of multi_worker_mirrored; the workers "
    "and ps tasks the chief of parameter_server connects to), then `RuntimeError` naming the "
    "missing tasks; `startup_timeout=` wins",
    "`make_strategy` (multi_worker_mirrored, parameter_server)",
)
# No per-collective timeout by default: TensorFlow implements one with a new OS thread that
# sleeps for the whole timeout, twice per collective, which cost multi-worker Keras training
# 30-45% of its throughput (benchmarks/bench_keras.py) and thousands of threads per process.
# A peer that dies is caught anyway: the coordination service (configured by tfdist) stops
# receiving its heartbeats and aborts the collectives with an error naming the task.
COLLECTIVE_TIMEOUT = Setting(
    "TFDIST_COLLECTIVE_TIMEOUT",
    _seconds,
    0,
    "seconds one collective may take, then `DeadlineExceededError`; `0` means no limit; "
    "`timeout_seconds=` wins",
    "`make_strategy` (multi_worker_mirrored)",
    "no limit (each timed collective costs TensorFlow a sleeping thread; dead peers are caught "
    'by heartbeats); with `communication="gloo"`, 1800 s for each Gloo all-reduce',
)
NUM_PS = Setting(
    "TFDIST_NUM_PS",
    _count,
    0,
    "the number of ps tasks among the step's tasks: rank 0 becomes the chief, ranks 1..N the ps "
    "tasks; `num_ps=` wins",
    "SLURM detection",
)
SLURM_PORT = Setting(
    "TFDIST_SLURM_PORT",
    _count,
    8888,
    "the base port: the task with local index i on a node listens on base + i; `port=` wins",
    "SLURM detection",
)
KERAS_FIXES = Setting(
    "TFDIST_KERAS_FIXES",
    _keras_fixes,
    KerasFixes(True, frozenset()),
    "`0` (or `false`, `no`, `off`) turns off every Keras 3 fix; a comma list of `-name` entries "
    "turns off those fixes only, e.g. `-no_xla_step_across_replicas,"
    "-different_random_draws_per_replica`; an unknown name is a `ValueError` that lists the "
    "known ones",
    "`make_strategy`",
    "all fixes on",
)
PS_DIRECT_SCHEDULE = Setting(
    "TFDIST_PS_DIRECT_SCHEDULE",
    _on_unless_off,
    True,
    "`0` (or `false`, `no`, `off`) hands every scheduled group of steps to "
    "`ClusterCoordinator.schedule()`, TensorFlow's public path, instead of tfdist's faster "
    "direct one; each group then reads its progress counter from the ps. For diagnosing "
    "problems only",
    "`tfdist.fit` on parameter_server (Keras 3)",
    "`1`",
)
PROGRESS = Setting(
    "TFDIST_PROGRESS",
    _is_all,
    False,
    "`all` shows Keras progress bars on every worker; `chief` (the default) only on the chief",
    "`tfdist.make_strategy` (multi_worker_mirrored)",
    "chief only",
)
REPORT_FILE = Setting(
    "TFDIST_REPORT_FILE",
    _text_or_none,
    None,
    "a file where this process writes the training steps and time of its fits, which the "
    "launcher's summary line reads",
    "`tfdist.make_strategy`",
    "set by the launcher",
)
TASK = Setting(
    "TFDIST_TASK",
    _text,
    None,
    "the task's name (`worker:1`), set by `tfdist launch` in every process it starts; a script "
    "may read it",
    "the launcher and `run_cluster`",
    "set by the launcher",
)
STALL_TIMEOUT = Setting(
    "TFDIST_STALL_TIMEOUT",
    _seconds,
    300,
    "seconds without a training step after which `tfdist launch` names the tasks that are "
    "behind and prints every task's Python stacks (all threads), once per stall, without "
    "stopping the job; in a job started without the launcher (TF_CONFIG), each task watches "
    "its own fits the same way; `0` turns it off (and with TFDIST_STATUS_EVERY `0` too, the "
    "tasks report no progress at all); `tfdist launch --stall-timeout` sets it",
    "`tfdist launch`, `tfdist.launch`, `tfdist.make_strategy` (a job without the launcher)",
)
STATUS_EVERY = Setting(
    "TFDIST_STATUS_EVERY",
    _seconds,
    30,
    "seconds between two progress lines of `tfdist launch` (each training task's step, "
    "steps/s, the slowest task) when its output is not a terminal; on a terminal one status "
    "line is updated in place; `0` turns both off (and with TFDIST_STALL_TIMEOUT `0` too, the "
    "tasks report no progress at all)",
    "`tfdist launch`, `tfdist.launch`",
)
PROFILE = Setting(
    "TFDIST_PROFILE",
    _steps,
    None,
    "`START:END`: every training task captures a TensorFlow profiler trace of its optimizer "
    "steps START to END - 1 into TFDIST_PROFILE_DIR/<task>, which TensorBoard's profile "
    "plugin opens; `tfdist launch --profile` sets it",
    "`tfdist.make_strategy`",
    "unset (no trace)",
)
PROFILE_DIR = Setting(
    "TFDIST_PROFILE_DIR",
    _text_or_none,
    None,
    "where TFDIST_PROFILE's traces go, one directory per task; `tfdist launch --profile` sets "
    "it to `--log-dir`/profile, or `tfdist-profile` in the current directory",
    "`tfdist.make_strategy`",
    "`tfdist-profile`",
)
TASK_TMPDIR = Setting(
    "TFDIST_TASK_TMPDIR",
    _text_or_none,
    None,
    "the task's own scratch directory, where non-chief workers write their copy of each "
    "checkpoint; the task's keeper makes it and removes it with all it holds once the task has "
    "ended, even when the task was killed in the middle of a save",
    "`tfdist.BackupAndRestore`, Keras `ModelCheckpoint` and `BackupAndRestore` (non-chief workers)",
    "set by the launcher (TMPDIR itself without it)",
)
POOL_KEY = Setting(
    "TFDIST_POOL_KEY",
    _text,
    None,
    "the key with which a strategy pool's process (`tfdist.testing`) proves itself to the test "
    "process that started it",
    "`tfdist.testing.pools`",
    "set by the pool",
)
NETWORK_NAMESPACE = Setting(
    "TFDIST_NETWORK_NAMESPACE",
    _namespace,
    "auto",
    "where the tasks of a local job run: `auto` starts them in a private network namespace "
    "(loopback only: no other host, nor the host's own processes, can reach their servers, and "
    "they reach no network but each other), or without one, with a warning, where the system "
    "refuses namespaces; `require` fails instead; `off` runs them in the host's network, "
    "where TensorFlow's servers listen on every interface",
    "`tfdist launch`, `tfdist.launch`, `run_cluster`, `tfdist doctor`",
)
VERBOSE = Setting(
    "TFDIST_VERBOSE",
    _flag,
    False,
    "`1` shows every line of a launched job's tasks, TensorFlow's C++ start-up logs included; "
    "by default they are hidden (errors never are; `--log-dir` files keep every line); "
    "`tfdist launch --verbose` does the same",
    "`tfdist launch`, `tfdist.launch`",
    "`0`",
)
PRELOAD = Setting(
    "TFDIST_PRELOAD",
    _flag,
    True,
    "`0` (or `false`, `no`, `off`) starts every task of `tfdist.testing.run_cluster` and of the "
    "strategy pools as a fresh "
    "process; by default they are forked from a process that imported TensorFlow once "
    "(`tfdist.launcher.preload`), which saves seconds of CPU per task",
    "`tfdist.testing`",
    "`1`",
)
HOROVOD_SHIM = Setting(
    "TFDIST_HOROVOD_SHIM",
    _flag,
    False,
    "`1` makes `import horovod...` give tfdist's Horovod API (`tfdist.horovod`) in the tasks "
    "of a local job, where Horovod itself is not installed (an installed Horovod always wins); "
    "`tfdist horovodrun` sets it",
    "the start-up module of `tfdist launch` and `tfdist horovodrun` tasks",
    "`0`",
)

GPUS = Setting(
    "TFDIST_GPUS",
    _count,
    None,
    "`N` stands for N GPUs (ids 0 to N-1) where `tfdist launch` hands GPUs out to its tasks, "
    "in place of `CUDA_VISIBLE_DEVICES` or what `nvidia-smi` lists: a CPU host then plans "
    "the job as a GPU host would (tests)",
    "`tfdist launch`, `tfdist.launch`, `tfdist horovodrun`",
    "unset",
)
GPU_MEMORY_GROWTH = Setting(
    "TFDIST_GPU_MEMORY_GROWTH",
    _flag,
    True,
    "`0` lets every task that shares its GPUs with another (`--gpus-per-worker shared`, "
    "`tfdist horovodrun`, a SLURM step with fewer GPUs than tasks on a node) reserve almost "
    "all of their memory, as TensorFlow does by default; by default such a task gets "
    "`TF_FORCE_GPU_ALLOW_GROWTH=true` (a value of your own of that variable is kept), and "
    "`hvd.init()` and the SLURM share turn on memory growth",
    "`tfdist launch`, `tfdist.launch`, `tfdist horovodrun`, `hvd.init()`, `make_strategy` (SLURM)",
    "`1`",
)
RENDEZVOUS_TOKEN = Setting(
    "TFDIST_RENDEZVOUS_TOKEN",
    _text_or_none,
    None,
    "the secret every node of a multi-node `tfdist launch` presents to the rendezvous (it "
    "never crosses the network: each node answers a challenge with it); `--token` wins; never "
    "passed on to the tasks",
    "`tfdist launch --nodes`",
    "unset (node 0 makes one and prints it)",
)
RENDEZVOUS_TIMEOUT = Setting(
    "TFDIST_RENDEZVOUS_TIMEOUT",
    _seconds,
    300,
    "seconds a node waits for the rendezvous to answer, and the rendezvous for every node to "
    "join (at the start, and after a restart for a lost node to come back), then the job ends "
    "with an error naming the address or the nodes; `--rendezvous-timeout` wins",
    "`tfdist launch --nodes`",
)

SETTINGS = (
    STRATEGY,
    COMMUNICATION,
    GRADIENT_COMPRESSION,
    STARTUP_TIMEOUT,
    COLLECTIVE_TIMEOUT,
    NUM_PS,
    SLURM_PORT,
    KERAS_FIXES,
    PS_DIRECT_SCHEDULE,
    PROGRESS,
    REPORT_FILE,
    TASK,
    STALL_TIMEOUT,
    STATUS_EVERY,
    PROFILE,
    PROFILE_DIR,
    TASK_TMPDIR,
    POOL_KEY,
    NETWORK_NAMESPACE,
    VERBOSE,
    HOROVOD_SHIM,
    PRELOAD,
    GPUS,
    GPU_MEMORY_GROWTH,
    RENDEZVOUS_TOKEN,
    RENDEZVOUS_TIMEOUT,
)


def markdown_table() -> str:
    """The table of `SETTINGS` in docs/environment-variables.md, as Markdown (ends in "\\n")."""
    lines = ["| variable | read by | meaning | default |", "| --- | --- | --- | --- |"]
    for setting in SETTINGS:
        default = setting.default_doc or str(setting.default)
        lines.append(f"| `{setting.name}` | {setting.read_by} | {setting.doc} | {default} |")
    return "\n".join(lines) + "\n"
