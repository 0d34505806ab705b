"""The driver's import path, as its worker processes get it: user modules the driver imports import there too.

What goes: the driver's own sys.path, as the driver sees it. Python puts the current directory there only for
`python -c`, `python -m` and the REPL (as ''), a script's own directory otherwise; fray sends the same, '' made
absolute, and adds nothing else (not the driver's current directory, unless the driver's path has it).

What a worker takes, on its own host (`take`): the current directory `python -m` put in its own path goes unless
the driver's has it; entries go in front of its own sys.path, in the driver's order, as
the driver's are in front of its site-packages: a user's module wins over an installed one there as it does in the
driver. So an entry must be trusted on that host: a directory or file that exists there, and it and every
directory on the way to it (symbolic links followed one by one, each checked) owned by this user or root and
writable by no one else, neither its group nor every user (fray_monarch.core.trust; a sticky directory such as
/tmp is passed through). Any other (a driver started in /tmp, a path that on another host is
someone else's directory) is left out with a warning on the worker's stderr, naming it: whoever can write there
could otherwise put a module of theirs (json.py, say) in front of every import of the worker.

Ray is not concerned: a private local Ray's workers get the driver's entries from fray_ray._local (same machine),
and a joined cluster gets what its runtime_env names (working_dir, py_modules), as with Ray itself.
"""

from __future__ import annotations

import os
import sys

from fray.backend import driver_import_path, keep_driver_view
from fray_monarch.core.trust import untrusted_reason as path_untrusted

__all__ = ["driver_import_path", "take", "untrusted_reason"]


def untrusted_reason(entry: str) -> str | None:
    """Why `entry` may not go on this host's import path (None: it may)."""
    try:
        os.stat(entry)
        return path_untrusted(entry)
    except FileNotFoundError:
        return "it does not exist here"
    except OSError as exc:
        return f"it cannot be checked ({exc.strerror})"


def take(entries: list[str]) -> list[str]:
    """Put the trusted ones of `entries` (the driver's import path) in front of this process's sys.path, in their
    order; the ones left out, each with why, are returned and warned about on stderr. The current directory that
    `python -m` put first in this process's own path (Monarch starts its processes so, in the driver's current
    directory) goes unless the driver's path has it too: a worker imports from where its driver does."""
    keep_driver_view(entries)
    left_out = []
    trusted = []
    for entry in entries:
        why = untrusted_reason(entry)
        if why is None:
            trusted.append(entry)
        elif entry not in sys.path:
            left_out.append(f"{entry} ({why})")
    sys.path[:0] = [entry for entry in trusted if entry not in sys.path]
    if left_out:
        print(
            "fray: left out of this worker's import path, from its driver's: "
            + "; ".join(left_out)
            + ". Modules there do not import here: move them to a directory only you can write, or install them",
            file=sys.stderr,
            flush=True,
        )
    return left_out
