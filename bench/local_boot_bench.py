"""How soon a local cluster trains: VMs forked with their imports done against VMs that each import.

``python -m bench.local_boot_bench [--nodes 6] [--netns] [--repeat 2]`` brings a local cluster of N one-slot VMs
up (``spotmorph local up``, as a user runs it: a new interpreter), submits the demo job in float64 (the pipeline
profile of the chaos test, so it spreads over every VM), and measures `local up`'s seconds, the seconds from
the submission to the job's third step, and the CPU seconds every process of the cluster used by then
(``/proc``: the controller, the agents, the zygotes, the trainers; and the `local up` and `submit` commands). The
two modes alternate: VMs forked by `local up` (the default) and ``SPOTMORPH_LOCAL_FORK_VMS=0`` (each VM a new
process whose zygote imports torch itself).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from spotmorph.local import vm_start
from spotmorph.local.harness import LocalCluster
from spotmorph.local.unplanned import pipeline_profile

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds_of_tree(root: Path) -> float:
    """CPU seconds (user + system, with their waited-for children) of every live process whose command
    line names ``root``: the cluster's processes, which all carry its folder in their arguments."""
    total = 0.0
    needle = str(root).encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if needle not in Path(f"/proc/{entry}/cmdline").read_bytes():
                continue
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += sum(int(f) for f in fields[11:15]) / TICKS  # utime, stime, cutime, cstime
    return total


def once(fork: bool, nodes: int, netns: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        env = {vm_start.FORK_ENV: "1" if fork else "0", "SPOTMORPH_WARM_IMPORTS": ""}
        cluster = LocalCluster(tmp / "home", env)
        try:
            before = os.times()
            started = time.monotonic()
            cluster.up(nodes=nodes, slots=1, heartbeat_expiry=4.0, netns=netns)
            up = time.monotonic() - started
            submitted = time.monotonic()
            job = cluster.submit(
                steps=1000,
                global_batch=16,
                seed=5,
                dtype="float64",
                checkpoint_dir=tmp / "ckpt",
                profile=pipeline_profile(tmp / "profile.json"),
            )
            cluster.wait_step(job, 3, 300)
            to_step = time.monotonic() - submitted
            after = os.times()  # the `spotmorph` commands this ran (local up, submit), waited for
            commands = after.children_user + after.children_system - before.children_user - before.children_system
            cpu = cpu_seconds_of_tree(tmp) + commands
        finally:
            cluster.down()
    return {"up": up, "to_step_3": to_step, "cpu": cpu}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.local_boot_bench")
    parser.add_argument("--nodes", type=int, default=6)
    parser.add_argument("--netns", action="store_true", help="each VM in a network namespace (needs root)")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(argv)
    found: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for _ in range(args.repeat):
        for fork in (False, True):
            found[fork].append(once(fork, args.nodes, args.netns))
    print(f"{args.nodes} VMs{' in namespaces' if args.netns else ''}, medians of {args.repeat}")
    print("| VMs started | `local up` s | submit to step 3 s | up to step 3 s | CPU-s of the cluster by then |")
    print("|---|---:|---:|---:|---:|")
    for fork, name in ((False, "each a new process (SPOTMORPH_LOCAL_FORK_VMS=0)"), (True, "forked by `local up`")):
        runs = found[fork]
        up, step = statistics.median(r["up"] for r in runs), statistics.median(r["to_step_3"] for r in runs)
        total = statistics.median(r["up"] + r["to_step_3"] for r in runs)
        cpu = statistics.median(r["cpu"] for r in runs)
        print(f"| {name} | {up:.1f} | {step:.1f} | {total:.1f} | {cpu:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
