"""The shape of an RLHF loop at toy size on CPU, written once, run on any Fray backend.

    python examples/spmd_pipeline.py                       # in_memory (SPMD members in child processes)
    FRAY_BACKEND=ray python examples/spmd_pipeline.py      # a private local Ray
    FRAY_BACKEND=monarch fray run -- python examples/spmd_pipeline.py  # Monarch process meshes

A trainer group of 2 ranks trains one model with torch DistributedDataParallel over gloo (fray sets MASTER_ADDR,
RANK, WORLD_SIZE... in each member before its __init__). A rollout group of 2 members generates experience with
the current policy and streams it back sample batch by sample batch. Each step:

1. every rollout member streams its batches (the driver sees the first before the member has made the last);
2. the driver puts the step's batch once; every trainer rank reads it and trains on its own shard (DDP averages
   the gradients over the ranks);
3. rank 0's new weights are put once and read by every rollout member (one put, N readers).

The "reward" is how close the policy's outputs are to a hidden target; the training loss falls step by step.

Surviving a rank's death (issue 19): rank 0 saves a checkpoint after every step, and the trainer group is
created with `max_restarts=1`. With `--kill-rank 1 --at-step 3` the driver SIGKILLs that rank's process while
the step trains: the step's calls, in flight at the death, fail at once (`ActorUnavailableError`), fray restarts
every rank on a fresh process, each `__init__` sees `fray.current_actor().restarts == 1` and loads the
checkpoint, and the next call (made while the group restarts) waits for it: the loop goes on from the step after
the checkpoint; the loss keeps falling.

    python examples/spmd_pipeline.py --kill-rank 1 --at-step 3

Needs torch (installed by the full install: `make test`).
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time
from collections.abc import Iterator

import torch

import fray

FEATURES = 16
STEPS = 8
BATCHES_PER_ROLLOUT = 4
BATCH = 64


def make_policy() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


class Rollout:
    """Generates experience with the current policy weights; one member per environment shard."""

    def __init__(self) -> None:
        me = fray.current_actor()
        self.rank = me.rank
        self.policy = make_policy()
        self.rng = torch.Generator().manual_seed(1000 + me.rank)
        self.target = torch.Generator().manual_seed(7)  # the same hidden reward on every member
        self.hidden = torch.randn(FEATURES, 1, generator=self.target)

    def set_weights(self, weights: dict[str, torch.Tensor]) -> int:
        self.policy.load_state_dict(weights)
        return self.rank

    def generate(self, batches: int) -> Iterator[dict[str, torch.Tensor]]:
        """Stream experience: each item is one batch of (observation, target-reward) pairs."""
        for _ in range(batches):
            obs = torch.randn(BATCH, FEATURES, generator=self.rng)
            with torch.no_grad():
                reward = torch.tanh(obs @ self.hidden)
            yield {"obs": obs, "reward": reward}


class Trainer:
    """One rank of a data-parallel trainer: torch.distributed is set up from the environment fray provides. After
    a restart of its group it resumes from the last checkpoint rank 0 saved."""

    def __init__(self, checkpoint: str) -> None:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.checkpoint = checkpoint
        self.model = DistributedDataParallel(make_policy())
        self.opt = torch.optim.Adam(self.model.parameters(), lr=0.02)
        self.resumed_from = -1  # the step whose checkpoint this rank loaded (-1: a fresh start)
        if fray.current_actor().restarts and os.path.exists(checkpoint):
            saved = torch.load(checkpoint)
            self.model.module.load_state_dict(saved["model"])
            self.opt.load_state_dict(saved["opt"])
            self.resumed_from = saved["step"]

    def train(self, batch: dict[str, torch.Tensor]) -> float:
        obs = batch["obs"][self.rank :: self.world]  # this rank's shard of the step's batch
        reward = batch["reward"][self.rank :: self.world]
        losses = []
        for _ in range(4):
            self.opt.zero_grad()
            loss = torch.nn.functional.mse_loss(self.model(obs), reward)
            loss.backward()  # DDP all-reduces the gradients over the ranks here
            self.opt.step()
            losses.append(float(loss.detach()))
        return sum(losses) / len(losses)

    def save(self, step: int) -> None:
        """Rank 0 writes the checkpoint (every rank's model and optimizer are the same after a DDP step)."""
        if self.rank == 0:
            state = {"model": self.model.module.state_dict(), "opt": self.opt.state_dict(), "step": step}
            torch.save(state, self.checkpoint + ".tmp")
            os.replace(self.checkpoint + ".tmp", self.checkpoint)  # a crash never leaves half a checkpoint

    def resumed(self) -> tuple[int, int]:
        return fray.current_actor().restarts, self.resumed_from

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.module.state_dict().items()}

    def pid(self) -> int:
        return os.getpid()

    def where(self) -> str:
        return f"rank {self.rank}/{self.world} pid {os.getpid()} MASTER={os.environ['MASTER_ADDR']}"


