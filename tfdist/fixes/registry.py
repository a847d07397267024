"""Every fix record, in the order it is applied, and applying them: checked, once, never raising.

`apply_fixes()` is called by `tfdist.make_strategy`; users call nothing else. For each fix it
picks the variant for the installed Keras, checks its targets, and applies it. A fix whose
targets are missing or changed is skipped with one `CompatibilityWarning` that names the fix,
the Keras release and what then behaves as upstream. `report()` gives each fix's state without
applying anything, for `tfdist env` and `tfdist doctor`.

Opt out: TFDIST_KERAS_FIXES=0 (all), or a comma list of "-name" to skip single fixes.
"""

from __future__ import annotations

import warnings
from typing import Mapping, Optional

from tfdist import flavour, releases, settings
from tfdist.fixes import (
    callbacks,
    collectives,
    datasets,
    executions,
    iterators,
    multi_worker,
    parameter_server,
    replicas,
    tensorflow,
    tf_keras_parameter_server,
    uneven_batches,
)
from tfdist.fixes.record import (
    APPLIED,
    APPLIES,
    NOT_NEEDED,
    OFF,
    SKIPPED,
    CompatibilityWarning,
    Fix,
    FixStatus,
)

FIXES = {
    fix.name: fix
    for module in (
        replicas,
        uneven_batches,
        datasets,
        multi_worker,
        executions,
        callbacks,
        parameter_server,
        tf_keras_parameter_server,
        tensorflow,
        iterators,
        collectives,
    )
    for fix in module.FIXES
}

_STATUS: dict = {}  # name -> FixStatus, once a fix was considered in this process

# Records of other areas of tfdist that patch Keras the same way but are applied by their own
# entry point, not by make_strategy (tfdist.keras_distribution): name -> Fix, once registered.
REGISTERED: dict = {}


def register(records) -> None:
    """Makes `records` (Fix) known to `report()` and TFDIST_KERAS_FIXES, without applying them.

    For an area that applies its records itself, with `apply_fixes(records)`.
    """
    for fix in records:
        if fix.name in FIXES:
            raise ValueError(f"fix {fix.name!r} is already in FIXES")
        REGISTERED[fix.name] = fix


def fixes_enabled(env: Optional[Mapping[str, str]] = None) -> bool:
    """False when TFDIST_KERAS_FIXES turns every fix off ("0", "false", "no" or "off")."""
    return settings.KERAS_FIXES.get(env).enabled


def turned_off(env: Optional[Mapping[str, str]] = None) -> set:
    """Fixes named "-name" in TFDIST_KERAS_FIXES (e.g. "-no_xla_step_across_replicas")."""
    names = set(settings.KERAS_FIXES.get(env).turned_off)
    known = {**FIXES, **REGISTERED}
    unknown = names - set(known)
    if unknown:
        raise ValueError(
            f"{settings.KERAS_FIXES.name} names unknown fix(es) {sorted(unknown)}. Known: "
            f"{', '.join(known)}."
        )
    return names


def _status(fix: Fix, version, skip: set):
    """(FixStatus, the variant to apply or None): the targets are checked once, here."""
    if flavour.uses_legacy_keras() and fix.library == "keras":
        return FixStatus(fix.name, NOT_NEEDED, "tf_keras is in use: the bug is Keras 3's"), None
    if not flavour.uses_legacy_keras() and fix.library == "tf_keras":
        return FixStatus(fix.name, NOT_NEEDED, "Keras 3 is in use: the bug is tf_keras'"), None
    if not fixes_enabled():
        return FixStatus(fix.name, OFF, f"{settings.KERAS_FIXES.name}=0"), None
    if fix.name in skip:
        return FixStatus(fix.name, OFF, f"{settings.KERAS_FIXES.name}=-{fix.name}"), None
    state, reason, variant = fix.check(
        _tensorflow_version() if fix.library == "tensorflow" else version
    )
    return FixStatus(fix.name, state, reason), variant


def _tensorflow_version():
    import tensorflow as tf

    return releases.parse_version(tf.__version__)


def report() -> list:
    """Each fix's FixStatus in this process: as applied, or as it would be (nothing applied).

    The TensorFlow internals tfdist reads come last, as "found" or "missing".
    """
    version = flavour.keras_version_tuple()
    skip = turned_off()
    statuses = []
    for name, fix in {**FIXES, **REGISTERED}.items():
        status = _STATUS.get(name) or _status(fix, version, skip)[0]
        if name not in _STATUS and status.state == APPLIED:  # not yet: make_strategy applies it
            status = FixStatus(name, APPLIES, status.reason)
        statuses.append(status)
    for internal in tensorflow.INTERNALS:
        problem = internal.problem()
        state = "missing" if problem else "found"
        statuses.append(FixStatus(internal.name, state, problem or internal.used_for))
    return statuses


def _where(fix: Fix) -> str:
    if fix.library == "tensorflow":
        import tensorflow as tf

        return f"TensorFlow {tf.__version__}"
    return f"Keras {flavour.keras_version()}"


def apply_fixes(records=None) -> list:
    """Applies every fix that this Keras needs and whose targets match, once per process.

    Args:
        records: iterable of Fix. Defaults to FIXES (what make_strategy applies); an area with
            its own entry point passes its registered records.

    Returns the names of the fixes applied so far. Never raises for a missing or changed
    target: that fix is skipped with one CompatibilityWarning.
    """
    records = {fix.name: fix for fix in (FIXES.values() if records is None else records)}
    skip = turned_off()
    if all(name in _STATUS or name in skip for name in records):
        return applied()  # every fix decided already (custom-loop helpers call this each step)
    import tensorflow as tf

    releases.warn_if_untested(tf.__version__, flavour.keras_version(), flavour.keras_flavour())
    version = flavour.keras_version_tuple()
    for name, fix in records.items():
        if name in _STATUS:
            continue
        status, variant = _status(fix, version, skip)
        if status.state == APPLIED:
            try:
                variant.apply()
            except Exception as err:  # an internal of an unforeseen shape: skip, never break
                status = FixStatus(name, SKIPPED, f"applying failed: {type(err).__name__}: {err}")
        if status.state == SKIPPED:
            warnings.warn(
                f"tfdist skips its fix {name!r} on {_where(fix)}: "
                f"{status.reason}. Consequence: {fix.consequence} HINT: use a release of the "
                "tested matrix (`tfdist env`), or report this release as an issue.",
                CompatibilityWarning,
                stacklevel=3,
            )
        if status.state != OFF:  # a fix turned off by the variable may be turned on later
            _STATUS[name] = status
    return sorted(n for n, s in _STATUS.items() if s.state == APPLIED)


def applied() -> list:
    return sorted(n for n, s in _STATUS.items() if s.state == APPLIED)


def status(name: str) -> Optional[FixStatus]:
    """The FixStatus `apply_fixes` gave fix `name` in this process (None: not considered yet,
    or turned off)."""
    return _STATUS.get(name)


def markdown_table() -> str:
    """The docs' table of fixes (docs/concepts/strategies.md), made from the records."""
    lines = [
        "| fix | strategies | releases | upstream | the bug it removes |",
        "| --- | --- | --- | --- | --- |",
    ]
    for fix in FIXES.values():
        strategies = ", ".join(fix.strategies)
        library = fix.library_name
        releases_ = f"{library} {fix.releases}".replace(" | ", f" \\| {library} ")
        if fix.fixed_in:
            releases_ += f" (fixed upstream in {fix.fixed_in})"
        lines.append(
            f"| `{fix.name}` | {strategies} | {releases_} | {fix.upstream} | {fix.summary} |"
        )
    return "\n".join(lines)
