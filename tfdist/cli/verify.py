"""`tfdist verify`: train a script's model under every strategy and compare, step by step, with
the first (one device): the same training? (`tfdist.testing.verify`)."""

from __future__ import annotations

from tfdist.cli.arguments import positive_int
from tfdist.strategy.registry import POOLED


def add_commands(sub) -> None:
    """Adds `verify` to the subparsers `sub`."""
    ver = sub.add_parser(
        "verify",
        help="train a script's build_model() under every strategy and compare with one device",
    )
    ver.add_argument(
        "script", help="a .py file defining build_model(), data() and GLOBAL_BATCH_SIZE"
    )
    ver.add_argument(
        "--strategies",
        type=lambda text: [part.strip() for part in text.split(",") if part.strip()],
        help=f"comma-separated, the first is the reference (default: {', '.join(POOLED)})",
    )
    ver.add_argument("--global-batch-size", "--global_batch_size", type=positive_int)
    ver.add_argument("--steps", type=positive_int, help="steps per epoch (default 4)")
    ver.add_argument("--epochs", type=positive_int, help="epochs (default 2)")
    ver.add_argument("--rtol", type=float, help="relative tolerance (default 1e-4)")
    ver.add_argument("--atol", type=float, help="absolute tolerance (default 1e-5)")
    ver.add_argument(
        "--replicas", type=positive_int, default=2, help="mirrored's virtual CPUs (default 2)"
    )
    ver.add_argument(
        "--workers",
        type=positive_int,
        default=2,
        help="multi_worker_mirrored's processes (default 2)",
    )
    ver.add_argument(
        "--keep-random-layers",
        "--keep_random_layers",
        action="store_true",
        help="leave Dropout and noise layers on (default: their rate is set to 0 in every run)",
    )


def verify_command(args) -> int:
    """Runs the comparison; returns its exit code (`tfdist.testing.verify.verify_script`)."""
    from tfdist.testing.verify import verify_script

    return verify_script(
        args.script,
        global_batch_size=args.global_batch_size,
        strategies=args.strategies,
        steps=args.steps,
        epochs=args.epochs,
        rtol=args.rtol,
        atol=args.atol,
        replicas=args.replicas,
        workers=args.workers,
        random_layers="keep" if args.keep_random_layers else "off",
    )
