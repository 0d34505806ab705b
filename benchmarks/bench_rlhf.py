"""An RLHF step loop on every fray backend, beside the same loop in raw Ray and raw Monarch, in one run (issue 21).

    python benchmarks/bench_rlhf.py                      # every installed backend, one subprocess each
    python benchmarks/bench_rlhf.py --backend monarch    # one (in_memory, ray, monarch)
    python benchmarks/bench_rlhf.py --quick              # small sizes, 2 steps (a smoke run)
    python benchmarks/bench_rlhf.py --device cuda        # batches and weights on the GPU (a GPU machine)

The loop: a trainer group of `--trainers` ranks (2; torch.distributed over gloo, set up by fray with
`distributed=True`) and a rollout group of `--rollouts` members (2). Each step:

1. every rollout member returns a fresh torch batch of `--batch-mib` (32 MiB);
2. every trainer rank reads all the step's batch refs (passed as arguments: they arrive as values) and
   all-reduces a tensor of `--allreduce-mib` (1 MiB) with gloo;
3. rank 0 returns new weights: `--weights-mib` (256 MiB) as `--tensors` (8) fresh torch tensors;
4. the weights ref goes to every rollout member, which keeps the weights until the next ones come.

The step is timed from its first call until every rollout member has the weights. One warm-up step, then
`--steps` (10) timed ones: p50, p90, min and the samples are printed, with the step's copy floor: the bytes the
step creates (batches and weights) at the memcpy rate measured in the same process during the same run
(np.copyto into preallocated, pre-touched memory, sampled before and after each loop).

Raw Ray (in the ray subprocess, on fray's private Ray cluster): the same classes as Ray actors, MASTER_ADDR and
friends set by hand, batch refs passed to the trainers and the weights ref to the rollouts as Ray users do
(top-level arguments, resolved by Ray). Raw Monarch (in the monarch subprocess): the same classes as Monarch
actors on their own process meshes; Monarch has no object store, so the driver gets each value from one endpoint
and passes it to the next as an argument (what Monarch users do without torchstore).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import memcpy_seconds, percentile, run_child, under_socket_guard

MiB = 1 << 20
TIMEOUT = 600.0
SPECS = {"in_memory": "in_memory", "ray": "ray?num_cpus=8&log_to_driver=false", "monarch": "monarch?procs=2"}


# ---------------------------------------------------------------- the workload (same classes on every system)
class Rollout:
    """Returns a fresh batch each step; keeps the newest weights it was sent."""

    def __init__(self, batch_bytes: int, device: str = "cpu") -> None:
        self.n = batch_bytes // 4
        self.device = device
        self.weights: Any = None

    def generate(self, step: int) -> Any:
        import torch

        return torch.full((self.n,), float(step), dtype=torch.float32, device=self.device)

    def set_weights(self, weights: list[Any]) -> float:
        self.weights = weights  # kept until the next ones (a real rollout loads them into its model)
        return float(sum(float(t[0]) for t in weights))


class Trainer:
    """One rank: reads every batch, all-reduces, and rank 0 returns new weights."""

    def __init__(self, weights_bytes: int, tensors: int, allreduce_bytes: int, device: str = "cpu") -> None:
        import torch.distributed as dist

        self.device = device
        if not dist.is_initialized():
            dist.init_process_group("gloo")
        self.rank = dist.get_rank()
        self.tensor_n = weights_bytes // tensors // 4
        self.tensors = tensors
        self.allreduce_n = max(1, allreduce_bytes // 4)

    def train(self, step: int, *batches: Any) -> list[Any] | None:
        import torch
        import torch.distributed as dist

        seen = sum(float(b[0]) + float(b[-1]) for b in batches)  # every batch read (its ends touched)
        grad = torch.full((self.allreduce_n,), seen, dtype=torch.float32)
        dist.all_reduce(grad)
        if self.rank != 0:
            return None
        return [
            torch.full((self.tensor_n,), float(step), dtype=torch.float32, device=self.device)
            for _ in range(self.tensors)
        ]


def gloo_env(rank: int, world: int, port: int) -> dict[str, str]:
    return {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# ---------------------------------------------------------------- measuring
def timed_steps(step: Callable[[int], object], steps: int, memcpy: list[float]) -> list[float]:
    memcpy += memcpy_seconds(100 * MiB, repeats=5)
    step(0)  # warm-up
    samples = []
    for i in range(1, steps + 1):
        start = time.perf_counter()
        step(i)
        samples.append(time.perf_counter() - start)
    memcpy += memcpy_seconds(100 * MiB, repeats=5)
    return samples


# ---------------------------------------------------------------- the loop on fray, raw Ray, raw Monarch
def gpu_share(opts: argparse.Namespace) -> float:
    """What each actor asks of the one GPU with --device cuda (all of them share it), else 0."""
    return 1.0 / (opts.trainers + opts.rollouts) if opts.device == "cuda" else 0.0


def fray_loop(ctx: Any, opts: argparse.Namespace) -> Callable[[int], object]:
    import fray

    on_gpu = fray.ActorOptions(resources={"GPU": gpu_share(opts)} if opts.device == "cuda" else None)
    trainers = ctx.create_actor_group(
        Trainer,
        opts.trainers,
        args=(opts.weights, opts.tensors, opts.allreduce, opts.device),
        options=on_gpu,
        distributed=True,
    )
    rollouts = ctx.create_actor_group(Rollout, opts.rollouts, args=(opts.batch, opts.device), options=on_gpu)
    assert isinstance(trainers, fray.ActorGroup)

    def step(i: int) -> object:
        batches = rollouts.generate(i)
        trained = trainers.train(i, *batches)
        return ctx.get(rollouts.set_weights(trained[0]), timeout=TIMEOUT)

    return step


def raw_ray_loop(opts: argparse.Namespace) -> tuple[Callable[[int], object], Callable[[], object]]:
    import ray

    share = gpu_share(opts)
    trainer_cls = ray.remote(num_cpus=0, num_gpus=share)(Trainer)
    rollout_cls = ray.remote(num_cpus=0, num_gpus=share)(Rollout)
    return _ray_step(opts, trainer_cls, rollout_cls)


def raw_ray_rdt_loop(opts: argparse.Namespace) -> tuple[Callable[[int], object], Callable[[], object]]:
    """The same loop hand-written on Ray Direct Transport's cuda_ipc (--device cuda): batches and weights stay
    in the producing actor's GPU memory and go to the readers by CUDA IPC (RDT offers this to actors only)."""
    import ray

    share = gpu_share(opts)

    @ray.remote(num_cpus=0, num_gpus=share, enable_tensor_transport=True)
    class RdtRollout(Rollout):
        @ray.method(tensor_transport="cuda_ipc")
        def generate(self, step: int) -> Any:
            return Rollout.generate(self, step)

    @ray.remote(num_cpus=0, num_gpus=share, enable_tensor_transport=True)
    class RdtTrainer(Trainer):
        @ray.method(tensor_transport="cuda_ipc")
        def train(self, step: int, *batches: Any) -> list[Any] | None:
            return Trainer.train(self, step, *batches)

    return _ray_step(opts, RdtTrainer, RdtRollout)


