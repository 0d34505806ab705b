"""fray-monarch's build steps beyond pyproject.toml:

- the socket guard (src/fray_monarch/socket_guard.c) is built with the package, as fray_monarch/_socket_guard*.so,
  with the hash of its source beside it (_socket_guard.sha256): fray_monarch.socket_guard preloads it while the
  hash matches, and builds one of its own into ~/.fray/lib otherwise. Optional: an install on a machine without a
  C compiler succeeds, and the guard is built at first use, or refused there, naming why;
- the start-up hook (src/fray_monarch_autoguard.pth) goes into site-packages beside the package, where Python runs
  it as it starts (fray_monarch_autoguard).
"""

import hashlib
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HOOK = Path("src", "fray_monarch_autoguard.pth")
GUARD = Path("src", "fray_monarch", "socket_guard.c")


def _wheel_root(command: build_py) -> str:
    """Where a wheel's top-level files go: build_lib, or for an editable install (`pip install -e`, which links
    the sources instead) the editable wheel's own root, which setuptools names install_lib."""
    if getattr(command, "editable_mode", False):
        return str(command.get_finalized_command("install").install_lib)
    return str(command.build_lib)


class BuildWithStartHook(build_py):
    def run(self) -> None:
        super().run()
        self.copy_file(str(HOOK), str(Path(_wheel_root(self), HOOK.name)), preserve_mode=False)


class BuildGuard(build_ext):
    def run(self) -> None:
        super().run()
        for ext in self.extensions:
            built = Path(self.get_ext_fullpath(ext.name))
            if built.exists():  # (optional: no compiler, no library, no hash)
                digest = hashlib.sha256(GUARD.read_bytes()).hexdigest()
                built.with_name("_socket_guard.sha256").write_text(digest + "\n")


setup(
    cmdclass={"build_py": BuildWithStartHook, "build_ext": BuildGuard},
    ext_modules=[Extension("fray_monarch._socket_guard", [str(GUARD)], libraries=["dl"], optional=True)],
)
