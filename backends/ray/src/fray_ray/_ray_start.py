"""`ray start` as fray runs it for the heads it starts (fray_ray._head): Ray's own command line, with the node's
workers that have a runtime env set up by fray_ray._setup_worker instead of Ray's set-up script.

`ray start` has no option for the set-up script: the node takes RayParams.setup_worker_path where it is set and
Ray's own script where it is not. This module sets it on every RayParams made in this process, then runs Ray's
command line with the arguments it was given (`python -m fray_ray._ray_start start --head ...`). A Ray whose
RayParams has no such field is left as it is. With WITHOUT_RAY_CLIENT first, the head starts no Ray Client server.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

SETUP_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_setup_worker.py")
WITHOUT_RAY_CLIENT = "--without-ray-client"  # (this module's own option, before Ray's: no Ray Client server)


def use_fray_setup_worker() -> bool:
    """Make every RayParams of this process name fray's set-up script unless told another; False where this Ray
    has no such parameter (then its own script is used)."""
    from ray._private import parameter

    original = parameter.RayParams.__init__
    if getattr(original, "_fray_setup_worker", False):
        return True
    probe = parameter.RayParams()
    if not hasattr(probe, "setup_worker_path"):
        return False

    @functools.wraps(original)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if self.setup_worker_path is None:
            self.setup_worker_path = SETUP_WORKER

    init._fray_setup_worker = True  # type: ignore[attr-defined]
    parameter.RayParams.__init__ = init  # type: ignore[method-assign]
    return True


def leave_out_ray_client() -> None:
    """`ray start --head` starts a Ray Client server wherever Ray Client's packages are installed, with no option
    against it: this process's `ray start` takes them for missing (and so starts none)."""
    from ray.scripts import scripts

    left_out = ImportError("left out by fray: this head serves fray's drivers alone")
    scripts.get_ray_client_dependency_error = lambda: left_out  # type: ignore[attr-defined]


def main(argv: list[str]) -> None:
    use_fray_setup_worker()
    if argv[:1] == [WITHOUT_RAY_CLIENT]:
        argv = argv[1:]
        leave_out_ray_client()
    from ray.scripts.scripts import main as ray_main

    sys.argv[:] = ["ray", *argv]
    ray_main()  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    main(sys.argv[1:])
