"""Fray's conformance suite, importable so any backend (first- or third-party) can run it.

In a test module of your project:

    from fray.testing.suite import *  # noqa: F403  (collects every conformance test)

then `pytest --fray-backend=mybackend`. The `fray` pytest plugin (installed with fray-core) provides the fixtures:
`fray_ctx` (a JobContext of the backend under test, made current for the test), `fray_cluster` (a ClusterContext) and
`fray_backend_name`. Tests that need a capability the backend lacks are skipped naming that capability.
"""

from typing import TYPE_CHECKING

from fray._lazy import lazy_face

if TYPE_CHECKING:
    from fray.testing.plugin import requires_capability

__all__ = ["requires_capability"]

# The workload modules beside this one are imported by the processes that run their functions (a Ray worker, a
# Monarch mesh process, a job's rank); the plugin loads pytest, which none of them needs.
__getattr__, __dir__ = lazy_face(__name__, globals(), {"fray.testing.plugin": "requires_capability"})
