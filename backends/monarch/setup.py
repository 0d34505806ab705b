"""fray-monarch's one build step beyond pyproject.toml: the start-up hook (src/fray_monarch_autoguard.pth) goes
into site-packages beside the package, where Python runs it as it starts (fray_monarch_autoguard)."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HOOK = Path("src", "fray_monarch_autoguard.pth")


class BuildWithStartHook(build_py):
    def run(self) -> None:
        super().run()
        self.copy_file(str(HOOK), str(Path(self._root(), HOOK.name)), preserve_mode=False)

    def _root(self) -> str:
        """Where the wheel's top-level files go: build_lib, or for an editable install (`pip install -e`, which
        links the sources instead) the editable wheel's own root, which setuptools names install_lib."""
        if getattr(self, "editable_mode", False):
            return str(self.get_finalized_command("install").install_lib)
        return str(self.build_lib)


setup(cmdclass={"build_py": BuildWithStartHook})
