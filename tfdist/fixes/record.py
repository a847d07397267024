"""What a fix of a Keras or TensorFlow internal is: a record that is checked before it is applied.

A `Fix` names the upstream bug it works around, the strategies it concerns, what behaves as
upstream when it is not applied, and one `Variant` per range of releases whose internals it
knows: Keras releases, or TensorFlow releases for a fix of a TensorFlow internal
(`library="tensorflow"`). A variant lists its `Target`s (module and attribute paths, with the
parameters the patch relies on). Applying a fix first picks the variant for this release and
checks that every target exists and has the expected shape; a target that is missing or
changed skips the fix with one warning, it never raises into `make_strategy`.

A `Place` is an internal found by what it is rather than by one path, where a release is likely
to rename or move it (the TensorFlow backend's trainer class, whatever its name; a backend op
module under either of its paths): targets below a place follow it, so a rename of that kind
is absorbed without a new variant.

An `Internal` is the same idea for an internal tfdist only reads (a TensorFlow protobuf module,
a Keras helper): one path per release family, the first that resolves is used.

Nothing here imports TensorFlow or Keras at import time.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Callable, Optional, Sequence, Tuple

from tfdist.releases import CompatibilityWarning, Version, parse_version

__all__ = ["CompatibilityWarning", "Fix", "FixStatus", "Internal", "Place", "Target", "Variant"]

# A fix's state: applied (in this process), applies (when a strategy is made), not needed (this
# release has no such bug, or tf_keras is in use), skipped (its target is missing or changed),
# off (TFDIST_KERAS_FIXES).
APPLIED, APPLIES, NOT_NEEDED, SKIPPED, OFF = "applied", "applies", "not needed", "skipped", "off"


def _resolve_path(path: str):
    """The object at "module:Qualified.name" (a class attribute as stored, e.g. a property).

    Raises:
        LookupError: the module or an attribute is missing; the message says which.
    """
    module_name, _, qualified = path.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as err:
        raise LookupError(f"module {module_name} is missing ({err})") from None
    return _attribute(obj, qualified, path)


def _attribute(obj, qualified: str, where: str):
    for part in qualified.split(".") if qualified else ():
        try:
            obj = inspect.getattr_static(obj, part) if isinstance(obj, type) else getattr(obj, part)
        except AttributeError:
            raise LookupError(f"{where} is missing (no {part!r})") from None
    return obj


@dataclasses.dataclass(frozen=True)
class Place:
    """An internal found by what it is, under whichever name and module a release keeps it.

    Build one with `Place.first_of` (the first of several paths that resolves) or
    `Place.class_in` (the one class a module defines that subclasses another place's class,
    or defines given attributes); name what is below it with `place.target(...)`.

    Attributes:
        name: str. What it is, as reports say it ("the TensorFlow trainer class").
        find: callable. Returns the object; raises LookupError saying what is missing.
    """

    name: str
    find: Callable[[], object] = dataclasses.field(compare=False, repr=False)

    def get(self):
        """The object this release keeps here.

        Raises:
            LookupError: it is not found; the message says where it was looked for.
        """
        return self.find()

    def target(self, attribute: str = "", params: Optional[Tuple[str, ...]] = None) -> "Target":
        """A `Target` for `attribute` ("train_step", "Variable._initialize") of this place."""
        return Target(attribute, params, place=self)

    @classmethod
    def first_of(cls, name: str, *paths: str) -> "Place":
        """The object at the first of `paths` ("module:attr" or "module") that resolves.

        Give the newest path first: an older path a release keeps only as an alias then never
        shadows the object that release really uses.
        """

        def find():
            problems = []
            for path in paths:
                try:
                    return _resolve_path(path)
                except LookupError as err:
                    problems.append(str(err))
            raise LookupError(f"{name} is missing: {'; '.join(problems)}")

        return cls(name, find)

    @classmethod
    def class_in(
        cls,
        name: str,
        module: str,
        base: Optional["Place"] = None,
        defines: Tuple[str, ...] = (),
    ) -> "Place":
        """The one class `module` defines (not imports) that subclasses `base`'s class and
        defines each of `defines` itself: found by what it is, whatever its name."""

        def find():
            parent = base.get() if base is not None else object
            found = [
                value
                for value in vars(_resolve_path(module)).values()
                if isinstance(value, type)
                and value.__module__ == module
                and value is not parent
                and issubclass(value, parent)
                and all(attribute in vars(value) for attribute in defines)
            ]
            if len(found) != 1:
                names = ", ".join(sorted(c.__name__ for c in found)) or "none"
                what = [f"subclass {parent.__name__}"] if base is not None else []
                what += [f"define {', '.join(defines)}"] if defines else []
                raise LookupError(
                    f"{name} is missing: {module} defines {len(found)} classes that "
                    f"{' and '.join(what) or 'exist'} ({names}), the fix expects one"
                )
            return found[0]

        return cls(name, find)


@dataclasses.dataclass(frozen=True)
class Target:
    """One internal a fix patches or relies on.

    Attributes:
        path: str. "module:Qualified.name", e.g.
            "keras.src.backend.tensorflow.optimizer:TFOptimizer.build"; with `place`, the
            attribute path below it ("train_step"; "" is the place itself).
        params: tuple of str or None. The leading parameter names the patch relies on (checked
            with `inspect.signature`); None checks existence only.
        place: Place or None. Where the path starts, when the internal is found by what it is.
    """

    path: str
    params: Optional[Tuple[str, ...]] = None
    place: Optional[Place] = None

    @property
    def name(self) -> str:
        """The target as reports say it: its path, or its place and the path below it."""
        if self.place is None:
            return self.path
        return f"{self.place.name}.{self.path}" if self.path else self.place.name

    def resolve(self):
        """Returns the object at `path` (a class attribute as stored, e.g. a property).

        Raises:
            LookupError: the module, the place or an attribute is missing; the message says
                which.
        """
        if self.place is None:
            return _resolve_path(self.path)
        return _attribute(self.place.get(), self.path, self.name)

    def problem(self) -> Optional[str]:
        """Why this target does not match (missing, or other parameters); None when it does."""
        try:
            obj = self.resolve()
        except LookupError as err:
            return str(err)
        if self.params is None:
            return None
        function = obj.fget if isinstance(obj, property) else obj
        function = getattr(function, "__func__", function)  # static / class methods
        try:
            names = tuple(inspect.signature(function).parameters)
        except (TypeError, ValueError):
            return f"{self.name} is not a function"
        if names[: len(self.params)] != tuple(self.params):
            return (
                f"{self.name} takes ({', '.join(names)}), the fix expects "
                f"({', '.join(self.params)}, ...)"
            )
        return None


@dataclasses.dataclass(frozen=True)
class Variant:
    """The form of a fix for a range of Keras releases: since <= version < until."""

    since: Version
    until: Optional[Version]
    targets: Tuple[Target, ...]
    apply: Callable[[], None]

    def covers(self, version: Version) -> bool:
        return self.since <= version[:2] and (self.until is None or version[:2] < self.until)

    @property
    def releases(self) -> str:
        since = ".".join(map(str, self.since))
        if self.until is None:
            return f">={since}"
        return f">={since},<{'.'.join(map(str, self.until))}"


@dataclasses.dataclass
class Fix:
    """A fix of Keras (or TensorFlow) internals, applied once by `tfdist.make_strategy`.

    Attributes:
        name: str. The name TFDIST_KERAS_FIXES=-name uses.
        summary: str. What goes wrong upstream, in one sentence.
        upstream: str. The upstream issue ("keras-team/keras#20585"), or "none found".
        strategies: tuple of str. The strategies where the bug shows.
        consequence: str. What behaves as upstream when the fix is not applied.
        library: str. "keras" (Keras 3), "tf_keras" (the legacy Keras 2, when
            TF_USE_LEGACY_KERAS=1) or "tensorflow".
        fixed_in: str or None. The first Keras release that fixed the bug upstream; from there
            on the fix is not applied.
        absent_before: str or None. Why releases older than every variant need no fix (e.g. the
            feature does not exist there).
    """

    name: str
    summary: str
    upstream: str
    strategies: Tuple[str, ...]
    consequence: str
    library: str = "keras"
    fixed_in: Optional[str] = None
    absent_before: Optional[str] = None
    variants: list = dataclasses.field(default_factory=list)

    def variant(self, since: str, until: Optional[str] = None, targets: Sequence = ()) -> Callable:
        """Decorator: registers `function` as this fix's form for Keras since <= v < until.

        targets: Target or "module:attr" strings (existence only).
        """

        def register(function):
            checked = tuple(t if isinstance(t, Target) else Target(t) for t in targets)
            self.variants.append(
                Variant(
                    parse_version(since)[:2],
                    parse_version(until)[:2] if until else None,
                    checked,
                    function,
                )
            )
            return function

        return register

    def select(self, version: Version) -> Tuple[Optional[Variant], str]:
        """(variant, "") for `version`, or (None, why no variant is needed)."""
        if self.fixed_in and version[:2] >= parse_version(self.fixed_in)[:2]:
            return None, f"fixed upstream in {self.library_name} {self.fixed_in}"
        for variant in self.variants:
            if variant.covers(version):
                return variant, ""
        newest = max(self.variants, key=lambda v: v.since)
        if newest.until is not None and version[:2] >= newest.until:
            # Declared for older releases only: the newest form is tried on a newer release.
            return newest, ""
        oldest = min(v.since for v in self.variants)
        if version[:2] < oldest:
            return None, self.absent_before or (
                f"the bug is not in releases before {self.library_name} "
                f"{'.'.join(map(str, oldest))}"
            )
        return None, "no form of this fix for this release"

    def check(self, version: Version) -> Tuple[str, str, Optional[Variant]]:
        """(state, reason, variant) without applying: APPLIED means "would be applied"."""
        variant, reason = self.select(version)
        if variant is None:
            return NOT_NEEDED, reason, None
        problems = [p for p in (t.problem() for t in variant.targets) if p]
        if problems:
            return SKIPPED, "; ".join(problems), variant
        return APPLIED, f"variant for {self.library_name} {variant.releases}", variant

    @property
    def library_name(self) -> str:
        """The library whose release picks the variant: "Keras", "tf_keras" or "TensorFlow"."""
        return {"tensorflow": "TensorFlow", "tf_keras": "tf_keras"}.get(self.library, "Keras")

    @property
    def releases(self) -> str:
        """The Keras releases this fix is for, e.g. ">=3.5,<3.11 | >=3.11"."""
        return " | ".join(v.releases for v in self.variants)


@dataclasses.dataclass(frozen=True)
class FixStatus:
    """One fix's state in this process (see APPLIED, APPLIES, ...), and why."""

    name: str
    state: str
    reason: str

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Internal:
    """An internal tfdist reads but does not patch, at one of several paths by release.

    Attributes:
        name: str. What it is ("coordination_config_pb2").
        used_for: str. What tfdist does with it, for the error when no path resolves.
        paths: tuple of str. "module:attr" paths, tried in order.
    """

    name: str
    used_for: str
    paths: Tuple[str, ...]

    def get(self):
        """The object at the first path that resolves.

        Raises:
            RuntimeError: none resolves; names the paths tried and the release.
        """
        try:
            return Place.first_of(self.name, *self.paths).get()
        except LookupError as err:
            problem = str(err)
        import tensorflow as tf

        raise RuntimeError(
            f"tfdist cannot find {self.name} ({self.used_for}) in TensorFlow {tf.__version__}: "
            f"{problem}. HINT: install a release of the tested matrix (`tfdist env` lists it) "
            "and report this release as an issue."
        )

    def problem(self) -> Optional[str]:
        try:
            self.get()
        except RuntimeError as err:
            return str(err)
        return None