def wait_until_back(ctx: fray.JobContext, trainers: fray.ActorGroup) -> int:
    """The trainer group restarts: a call made meanwhile waits for it (up to the get's timeout) and then runs.
    Returns the step it resumed from."""
    restarts, step = ctx.get(trainers.resumed(), timeout=180)[0]
    print(f"the trainer group restarted (restart {restarts}); every rank resumed from the checkpoint of step {step}")
    return int(step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kill-rank", type=int, default=None, help="SIGKILL this trainer rank's process ...")
    parser.add_argument("--at-step", type=int, default=3, help="... while this step trains")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fray-spmd-") as scratch:  # removed however the run ends
        run(args, os.path.join(scratch, "trainer.pt"))


def run(args: argparse.Namespace, checkpoint: str) -> None:
    ctx = fray.init()
    print(f"backend: {ctx.backend}")
    options = fray.ActorOptions(max_restarts=1)  # a rank's death restarts the whole trainer group, once
    trainers = ctx.create_actor_group(Trainer, 2, args=(checkpoint,), options=options, distributed=True)
    rollouts = ctx.create_actor_group(Rollout, 2)
    print("trainers:", *ctx.get(trainers.where(), timeout=180), sep="\n  ")

    losses: dict[int, float] = {}
    step = 0
    while step < STEPS:
        started = time.perf_counter()
        streams = [member.generate.stream(BATCHES_PER_ROLLOUT) for member in rollouts]
        items = [ctx.get(ref, timeout=120) for stream in streams for ref in stream]  # as they are produced
        batch = ctx.put({key: torch.cat([item[key] for item in items]) for key in ("obs", "reward")})
        kill = step == args.at_step and args.kill_rank is not None
        victim = ctx.get(trainers[args.kill_rank].pid(), timeout=60) if kill else 0
        training = trainers.train(batch)  # every rank reads the one put batch
        if kill:
            os.kill(victim, signal.SIGKILL)  # (a machine lost mid-step, as far as the group can tell)
            print(f"step {step}: killed trainer rank {args.kill_rank} (pid {victim}) while it trained")
            args.kill_rank = None
        try:
            step_losses = ctx.get(training, timeout=120)
            ctx.get(trainers.save(step), timeout=60)
        except fray.ActorUnavailableError as exc:
            print(f"step {step}: {exc}")
            step = wait_until_back(ctx, trainers) + 1
            weights = ctx.put(ctx.get(trainers[0].weights(), timeout=60))  # the rollouts act as the checkpoint
            ctx.get(rollouts.set_weights(weights), timeout=60)
            continue
        weights = ctx.put(ctx.get(trainers[0].weights(), timeout=60))  # one put ...
        ctx.get(rollouts.set_weights(weights), timeout=60)  # ... read by every rollout member
        losses[step] = sum(step_losses) / len(step_losses)
        print(f"step {step}: loss {losses[step]:.4f}  ({len(items)} batches, {time.perf_counter() - started:.2f} s)")
        step += 1

    ctx.kill(trainers)
    ctx.kill(rollouts)
    fray.shutdown()
    first, last = losses[min(losses)], losses[STEPS - 1]
    if last < first * 0.7:
        print(f"ok: loss fell from {first:.4f} to {last:.4f}")
    else:
        raise SystemExit(f"the loss did not fall enough: {losses}")


if __name__ == "__main__":
    main()
