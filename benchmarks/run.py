"""Runs every benchmark of the suite, prints one table and writes the rows as JSON.

    python benchmarks/run.py                 # every benchmarks/bench_*.py, default settings
    python benchmarks/run.py --quick         # smaller, fewer repeats (a smoke run)
    python benchmarks/run.py --only keras    # one module (bench_keras.py); repeatable
    python benchmarks/run.py --list          # the modules found

A benchmark module is a file `benchmarks/bench_<name>.py` with a module-level function
`run(quick: bool) -> list[dict]`, each dict a row made by `common.row(...)` (see
benchmarks/README.md). A module that fails becomes a FAILED row; the others still run.
"""

from __future__ import annotations

import argparse
import ast
import glob
import importlib
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import common  # noqa: E402


def _has_run(path: str) -> bool:
    """True when the file defines a module-level `run` function (read, not imported)."""
    with open(path) as f:
        tree = ast.parse(f.read(), filename=path)
    return any(
        isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "run"
        for node in tree.body
    )


def discover() -> tuple:
    """(names, skipped): the bench_<name>.py modules with a run() function, and those without.

    Names are "keras" for bench_keras.py, sorted.
    """
    names, skipped = [], []
    for path in sorted(glob.glob(os.path.join(HERE, "bench_*.py"))):
        name = os.path.basename(path)[len("bench_") : -len(".py")]
        (names if _has_run(path) else skipped).append(name)
    return names, skipped


def _selected(names: list, skipped: list, only: list) -> list:
    if not only:
        return names
    wanted = [os.path.basename(o) for o in only]
    wanted = [w[:-3] if w.endswith(".py") else w for w in wanted]
    wanted = [w[len("bench_") :] if w.startswith("bench_") else w for w in wanted]
    unknown = [w for w in wanted if w not in names]
    if unknown:
        hint = [w for w in unknown if w in skipped]
        raise SystemExit(
            f"--only {', '.join(unknown)}: no such benchmark. Found: {', '.join(names)}."
            + (f" bench_{hint[0]}.py has no module-level run(quick) function." if hint else "")
        )
    return [n for n in names if n in wanted]


def run_module(name: str, quick: bool) -> tuple:
    """Imports bench_<name> and runs it. Returns (rows, seconds, error or None)."""
    start = time.perf_counter()
    try:
        module = importlib.import_module(f"bench_{name}")
        runner = getattr(module, "run", None)
        if not callable(runner):
            raise TypeError(f"bench_{name}.py has no run(quick) function")
        rows = list(runner(quick=quick))
        for r in rows:
            common.check_row(r)
            r.setdefault("module", name)
        return rows, time.perf_counter() - start, None
    except Exception as err:  # one broken module must not lose the others' results
        text = f"{type(err).__name__}: {err}"
        sys.stderr.write(f"[bench {name}] failed:\n{traceback.format_exc()}\n")
        row = common.error_row(
            f"bench_{name}",
            text.splitlines()[0][:300],
            module=name,
            traceback=traceback.format_exc(),
        )
        return [row], time.perf_counter() - start, text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="small settings and fewer repeats (a smoke run)"
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help="run only this benchmark (keras or bench_keras); repeatable",
    )
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument(
        "--out", default=None, help="JSON path (default benchmarks/results/<timestamp>.json)"
    )
    args = parser.parse_args(argv)

    names, skipped = discover()
    if args.list:
        print("\n".join(names))
        if skipped:
            print(f"(skipped, no run(quick) function: {', '.join(skipped)})")
        return 0
    for name in skipped:
        if not args.only:
            print(
                f"[bench {name}] skipped: bench_{name}.py has no module-level run(quick) function",
                flush=True,
            )
    names = _selected(names, skipped, args.only)
    started = time.time()
    rows, timings, failed = [], {}, []
    for name in names:
        print(f"[bench {name}] running{' (quick)' if args.quick else ''} ...", flush=True)
        module_rows, seconds, error = run_module(name, args.quick)
        rows += module_rows
        timings[name] = round(seconds, 1)
        if error:
            failed.append(name)
        print(f"[bench {name}] {'FAILED' if error else 'done'} in {seconds:.0f} s", flush=True)
    wall = time.time() - started
    print()
    common.print_table(rows)
    missed = [
        f"{r['scenario']} vs {r['alternative_name']}" for r in rows if r.get("target_met") is False
    ]
    print(
        f"\n{len(rows)} row(s) from {len(names)} benchmark(s) in {wall:.0f} s"
        f" ({', '.join(f'{n} {s:.0f} s' for n, s in timings.items())})."
    )
    if missed:
        print(f"Targets missed: {'; '.join(missed)}.")
    path = common.write_json(
        rows,
        {
            "quick": args.quick,
            "modules": names,
            "module_seconds": timings,
            "wall_seconds": round(wall, 1),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
            "argv": sys.argv[1:],
        },
        path=args.out,
    )
    print(f"Results: {os.path.relpath(path)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
