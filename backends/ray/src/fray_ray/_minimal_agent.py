"""Ray's dashboard agent as a minimal Ray install (`pip install ray`, without the dashboard's dependencies) runs
it. A private instance's raylet runs this in place of the full agent (fray_ray._local.WithoutHeadExtras).

The full agent imports every dashboard module (metrics export, the job, log and event agents, the node reporter)
and serves them over HTTP and gRPC to a dashboard, which a private instance does not run. The raylet still needs
an agent: it waits for the ports the agent writes (here -1: none) and shares its fate.
"""

from __future__ import annotations

import os
import runpy
import sys

if __name__ == "__main__":
    # Run as a script: its own folder is first on sys.path, where fray_ray's module names would shadow others.
    if sys.path and os.path.realpath(sys.path[0]) == os.path.dirname(os.path.realpath(__file__)):
        del sys.path[0]
    # What a minimal install lacks: each dashboard module's import then fails, and the agent loads none of them.
    sys.modules["ray.dashboard.optional_deps"] = None  # type: ignore[assignment]
    sys.argv.append("--minimal")
    runpy.run_module("ray.dashboard.agent", run_name="__main__", alter_sys=True)
