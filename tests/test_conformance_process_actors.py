"""The conformance suite's actor cases on a kit backend whose actors live in processes of their own
(tests/_process_actors_backend.py): what an actor keeps stays readable with nothing but fray.kit.remote."""

from _process_actors_backend import ProcessActorsBackend

from fray import register_backend

register_backend("process_actors", ProcessActorsBackend, replace=True)
fray_backends = ["process_actors"]

from fray.testing.suite.test_actor_refs import *  # noqa: E402, F403
from fray.testing.suite.test_actors import *  # noqa: E402, F403