def _ray_step(
    opts: argparse.Namespace, trainer_cls: Any, rollout_cls: Any
) -> tuple[Callable[[int], object], Callable[[], object]]:
    """The step on Ray actors of these classes, as Ray users write it: batch refs to the trainers and the weights
    ref to the rollouts as top-level arguments (resolved by Ray)."""
    import ray

    port = free_port()
    trainers = [
        trainer_cls.options(runtime_env={"env_vars": gloo_env(r, opts.trainers, port)}).remote(
            opts.weights, opts.tensors, opts.allreduce, opts.device
        )
        for r in range(opts.trainers)
    ]
    rollouts = [rollout_cls.remote(opts.batch, opts.device) for _ in range(opts.rollouts)]

    def step(i: int) -> object:
        batches = [r.generate.remote(i) for r in rollouts]
        trained = [t.train.remote(i, *batches) for t in trainers]
        return ray.get([r.set_weights.remote(trained[0]) for r in rollouts], timeout=TIMEOUT)

    def stop() -> None:
        for actor in [*trainers, *rollouts]:
            ray.kill(actor)

    return step, stop


def raw_monarch_loop(opts: argparse.Namespace) -> tuple[Callable[[int], object], Callable[[], object]]:
    from monarch.actor import Actor, endpoint, this_host

    class RawTrainer(Actor):
        def __init__(self, port: int, weights: int, tensors: int, allreduce: int, device: str) -> None:
            from monarch.actor import context

            os.environ.update(gloo_env(context().actor_instance.rank.rank, opts.trainers, port))
            self.impl = Trainer(weights, tensors, allreduce, device)

        @endpoint
        def train(self, step: int, *batches: Any) -> list[Any] | None:
            return self.impl.train(step, *batches)

    class RawRollout(Actor):
        def __init__(self, batch: int, device: str) -> None:
            self.impl = Rollout(batch, device)

        @endpoint
        def generate(self, step: int) -> Any:
            return self.impl.generate(step)

        @endpoint
        def set_weights(self, weights: list[Any]) -> float:
            return self.impl.set_weights(weights)

    trainer_procs = this_host().spawn_procs(per_host={"procs": opts.trainers})
    rollout_procs = this_host().spawn_procs(per_host={"procs": opts.rollouts})
    trainers = trainer_procs.spawn(
        "rlhf_trainers", RawTrainer, free_port(), opts.weights, opts.tensors, opts.allreduce, opts.device
    )
    rollouts = rollout_procs.spawn("rlhf_rollouts", RawRollout, opts.batch, opts.device)

    def step(i: int) -> object:
        batches = list(rollouts.generate.call(i).get(timeout=TIMEOUT).values())
        trained = trainers.train.call(i, *batches).get(timeout=TIMEOUT)
        weights = next(v for v in trained.values() if v is not None)
        return list(rollouts.set_weights.call(weights).get(timeout=TIMEOUT).values())

    def stop() -> None:
        trainer_procs.stop().get(timeout=60)
        rollout_procs.stop().get(timeout=60)

    return step, stop


