"""Named states, one enum per kind, instead of bare strings that differ by backend. A str enum: a state equals
its value ("queued"), so records and wire messages keep their strings."""

from __future__ import annotations

import enum

__all__ = ["ActorState", "TaskState"]


class TaskState(str, enum.Enum):
    """Where a task is in its life. Not every backend passes through every state."""

    WAITING = "waiting"  # its top-level ref arguments are not ready: it holds no resources
    QUEUED = "queued"  # ready, waiting for resources
    DISPATCHED = "dispatched"  # given resources (in_memory) or sent to a worker process (monarch)
    RUNNING = "running"
    CANCELLING = "cancelling"  # running, asked to stop at its next bytecode
    FINISHING = "finishing"  # its function returned; its result is being published
    DONE = "done"
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return str(self.value)


class ActorState(str, enum.Enum):
    ALIVE = "alive"
    DEAD = "dead"

    def __str__(self) -> str:
        return str(self.value)
