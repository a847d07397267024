"""The docs' Python names against the code: every `tfdist.X` and `tfdist.pkg.X` that the
README, docs/ and examples/ name exists, and every signature the docs write out is the code's.

Nothing here imports TensorFlow: a name in a module that imports TensorFlow when it is loaded
(tfdist.horovod's) is looked up in that module's source instead.
"""

import ast
import importlib
import inspect
import re
import sys

import pytest

from helpers.docs import DOCS
from helpers.paths import EXAMPLES, ROOT

PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
FILES = PAGES + sorted(EXAMPLES.rglob("*.py")) + sorted(EXAMPLES.rglob("*.md"))

# tfdist.a.b as a Python name: not part of a path ("docs/tfdist.md"), a file name or a URL.
NAME = re.compile(r"(?<![\w./-])tfdist(?:\.[A-Za-z_]\w*)+")
FILE_SUFFIXES = ("md", "py", "yaml", "yml", "log", "json", "txt")
FORBIDDEN = ("tensorflow", "keras", "tf_keras")


def _names():
    names = {}
    for path in FILES:
        for match in NAME.finditer(path.read_text()):
            name = match.group(0)
            if name.rsplit(".", 1)[1] not in FILE_SUFFIXES:
                names.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return names


NAMES = _names()


class _NeedsTensorFlow(Exception):
    pass


class _NoTensorFlow:
    """A meta-path finder that refuses TensorFlow and Keras with _NeedsTensorFlow."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in FORBIDDEN:
            raise _NeedsTensorFlow(name)
        return None


def _source(module_name: str):
    """The file of tfdist module `module_name`, found without importing it, or None."""
    base = ROOT.joinpath(*module_name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _bound_in_source(module_name: str, attribute: str) -> bool:
    """`attribute` is defined or imported at the top level of the module's source."""
    tree = ast.parse(_source(module_name).read_text())
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound = {node.name}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound = {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound = {t.id for t in targets if isinstance(t, ast.Name)}
        else:
            continue
        if attribute in bound:
            return True
    return False


def resolve(name: str):
    """The object `name` ("tfdist.a.b.c") names, or None where only its module's source can say
    (a module that imports TensorFlow). Raises LookupError when it does not exist."""
    parts = name.split(".")
    guard = _NoTensorFlow()
    sys.meta_path.insert(0, guard)
    try:
        for i in range(len(parts), 0, -1):
            module_name = ".".join(parts[:i])
            try:
                obj = importlib.import_module(module_name)
                break
            except ModuleNotFoundError as err:
                if not (module_name + ".").startswith(f"{err.name}."):
                    raise  # a module that exists failed to import
            except _NeedsTensorFlow:
                if _source(module_name) is None:
                    continue  # an attribute of a module that imports TensorFlow
                rest = parts[i:]
                if rest and not _bound_in_source(module_name, rest[0]):
                    raise LookupError(f"{name}: {module_name} defines no {rest[0]}") from None
                return None
        for part in parts[i:]:
            if not hasattr(obj, part):
                raise LookupError(f"{name}: {'.'.join(parts[:i])} has no {part!r}")
            obj = getattr(obj, part)
            i += 1
        return obj
    finally:
        sys.meta_path.remove(guard)


def test_names_are_found():
    assert len(NAMES) >= 80, sorted(NAMES)
    assert "tfdist.make_strategy" in NAMES and "tfdist.horovod.tensorflow.keras" in NAMES


@pytest.mark.parametrize("name", sorted(NAMES))
def test_every_tfdist_name_the_docs_use_exists(name):
    try:
        resolve(name)
    except LookupError as err:
        pytest.fail(f"{err} (named in {', '.join(sorted(NAMES[name]))})")


# ------------------------------------------------------------------------- the signatures

# A documented signature: an inline code span `tfdist.name(parameters)` (or a class of the tfdist
# namespace, `ClusterSpec.local(...)`) whose parameters read as a `def`'s: with a `*`, or at
# least two of them whose defaults are literals. A call such as `local(workers=2)` or
# `fit(epochs=epochs, ...)` is an example, not a signature.
SPAN = re.compile(r"(?<!`)`([^`]+)`(?!`)")
CALL = re.compile(r"^((?:tfdist\.)?[A-Za-z_][\w.]*)\((.*)\)(?:\s*->.*)?$", re.S)


def _literal(node) -> bool:
    try:
        ast.literal_eval(node)
    except ValueError:
        return False
    return True


def _signatures():
    found = []
    for path in PAGES:
        for match in SPAN.finditer(path.read_text()):
            call = CALL.match(" ".join(match.group(1).split()))
            if not call:
                continue
            name = call.group(1)
            if not name.startswith("tfdist."):
                if not name[0].isupper():
                    continue  # `fit(x, y)`: Keras' or a model's, not tfdist's
                name = "tfdist." + name
            try:
                documented = ast.parse(f"def f({call.group(2)}): pass").body[0].args
                obj = resolve(name)
            except (SyntaxError, LookupError):
                continue  # not a parameter list, or not tfdist's (`model.fit(x, y)`)
            if obj is None or not callable(obj):
                continue
            params = documented.posonlyargs + documented.args + documented.kwonlyargs
            star = documented.kwonlyargs or documented.vararg or documented.kwarg
            defaults = [d for d in documented.defaults + documented.kw_defaults if d is not None]
            if star or (len(params) >= 2 and all(map(_literal, defaults))):
                found.append((f"{path.relative_to(ROOT)}: {name}", obj, documented))
    return found


SIGNATURES = _signatures()


def _as_documented(args):
    """[(kind, name, default source or None)] of a parsed parameter list."""
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    rows = [("positional", a.arg, d) for a, d in zip(positional, defaults)]
    if args.vararg:
        rows.append(("*args", args.vararg.arg, None))
    rows += [("keyword", a.arg, d) for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    if args.kwarg:
        rows.append(("**kwargs", args.kwarg.arg, None))
    return [(kind, name, None if d is None else ast.unparse(d)) for kind, name, d in rows]


def _in_code(obj):
    kinds = {
        inspect.Parameter.POSITIONAL_ONLY: "positional",
        inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
        inspect.Parameter.VAR_POSITIONAL: "*args",
        inspect.Parameter.KEYWORD_ONLY: "keyword",
        inspect.Parameter.VAR_KEYWORD: "**kwargs",
    }
    rows = []
    for p in inspect.signature(obj).parameters.values():
        default = None if p.default is p.empty else p.default
        rows.append((kinds[p.kind], p.name, default, p.default is not p.empty))
    return rows


def test_signatures_are_found():
    names = [where.split(": ")[1] for where, _, _ in SIGNATURES]
    assert "tfdist.make_strategy" in names and "tfdist.ClusterSpec.local" in names
    assert len(SIGNATURES) >= 12, names


@pytest.mark.parametrize("where, obj, documented", SIGNATURES, ids=[s[0] for s in SIGNATURES])
def test_every_documented_signature_is_the_codes(where, obj, documented):
    doc = _as_documented(documented)
    code = _in_code(obj)
    assert [(k, n) for k, n, _ in doc] == [(k, n) for k, n, _, _ in code], (
        f"{where} documents ({', '.join(n for _, n, _ in doc)}); the code takes "
        f"({', '.join(n for _, n, _, _ in code)})"
    )
    for (_, name, text), (_, _, default, has_default) in zip(doc, code):
        if text is None or text == "...":
            continue  # no default written, or one the docs leave to the reference
        assert has_default, f"{where}: {name} has no default in the code"
        assert ast.literal_eval(text) == default, f"{where}: {name}={text}, the code {default!r}"