def run_backend(opts: argparse.Namespace) -> dict[str, Any]:
    import fray

    ctx = fray.init(SPECS[opts.backend])
    memcpy: list[float] = []
    results: dict[str, list[float]] = {}
    raw = {"ray": raw_ray_loop, "monarch": raw_monarch_loop}.get(opts.backend)
    if raw is not None and not opts.no_raw:
        step, stop = raw(opts)
        results[f"raw {opts.backend}"] = timed_steps(step, opts.steps, memcpy)
        stop()
        if opts.backend == "ray" and opts.device == "cuda":
            step, stop = raw_ray_rdt_loop(opts)
            results["raw ray RDT"] = timed_steps(step, opts.steps, memcpy)
            stop()
    results[f"fray-{opts.backend}"] = timed_steps(fray_loop(ctx, opts), opts.steps, memcpy)
    fray.shutdown()
    return {"memcpy_100mib": memcpy, "steps": results}


# ---------------------------------------------------------------- report
def report(opts: argparse.Namespace, runs: list[dict[str, Any]]) -> None:
    memcpy = [s for run in runs for s in run["memcpy_100mib"]]
    rate = 100 * MiB / statistics.median(memcpy)  # bytes per second
    created = opts.rollouts * opts.batch + opts.weights
    floor = created / rate
    print(
        f"\nRLHF step: {opts.trainers} trainer ranks (gloo), {opts.rollouts} rollout members, batches "
        f"{opts.batch / MiB:g} MiB each, weights {opts.weights / MiB:g} MiB as {opts.tensors} tensors; "
        f"{opts.steps} steps after one warm-up"
    )
    print(
        f"memcpy of 100 MiB: median {statistics.median(memcpy) * 1e3:.1f} ms (range {min(memcpy) * 1e3:.1f}-"
        f"{max(memcpy) * 1e3:.1f}) -> copy floor of the step ({created / MiB:g} MiB created): {floor * 1e3:.1f} ms"
    )
    print(f"{'system':16} {'p50 s':>8} {'p90 s':>8} {'min s':>8} {'p50/floor':>10}  steps (s)")
    for run in runs:
        for system, samples in run["steps"].items():
            p50, p90 = percentile(samples, 50), percentile(samples, 90)
            shown = " ".join(f"{s:.3f}" for s in samples)
            print(f"{system:16} {p50:8.3f} {p90:8.3f} {min(samples):8.3f} {p50 / floor:10.1f}  {shown}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default=None, help="one of in_memory, ray, monarch (default: every installed)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--trainers", type=int, default=2)
    parser.add_argument("--rollouts", type=int, default=2)
    parser.add_argument("--batch-mib", type=float, default=32)
    parser.add_argument("--weights-mib", type=float, default=256)
    parser.add_argument("--tensors", type=int, default=8)
    parser.add_argument("--allreduce-mib", type=float, default=1)
    parser.add_argument("--no-raw", action="store_true", help="fray only (no raw Ray / raw Monarch loop)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where batches and weights live")
    parser.add_argument("--quick", action="store_true", help="1 MiB batches, 4 MiB weights, 2 steps (a smoke run)")
    parser.add_argument("--json", default=None, help="(internal) write this backend's samples to this path")
    opts = parser.parse_args()
    if opts.quick:
        opts.steps, opts.batch_mib, opts.weights_mib, opts.allreduce_mib = 2, 1, 4, 0.01
    opts.batch, opts.weights = int(opts.batch_mib * MiB), int(opts.weights_mib * MiB)
    opts.allreduce = int(opts.allreduce_mib * MiB)
    if opts.backend:
        run = run_backend(opts)
        if opts.json:
            Path(opts.json).write_text(json.dumps(run))
        else:
            report(opts, [run])
        return
    import fray

    runs = []
    for backend in [b for b in SPECS if b in fray.available_backends()]:
        run = run_child([sys.executable, __file__, *sys.argv[1:], "--backend", backend])
        if run is not None:
            runs.append(run)
        else:
            print(f"{backend}: failed (see above)", file=sys.stderr)
    report(opts, runs)
    if len(runs) < len([b for b in SPECS if b in fray.available_backends()]):
        sys.exit(1)


if __name__ == "__main__":
    under_socket_guard()
    main()
