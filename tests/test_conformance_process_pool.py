"""The conformance suite on examples/process_pool_backend.py, a backend written against fray.kit in under 150 lines
(issue 32's proof), registered in this process as a notebook or test would (`fray.register_backend`)."""

import sys
from pathlib import Path

from fray import register_backend

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from process_pool_backend import ProcessPoolBackend

register_backend("process_pool", ProcessPoolBackend, replace=True)
fray_backends = ["process_pool"]

from fray.testing.suite import *  # noqa: E402, F403
