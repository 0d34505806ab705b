"""Jobs as training runs (issue 30's targets), on each backend:

    python benchmarks/bench_jobs.py [--backend in_memory,ray,monarch] [--repeats 3] [--log-bytes 1G] [--quick]

- retry: a 2-rank gloo job (init_process_group, an all-reduce, a barrier) run clean, against the same job whose
  rank 1 exits 1 after the all-reduce at its first attempt (max_retries=1): seconds from create_job to the end of
  wait(), p50 and p90 of --repeats each, interleaved, and their ratio (target: the retried job under 3x the clean).
- tail: a job that prints --log-bytes of short lines; then logs(tail=100), timed --repeats times (target: under
  1 s for 1 GB, and 100 lines), beside reading the whole log once (get_job_logs) where it is at most 256 MiB.

Each backend's cluster is made the way a user makes it (fray.cluster("name")). Not run in CI (its --quick mode
is: tests/test_benchmarks.py); timings on a shared machine are not a test.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time

import fray
from fray.testing import job_workloads

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import percentile, under_socket_guard

TIMEOUT = 600.0


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def _timed_job(cluster: fray.ClusterContext, fail_rank: int, gloo: bool = True) -> tuple[float, int]:
    start = time.perf_counter()
    if gloo:
        job = cluster.create_job(job_workloads.gloo_allreduce, args=(fail_rank,), replicas=2, max_retries=1)
    else:  # --quick: the same shape without torch (a smoke run checks the loop, not gloo)
        job = cluster.create_job(job_workloads.fail_first_attempt_on_rank, args=(fail_rank,), replicas=2, max_retries=1)
    info = job.wait(TIMEOUT)
    return time.perf_counter() - start, len(info.attempts)


def bench_retry(cluster: fray.ClusterContext, repeats: int, gloo: bool) -> None:
    if gloo:
        _timed_job(cluster, -1, gloo)  # warm-up: imports, a first gloo rendezvous
    clean, retried = [], []
    for _ in range(repeats):
        seconds, attempts = _timed_job(cluster, -1, gloo)
        assert attempts == 1
        clean.append(seconds)
        seconds, attempts = _timed_job(cluster, 1, gloo)
        assert attempts == 2
        retried.append(seconds)
    c50, r50 = percentile(clean, 50), percentile(retried, 50)
    what = "gloo job" if gloo else "job    "
    print(f"  2-rank {what}, clean:            p50 {c50:7.2f} s  p90 {percentile(clean, 90):7.2f} s")
    print(f"  rank 1 fails once, then succeeds:  p50 {r50:7.2f} s  p90 {percentile(retried, 90):7.2f} s")
    verdict = "met" if r50 < 3 * c50 else "NOT met"
    print(f"  retried / clean (p50): {r50 / c50:.2f}x (target < 3x: {verdict})")


def bench_tail(cluster: fray.ClusterContext, nbytes: int, repeats: int) -> None:
    line = "a line of a training log, loss=0.1234 step=000000\n"
    count = nbytes // len(line)
    code = (
        "import sys\nline = " + repr(line) + "\nblock = line * 10000\n"
        f"for _ in range({count} // 10000): sys.stdout.write(block)\n"
        f"sys.stdout.write(line * ({count} % 10000))\n"
    )
    start = time.perf_counter()
    job = cluster.create_job(f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}")
    job.wait(TIMEOUT)
    wrote = time.perf_counter() - start
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        last = job.logs(tail=100)
        samples.append(time.perf_counter() - start)
        assert len(last.splitlines()) == 100 and last.endswith(line), last[-200:]
    t50 = percentile(samples, 50)
    print(f"  a job printed {nbytes / 2**20:,.0f} MiB in {wrote:.1f} s")
    print(f"  logs(tail=100): p50 {t50 * 1e3:8.1f} ms  p90 {percentile(samples, 90) * 1e3:8.1f} ms  (100 lines)")
    if nbytes <= 256 << 20:
        start = time.perf_counter()
        whole = cluster.get_job_logs(job)
        print(f"  get_job_logs (all {len(whole) / 2**20:,.0f} MiB): {time.perf_counter() - start:.2f} s")
    verdict = "met" if t50 < 1.0 else "NOT met"
    print(f"  target (under 1 s for the last 100 lines): {verdict}")
    cluster.delete_job(job)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="in_memory,ray,monarch")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--log-bytes", default="1G")
    parser.add_argument("--quick", action="store_true", help="1 repeat, no torch, a 4 MiB log")
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    nbytes = 4 << 20 if args.quick else _size(args.log_bytes)
    for backend in args.backend.split(","):
        if backend not in fray.available_backends():
            print(f"{backend}: not installed, skipped")
            continue
        print(f"fray-{backend}")
        with fray.cluster(backend) as cluster:
            bench_retry(cluster, repeats, gloo=not args.quick)
            bench_tail(cluster, nbytes, repeats)
    return 0


if __name__ == "__main__":
    under_socket_guard()
    sys.exit(main())
