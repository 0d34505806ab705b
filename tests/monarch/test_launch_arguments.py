"""What a spec names for ssh and Slurm reaches them as one value each, never as an option or a line of a script
(issue 29, item 7). Before, a host name starting with '-' went to ssh as an option (no `--` before it), and Slurm's
time and partition went unquoted into `#SBATCH` lines of the batch script, where a newline began a line of shell."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

LAUNCH = textwrap.dedent(
    """
    import json, sys
    from fray_monarch.cluster.launchers import launch
    try:
        launch(json.loads(sys.argv[1]), 20)
    except ValueError as exc:
        print("refused:", exc)
    except Exception as exc:
        print("failed otherwise:", type(exc).__name__, exc)
    else:
        print("launched")
    """
)


def _launch(opts: dict[str, object]) -> str:
    """launch(opts) in a child (bounded: a launch that went ahead may wait for hosts)."""
    done = subprocess.run(
        [sys.executable, "-c", LAUNCH, json.dumps(opts)], capture_output=True, text=True, timeout=120, check=False
    )
    return done.stdout.strip() + done.stderr[-1000:]


def test_a_host_name_that_is_an_ssh_option_is_refused_before_ssh_runs() -> None:
    marker = Path(tempfile.mkdtemp(prefix="fray-test-ssh-")) / "ran"
    try:
        said = _launch({"job": "ssh", "hosts": [f"-oProxyCommand=touch {marker}"]})
        assert said.startswith("refused:") and "not a host name" in said and "ssh_options" in said, said
        assert not marker.exists()
        for name in ("h2/../../x", "h2 -v", "-l"):
            said = _launch({"job": "ssh", "hosts": ["h1", name]})
            assert said.startswith("refused:") and repr(name) in said, said
    finally:
        subprocess.run(["rm", "-rf", str(marker.parent)], check=False)


def test_a_slurm_value_with_a_newline_is_refused_before_sbatch_runs() -> None:
    for option in ("partition", "time"):
        said = _launch({"job": "slurm", "nodes": 1, option: "debug\ntouch /tmp/fray-test-sbatch-line"})
        assert said.startswith("refused:") and option in said and "newline" in said, said
