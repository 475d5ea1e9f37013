"""coopmat-dask-worker SCHEDULER [--devices ...]: one `dask worker` per cooperative-matrix
device of this host, each pinned to its device (COOPMAT_DEVICE) with a GPU=1 resource, as
dask-cuda's `dask cuda worker` does for CUDA. `dask scheduler` on one host and this
command on every host is the whole set-up."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from types import FrameType

from coopmat import CoopmatError
from coopmat.dask.devices import ENV_VAR, describe, placements, worker_env

PROG = "coopmat-dask-worker"
STOP_GRACE_S = 10.0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Start one Dask worker per cooperative-matrix device of this host, each "
                    "pinned to its device. Arguments it does not know (--host, "
                    "--memory-limit, --local-directory, ...) go to every `dask worker`.")
    p.add_argument("scheduler", nargs="?", help="the scheduler's address (tcp://host:8786); "
                   "or give --scheduler-file, which goes to dask worker")
    p.add_argument("--devices", help="comma-separated devices (index, name part, UUID or PCI "
                   "bus id); one listed twice gets two workers. Default: $COOPMAT_DEVICE if "
                   "set, else every cooperative-matrix device of this host")
    p.add_argument("--nthreads", type=int, default=2,
                   help="threads per worker (default 2: a task waits on the worker for the "
                        "device while the last one finishes; products run one at a time)")
    p.add_argument("--name-prefix", default=socket.gethostname(),
                   help="worker names are PREFIX-0, PREFIX-1, ... (default: the host name)")
    return p


def worker_commands(scheduler: str | None, devices: list[str] | None, nthreads: int,
                    prefix: str, extra: list[str]) -> list[tuple[list[str], dict[str, str], str]]:
    """(command, environment, description) of each worker process to start."""
    out = []
    for i, place in enumerate(placements(devices)):
        cmd = [sys.executable, "-m", "distributed.cli.dask_worker",
               *([scheduler] if scheduler else []), "--nworkers", "1",
               "--nthreads", str(nthreads), "--resources", "GPU=1",
               "--preload", "coopmat.dask.preload", "--name", f"{prefix}-{i}", *extra]
        out.append((cmd, {**os.environ, **worker_env(place.pin)}, describe(place.info)))
    return out


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main(argv: list[str] | None = None) -> int:
    args, extra = _parser().parse_known_args(argv)
    if not args.scheduler and not any(a.startswith("--scheduler-file") for a in extra):
        _parser().error("give the scheduler's address or --scheduler-file")
    selectors = args.devices.split(",") if args.devices else None
    if selectors is None and os.environ.get(ENV_VAR):
        selectors = [os.environ[ENV_VAR]]
    try:
        commands = worker_commands(args.scheduler, selectors, args.nthreads, args.name_prefix,
                                   extra)
    except (CoopmatError, ValueError) as e:
        print(f"{PROG}: no worker started: {e}", file=sys.stderr)
        return 1
    procs: list[subprocess.Popen[bytes]] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        for cmd, env, what in commands:
            print(f"{PROG}: worker {cmd[cmd.index('--name') + 1]} on {what}", file=sys.stderr,
                  flush=True)
            procs.append(subprocess.Popen(cmd, env=env))
        while True:  # the workers run until the scheduler goes, or one fails to start
            codes = [p.poll() for p in procs]
            failed = [c for c in codes if c not in (None, 0)]
            if failed:
                print(f"{PROG}: a worker exited with status {failed[0]}; stopping the others",
                      file=sys.stderr, flush=True)
                return failed[0]
            if all(c == 0 for c in codes):
                return 0
            time.sleep(0.2)
    except KeyboardInterrupt:
        return 0
    finally:
        _stop(procs)


if __name__ == "__main__":
    sys.exit(main())
