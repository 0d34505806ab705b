"""Makes the shared test helpers in this directory (`_netns`, `_sshd`, `_slurm`) importable from every test package."""

import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest

# pytest's default "prepend" import mode already puts this directory on sys.path for this conftest; said here too
# so that `--import-mode=importlib` (which adds nothing) finds the helpers as well.
if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))


def pytest_configure(config: "pytest.Config") -> None:
    """Monarch contexts refuse a driver without fray's socket guard (fray_monarch.socket_guard), and the tests
    are drivers: pytest starts again under it, as a user's `python -m fray_monarch.socket_guard pytest` would."""
    import signal

    # A run started in the background by a non-interactive shell ignores SIGINT, and every process it starts
    # inherits that: the Ctrl-C tests' drivers would never see theirs. The suite means the same wherever it runs.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)

    import _cpu_per_test

    _cpu_per_test.register(config)

    try:
        from fray_monarch import socket_guard
    except ImportError:  # the core alone: no monarch tests
        return
    if socket_guard.active():
        return
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is not None:  # the new pytest writes to the terminal, not to this one's capture files
        capture.suspend_global_capture(in_=True)
    sys.stdout.flush()
    sys.stderr.flush()
    socket_guard.restart_under_guard([sys.executable, *sys.orig_argv[1:]])


def pytest_collection_finish(session: "pytest.Session") -> None:
    """What the run has loaded by now (pytest, the test modules, the engines' Python) lives until its end: frozen,
    so that the collector's full passes, which come as the driver's heap grows, walk only what the tests make."""
    import gc

    gc.freeze()
