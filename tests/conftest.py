"""Makes the shared test helpers in this directory (`_netns`, `_sshd`, `_slurm`) importable from every test package."""

import sys
from pathlib import Path

# pytest's default "prepend" import mode already puts this directory on sys.path for this conftest; said here too
# so that `--import-mode=importlib` (which adds nothing) finds the helpers as well.
if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))
