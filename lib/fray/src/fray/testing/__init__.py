"""Fray's conformance suite, importable so any backend (first- or third-party) can run it.

In a test module of your project:

    from fray.testing.suite import *  # noqa: F403  (collects every conformance test)

then `pytest --fray-backend=mybackend`. The `fray` pytest plugin (installed with fray-core) provides the fixtures:
`fray_ctx` (a JobContext of the backend under test, made current for the test), `fray_cluster` (a ClusterContext) and
`fray_backend_name`. Tests that need a capability the backend lacks are skipped naming that capability.
"""

from fray.testing.plugin import requires_capability

__all__ = ["requires_capability"]
