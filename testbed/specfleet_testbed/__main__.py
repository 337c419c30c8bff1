"""Command line for the local test bed.

    python -m specfleet_testbed up [--dir DIR] [--nodes N]   # start; prints export lines
    python -m specfleet_testbed status [--dir DIR]           # which recorded processes run
    python -m specfleet_testbed down [--dir DIR] [--keep]    # stop exactly the recorded PIDs
    python -m specfleet_testbed bin                          # print the bin dir (builds if needed)

``up`` detaches the processes (own session, no tie to this shell) and records their PIDs in
``DIR/state.json``; ``eval "$(python -m specfleet_testbed up)"`` sets KUBECONFIG and PATH.
Run it with ``testbed/`` on PYTHONPATH (or from inside ``testbed/``).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from pathlib import Path

from .binaries import BinariesError, ensure_binaries
from .cluster import STATE_FILE, Cluster, ClusterError

DEFAULT_DIR = Path(tempfile.gettempdir()) / "specfleet-testbed"


def _up(args: argparse.Namespace) -> int:
    work_dir: Path = args.dir
    if (work_dir / STATE_FILE).exists():
        running = Cluster.attach(work_dir).alive()
        if any(running.values()):
            print(f"a cluster is already up in {work_dir}; run `down` first", file=sys.stderr)
            return 1
        print(f"{work_dir} holds a stopped cluster; run `down` to clear it", file=sys.stderr)
        return 1
    cluster = Cluster(work_dir=work_dir, nodes=args.nodes, detach=True, keep=True)
    cluster.start()
    print(f"cluster up: {cluster.server}, state in {work_dir / STATE_FILE}", file=sys.stderr)
    print(f"stop it with: python -m specfleet_testbed down --dir {work_dir}", file=sys.stderr)
    # stdout carries only shell code, so `eval "$(... up)"` works.
    print(f"export KUBECONFIG={shlex.quote(str(cluster.kubeconfig))}")
    print(f'export PATH={shlex.quote(str(cluster.bin_dir))}:"$PATH"')
    return 0


def _down(args: argparse.Namespace) -> int:
    cluster = Cluster.attach(args.dir)
    cluster.keep = args.keep
    cluster.stop()
    print(f"stopped the cluster in {args.dir}", file=sys.stderr)
    return 0


def _status(args: argparse.Namespace) -> int:
    cluster = Cluster.attach(args.dir)
    alive = cluster.alive()
    for record in cluster.processes:
        state = "running" if alive[record.name] else "gone"
        print(f"{record.name:<24} pid {record.pid:<8} {state:<8} log {record.log}")
    return 0 if all(alive.values()) else 1


def _bin(_: argparse.Namespace) -> int:
    print(ensure_binaries())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_testbed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func, help_text in (
        ("up", _up, "start a cluster in DIR"),
        ("down", _down, "stop the cluster recorded in DIR and remove DIR"),
        ("status", _status, "show the recorded processes"),
    ):
        cmd = sub.add_parser(name, help=help_text)
        cmd.add_argument(
            "--dir", type=Path, default=DEFAULT_DIR, help=f"state and work dir (default {DEFAULT_DIR})"
        )
        cmd.set_defaults(func=func)
    sub.choices["up"].add_argument("--nodes", type=int, default=3, help="fake GPU nodes")
    sub.choices["down"].add_argument(
        "--keep", action="store_true", help="keep DIR (logs, certificates) after stopping"
    )
    cmd = sub.add_parser("bin", help="print the bin dir, building the binaries if needed")
    cmd.set_defaults(func=_bin)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except (ClusterError, BinariesError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
