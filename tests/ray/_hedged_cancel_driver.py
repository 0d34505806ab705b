"""A driver that takes the first of eight like tasks and cancels the rest, ROUNDS times (hedged requests): every
cancel meets tasks that finish together. Prints OK and the number of tasks cancelled before they finished."""

from __future__ import annotations

import sys

import fray
from fray.testing import workloads as h

ROUNDS = int(sys.argv[1])

ctx = fray.init("ray")
cancelled = 0
for _ in range(ROUNDS):
    refs = [ctx.create_task(h.add, args=(i, 1)) for i in range(8)]
    _, rest = ctx.wait(refs, num_returns=1, timeout=60)
    for ref in rest:
        ctx.cancel(ref)
    for i, ref in enumerate(refs):
        try:
            assert ctx.get(ref, timeout=60) == i + 1
        except fray.TaskCancelledError:
            cancelled += 1
ctx.shutdown()
print(f"OK {cancelled}", flush=True)
