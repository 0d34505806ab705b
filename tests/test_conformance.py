"""The conformance suite, run for every installed backend (narrow with --fray-backend=NAME or FRAY_BACKEND)."""

from fray.testing.suite import *  # noqa: F403
