"""The shape of an RLHF loop at toy size on CPU, written once, run on any Fray backend.

    python examples/spmd_pipeline.py                       # in_memory (SPMD members in child processes)
    FRAY_BACKEND=ray python examples/spmd_pipeline.py      # a private local Ray
    FRAY_BACKEND=monarch python examples/spmd_pipeline.py  # Monarch process meshes

A trainer group of 2 ranks trains one model with torch DistributedDataParallel over gloo (fray sets MASTER_ADDR,
RANK, WORLD_SIZE... in each member before its __init__). A rollout group of 2 members generates experience with
the current policy and streams it back sample batch by sample batch. Each step:

1. every rollout member streams its batches (the driver sees the first before the member has made the last);
2. the driver puts the step's batch once; every trainer rank reads it and trains on its own shard (DDP averages
   the gradients over the ranks);
3. rank 0's new weights are put once and read by every rollout member (one put, N readers).

The "reward" is how close the policy's outputs are to a hidden target; the training loss falls step by step.
Needs torch (installed by the full install: `make test`).
"""

from __future__ import annotations

import os
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
    """One rank of a data-parallel trainer: torch.distributed is set up from the environment fray provides."""

    def __init__(self) -> None:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.model = DistributedDataParallel(make_policy())
        self.opt = torch.optim.Adam(self.model.parameters(), lr=0.02)

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

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.module.state_dict().items()}

    def where(self) -> str:
        return f"rank {self.rank}/{self.world} pid {os.getpid()} MASTER={os.environ['MASTER_ADDR']}"


def main() -> None:
    ctx = fray.init()
    print(f"backend: {ctx.backend}")
    trainers = ctx.create_actor_group(Trainer, 2, distributed=True)
    rollouts = ctx.create_actor_group(Rollout, 2)
    print("trainers:", *ctx.get(trainers.where(), timeout=180), sep="\n  ")

    losses = []
    for step in range(STEPS):
        started = time.perf_counter()
        streams = [member.generate.stream(BATCHES_PER_ROLLOUT) for member in rollouts]
        items = [ctx.get(ref, timeout=120) for stream in streams for ref in stream]  # as they are produced
        batch = ctx.put({key: torch.cat([item[key] for item in items]) for key in ("obs", "reward")})
        step_losses = ctx.get(trainers.train(batch), timeout=120)  # every rank reads the one put batch
        weights = ctx.put(ctx.get(trainers[0].weights(), timeout=60))  # one put ...
        ctx.get(rollouts.set_weights(weights), timeout=60)  # ... read by every rollout member
        losses.append(sum(step_losses) / len(step_losses))
        print(f"step {step}: loss {losses[-1]:.4f}  ({len(items)} batches, {time.perf_counter() - started:.2f} s)")

    ctx.kill(trainers)
    ctx.kill(rollouts)
    fray.shutdown()
    if losses[-1] < losses[0] * 0.7:
        print(f"ok: loss fell from {losses[0]:.4f} to {losses[-1]:.4f}")
    else:
        raise SystemExit(f"the loss did not fall enough: {losses}")


if __name__ == "__main__":
    main()
