"""Benchmark: ``otel-lockwatch merge`` over 10^4 manifests of 100 lock classes each (the goal:
under 60 s and under 1 GiB of peak memory).

Each generated manifest is one process of a fleet that shares its lock classes: 100 classes,
each with a wait and a hold histogram of a few dozen samples over many buckets, 8 workers per
class (the process's threads, ``worker-0`` .. ``worker-7``), a few lock-order edges (one pair in
opposite orders in some processes, so the merge finds a cycle across processes), a section
array and the pool's size. The manifests are written to a temporary directory by
``evaluate()`` and ``dump_manifest`` (not timed); the timed part is one ``otel-lockwatch merge
DIR -o OUT --jobs J`` subprocess (J: ``--jobs``, by default every CPU this process may use, as
the command's own default). Its memory is the larger of two peaks: the summed resident memory
of the merge and every process under it (its jobs), sampled from ``/proc`` every 20 ms, and the
largest single process's (``getrusage(RUSAGE_CHILDREN)``, exact), which a sample may miss.

Run: ``python benchmarks/bench_merge.py [--manifests N] [--locks N] [--workers N] [--jobs J]
[--keep DIR]``.

``--bound`` measures the memory bound of one input instead (the goal: a parse costs at most
``MAX_EXPANSION`` = 12 times its text, a hostile one is refused unparsed): the peak resident
memory (``wait4``, exact) and time of ``otel-lockwatch merge`` under a 1 GiB address-space limit
of a 60 MB Collector line of ``{},`` (30 times its size as parsed: refused, exit 2), and of one
large manifest (``--locks``, 2,000 by default there) as a file and as a Collector record.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from otel_lockwatch.manifest._evaluate import evaluate
from otel_lockwatch.record._histogram import LogHistogram

TARGET_S = 60.0
TARGET_MIB = 1024.0


def build_snapshot(pid: int, n_locks: int, n_workers: int, rng: random.Random) -> dict:
    """One process's snapshot: ``n_locks`` shared lock classes used by ``n_workers`` threads."""
    workers = [f"worker-{i}" for i in range(n_workers)]
    worker_wait = dict.fromkeys(workers, 0)
    locks = {}
    for i in range(n_locks):
        # A fifth of the classes are contended (their waits spread over many buckets); the
        # others never waited. Holds spread over a few powers of two, as real ones do.
        contended = i % 5 == 0
        samples = 60
        waits = [
            rng.randrange(0, 40_000_000 if i % 25 == 0 else 400_000) if contended else 0
            for _ in range(samples)
        ]
        holds = [rng.randrange(2_000, 200_000) for _ in range(samples)]
        per_worker = {}
        for j, w in enumerate(workers):
            share = waits[j::n_workers]
            per_worker[w] = {
                "acquisitions": len(share),
                "contentions": sum(1 for v in share if v),
                "wait_ns": sum(share),
                "hold_ns": sum(holds[j::n_workers]),
            }
            worker_wait[w] += sum(share)
        locks[f"app/module_{i // 10}.py:{100 + i}"] = {
            "kind": "threading.Lock",
            "acquisitions": len(waits),
            "contentions": sum(1 for v in waits if v),
            "skipped": 0,
            "timeouts": 0,
            "wait_ns": LogHistogram(waits),
            "hold_ns": LogHistogram(holds),
            "workers": per_worker,
        }
    names = sorted(locks)
    edges = [(names[k], names[k + 1]) for k in range(0, 6, 2)]
    if pid % 100 == 7:  # a few processes take one pair the other way round
        edges.append((names[1], names[0]))
    witnesses = [
        {
            "holding": a,
            "acquiring": b,
            "worker": workers[k % n_workers],
            "sites": ["app/jobs.py:run:10", "app/jobs.py:run:11"],
            "at": f"2026-12-01T08:{pid % 60:02d}:00.000Z",
            "trace_id": None,
            "span_id": None,
        }
        for k, (a, b) in enumerate(edges)
    ]
    from otel_lockwatch.record._cycles import merge_order_data

    return {
        "locks": locks,
        "workers": {w: {"observed_ns": 60 * 10**9, "wait_ns": worker_wait[w]} for w in workers},
        "lock_order": merge_order_data([{"edges": witnesses, "cycles": []}]),
        "blocking_under_lock": {},
        "sections": {"emitter": {"count": 256, "collision_waits": rng.randrange(9), "max_held": 8}},
        "pool": {"nominal": n_workers, "source": "executor", "peak_workers": n_workers},
        "process": {
            "pid": pid,
            "service.name": "bench-fleet",
            "start": "2026-12-01T08:00:00.000Z",
            "end": "2026-12-01T09:00:00.000Z",
        },
    }


