"""Each cluster fray starts on this machine has a token of its own (fray_ray._tokens), so a leaked token opens one
cluster: two private heads and the private instance of a job context on real Ray; one's token does not open the
other; the heads' jobs, and their own fray contexts, work with theirs; the user's ~/.ray/auth_token is neither."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import fray
from fray.cluster_context import ClusterContext
from fray_ray import _tokens
from fray_ray._auth import token_path

# With the token file in argv[2] (or none), ask the GCS at argv[1] for its cluster id, as any Ray client would.
_ASK = textwrap.dedent(
    """
    import os, sys
    os.environ["RAY_AUTH_MODE"] = "token"
    if sys.argv[2] != "-":
        os.environ["RAY_AUTH_TOKEN_PATH"] = sys.argv[2]
    from ray._raylet import GcsClient
    try:
        GcsClient(address=sys.argv[1])
        print("opened")
    except Exception as exc:
        print("refused", type(exc).__name__)
    """
)


def _opens(gcs_address: str, token: Path | None) -> bool:
    env = {k: v for k, v in os.environ.items() if k not in _tokens.TOKEN_VARS}
    done = subprocess.run(
        [sys.executable, "-c", _ASK, gcs_address, str(token) if token else "-"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.stdout.strip().splitlines()[-1:] == ["opened"]


@pytest.fixture
def two_heads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[ClusterContext]]:
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    first = fray.cluster("ray?num_cpus=1")
    try:
        second = fray.cluster("ray?num_cpus=1")
        try:
            yield [first, second]
        finally:
            second.shutdown()
    finally:
        first.shutdown()


def _job_reads(cluster: ClusterContext) -> str:
    code = "import os, fray; ctx = fray.init('ray'); print(ctx.get(ctx.create_task(abs, args=(-7,)), timeout=120)); "
    code += "print(os.environ['RAY_AUTH_TOKEN_PATH'])"
    job = cluster.create_job([sys.executable, "-c", code])
    job.wait(timeout=240)
    return cluster.get_job_logs(job.id)


def test_each_head_fray_starts_has_a_token_of_its_own(two_heads: list[ClusterContext]) -> None:
    files = [Path(c._head.token_file) for c in two_heads]  # type: ignore[attr-defined]
    gcs = [str(c.gcs_address) for c in two_heads]  # type: ignore[attr-defined]
    assert files[0] != files[1] and files[0].read_text() != files[1].read_text()
    for path, cluster in zip(files, two_heads, strict=True):
        assert path.parent != Path(cluster._head.temp_dir)  # type: ignore[attr-defined]  # (Ray makes that 0777)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert path != token_path()
    assert _opens(gcs[0], files[0]) and _opens(gcs[1], files[1])
    assert not _opens(gcs[0], files[1]) and not _opens(gcs[1], files[0])  # one's token opens only its own
    assert not _opens(gcs[0], None)
    for path, cluster in zip(files, two_heads, strict=True):  # its jobs, and their own contexts, use its token
        logs = _job_reads(cluster)
        assert "7" in logs.split() and str(path) in logs, logs
    for cluster in two_heads:
        cluster.shutdown()
    assert not files[0].parent.exists() and not files[1].parent.exists()  # gone with their clusters


def test_the_private_instance_of_a_job_context_has_a_token_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    before = {name: os.environ.get(name) for name in _tokens.TOKEN_VARS}
    users = token_path()  # (where the user's own is read from)
    ctx = fray.init("ray?num_cpus=1")
    try:
        seen = ctx.get(ctx.create_task(os.environ.get, args=("RAY_AUTH_TOKEN_PATH",)), timeout=120)
        assert seen and Path(seen).name == _tokens.TOKEN_FILE and Path(seen) != users
        assert stat.S_IMODE(Path(seen).stat().st_mode) == 0o600
    finally:
        fray.shutdown()
    assert {name: os.environ.get(name) for name in _tokens.TOKEN_VARS} == before  # (the user's, again)
    assert not Path(seen).exists()  # gone with its instance