def generate(directory: Path, n: int, n_locks: int, n_workers: int) -> None:
    """Write ``n`` manifests as the processes would (``evaluate``, then the manifest's JSON),
    without an fsync per file."""
    rng = random.Random(1)
    for k in range(n):
        manifest = evaluate(build_snapshot(1000 + k, n_locks, n_workers, rng))
        (directory / f"manifest.{1000 + k}.json").write_text(manifest.to_json())


def _tree_rss_kib(root: int) -> int:
    """The summed resident memory (KiB) of ``root`` and every process under it, from /proc."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/statm") as f:
                pages = int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        parents[int(entry)] = int(fields[1])
        rss[int(entry)] = pages * (os.sysconf("SC_PAGE_SIZE") // 1024)
    tree, grew = {root}, True
    while grew:
        below = {pid for pid, parent in parents.items() if parent in tree} - tree
        grew = bool(below)
        tree |= below
    return sum(rss.get(pid, 0) for pid in tree)


def run_sampled(argv: list[str]) -> tuple[subprocess.CompletedProcess[str], float, int]:
    """Run ``argv``; its wall time and the peak of its process tree's summed memory (KiB)."""
    peak = 0
    done = threading.Event()
    t0 = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.02):
            peak = max(peak, _tree_rss_kib(child.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = child.communicate()
    seconds = time.perf_counter() - t0
    done.set()
    sampler.join()
    return subprocess.CompletedProcess(argv, child.returncode, out, err), seconds, peak


MIB = 1 << 20
#: The address-space limit of the --bound runs.
BOUND_LIMIT = 1 << 30


# Runs argv[2:] under an address-space limit of argv[1] bytes, its stdout to /dev/null, and
# prints its peak resident memory (KiB, wait4). A small process forks it: the peak of a process
# forked from a large one (this one, holding the inputs) counts the pages shared before its exec.
LAUNCHER = """
import os, resource, sys
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
pid = os.fork()
if pid == 0:
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
print(usage.ru_maxrss)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_bounded(argv: list[str]) -> tuple[int, str, float, float]:
    """``argv`` under an address-space limit of :data:`BOUND_LIMIT`: exit status, the last
    line of stderr, seconds and peak resident MiB (its own, from ``wait4``)."""
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", LAUNCHER, str(BOUND_LIMIT), *argv], capture_output=True, text=True
    )
    last = (done.stderr.strip().splitlines() or [""])[-1]
    return done.returncode, last, time.perf_counter() - t0, int(done.stdout) / 1024


def bound(n_locks: int, n_workers: int) -> int:
    """The --bound measurements (see the module docstring)."""
    import json

    from otel_lockwatch.manifest._fleet import EVENT_NAME, record_attributes, record_body
    from otel_lockwatch.manifest._io import MAX_EXPANSION, parse_cost

    ok = True
    with tempfile.TemporaryDirectory(prefix="bench-merge-bound-") as tmp:
        hostile = Path(tmp) / "hostile.jsonl"
        hostile.write_bytes(b'{"resourceLogs":[' + b"{}," * 19_999_999 + b"{}]}\n")
        manifest = evaluate(build_snapshot(1000, n_locks, n_workers, random.Random(1)))
        big = Path(tmp) / "big.json"
        big.write_text(manifest.to_json())
        instance = "ab" * 16
        attributes = [
            {
                "key": k,
                "value": {"stringValue": v}
                if isinstance(v, str)
                else {"boolValue": v}
                if isinstance(v, bool)
                else {"intValue": str(v)},
            }
            for k, v in record_attributes(manifest, instance, 1, True).items()
        ]
        record = {
            "eventName": EVENT_NAME,
            "attributes": attributes,
            "body": {"stringValue": record_body(manifest, instance, 1, True)},
        }
        line = Path(tmp) / "big.jsonl"
        line.write_text(
            json.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [record]}]}]}) + "\n"
        )
        tiny = Path(tmp) / "tiny.json"
        tiny.write_text(evaluate(build_snapshot(1000, 8, 1, random.Random(1))).to_json())
        argv = [
            sys.executable,
            "-m",
            "otel_lockwatch",
            "merge",
            str(tiny),
            "-o",
            str(tiny) + ".out",
        ]
        baseline = run_bounded(argv)[3]
        print(f"baseline: a merge of a manifest of 8 classes peaks at {baseline:.0f} MiB")
        for name, path, refused in (
            ("a 60 MB line of {},", hostile, True),
            (f"a manifest of {n_locks} classes", big, False),
            ("the same as a Collector record", line, False),
        ):
            size = path.stat().st_size / MIB
            estimate = parse_cost(path.read_bytes()) / path.stat().st_size
            out = Path(tmp) / "out.json"
            argv = [
                sys.executable,
                "-m",
                "otel_lockwatch",
                "merge",
                str(path),
                "-o",
                str(out),
                "-j",
                "1",
            ]
            status, last, seconds, peak = run_bounded(argv)
            ok &= status == (2 if refused else 0)
            print(
                f"{name}: {size:.1f} MiB (estimated {estimate:.1f} x its size, bound "
                f"{MAX_EXPANSION}): exit {status} in {seconds:.1f} s, peak {peak:.0f} MiB, "
                f"{(peak - baseline) / size:.1f} x the input above the baseline, under a "
                f"{BOUND_LIMIT // MIB} MiB limit"
            )
            if refused:
                print(f"  {last}")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifests", type=int, default=10_000)
    parser.add_argument("--locks", type=int, default=100)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--keep", metavar="DIR", help="generate into DIR (reused if full)")
    parser.add_argument("--bound", action="store_true", help="measure one input's memory bound")
    args = parser.parse_args()
    if args.bound:
        return bound(2000 if args.locks == 100 else args.locks, args.workers)
    with tempfile.TemporaryDirectory(prefix="bench-merge-") as tmp:
        directory = Path(args.keep) if args.keep else Path(tmp) / "manifests"
        directory.mkdir(parents=True, exist_ok=True)
        if len(list(directory.glob("manifest.*.json"))) != args.manifests:
            t0 = time.perf_counter()
            generate(directory, args.manifests, args.locks, args.workers)
            print(f"generated {args.manifests} manifests in {time.perf_counter() - t0:.1f} s")
        size = sum(p.stat().st_size for p in directory.iterdir()) / 2**20
        out = Path(tmp) / "merged.json"
        argv = [sys.executable, "-m", "otel_lockwatch", "merge", str(directory), "-o", str(out)]
        done, seconds, peak_kib = run_sampled([*argv, "--jobs", str(args.jobs)])
        largest_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB
        if done.returncode != 0:
            print(done.stderr, file=sys.stderr)
            return 1
        print(done.stdout.strip())
        # The sampled sum may miss a peak shorter than a sample; the largest process's is exact.
        peak_mib = max(peak_kib / 1024, largest_mib)
        print(
            f"merge of {args.manifests} manifests x {args.locks} classes ({size:.0f} MiB) with "
            f"--jobs {args.jobs} on {os.cpu_count()} CPUs: {seconds:.1f} s (target < "
            f"{TARGET_S:.0f} s), peak memory {peak_mib:.0f} MiB (target < {TARGET_MIB:.0f} MiB;"
            f" all processes' sum, sampled: {peak_kib / 1024:.0f} MiB; the largest process: "
            f"{largest_mib:.0f} MiB)"
        )
        return 0 if seconds < TARGET_S and peak_mib < TARGET_MIB else 1


if __name__ == "__main__":
    sys.exit(main())
