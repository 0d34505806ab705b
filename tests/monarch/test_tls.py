"""The user's TLS authority and the identities it issues (tls.py), without Monarch: the cross-machine use of
them runs in test_multihost.py (attach over TLS, a stranger's driver refused, plain TCP only when asked)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from fray.errors import FrayError
from fray_monarch.net import tls


@pytest.fixture
def tls_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(tls.TLS_DIR_ENV, str(tmp_path / "tls"))
    return tmp_path / "tls"


def test_the_authority_is_made_once_in_a_private_directory(tls_dir: Path) -> None:
    first = tls.authority()
    assert tls.authority() == first
    assert stat.S_IMODE(os.lstat(tls_dir).st_mode) == 0o700
    for name in (tls.CA_CERT, tls.CA_KEY):
        assert stat.S_IMODE(os.lstat(tls_dir / name).st_mode) == 0o600


def test_an_identity_names_its_addresses_and_chains_to_the_authority(tls_dir: Path) -> None:
    identity = tls.issue(["node5", "10.0.0.5", "node5"])
    cert = x509.load_pem_x509_certificate(identity.cert.encode())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["node5"]
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["10.0.0.5"]
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(identity.ca.encode()))
    assert tls.Identity.from_json(identity.to_json()) == identity


def test_an_authority_others_can_read_or_replace_is_refused(tls_dir: Path) -> None:
    tls.authority()
    os.chmod(tls_dir / tls.CA_KEY, 0o644)
    with pytest.raises(FrayError, match=r"can be read by other users: `chmod 600 .*ca-key.pem`"):
        tls.authority()
    os.chmod(tls_dir / tls.CA_KEY, 0o600)
    (tls_dir / tls.CA_CERT).unlink()
    (tls_dir / tls.CA_CERT).symlink_to(tls_dir / tls.CA_KEY)
    with pytest.raises(FrayError, match="incomplete"):  # O_NOFOLLOW: a symlink is not read
        tls.authority()


def test_without_an_authority_a_host_that_may_not_make_one_says_how_to_get_it(tls_dir: Path) -> None:
    with pytest.raises(FrayError, match="copy the directory from the machine that made it"):
        tls.issue(["node5"], create=False)


def _paths_in_child(env: dict[str, str]) -> str:
    code = "import os; from fray_monarch.net import tls; tls.runtime_paths(); print(os.environ[tls.ENV_CERT])"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout


def test_each_process_gets_its_own_identity_paths_unless_the_user_set_them() -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HYPERACTOR_TLS", tls.OWNED_ENV))}
    inherited = {**base, tls.OWNED_ENV: "1:/tmp/fray-tls-parent", tls.ENV_CA: "/tmp/fray-tls-parent/ca.pem"}
    inherited |= {tls.ENV_CERT: "/tmp/fray-tls-parent/cert.pem", tls.ENV_KEY: "/tmp/fray-tls-parent/key.pem"}
    own = _paths_in_child(inherited)  # a driver or worker started by a fray process: not its parent's files
    assert "fray-tls-" in own and "fray-tls-parent" not in own
    users = {**base, tls.ENV_CA: "/etc/ca.pem", tls.ENV_CERT: "/etc/me.pem", tls.ENV_KEY: "/etc/me.key"}
    assert _paths_in_child(users).strip() == "/etc/me.pem"


INSTALL_AFTER_A_PLANT = """
import os, subprocess, sys
from fray.errors import FrayError
from fray_monarch.net import tls
tls.runtime_paths()  # this process's paths: a random name in the shared temp directory
base = os.environ[tls.OWNED_ENV].partition(":")[2]
identity = tls.issue(["127.0.0.1"])
# another user makes the directory first, with an authority of theirs in it
subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                f"import os; os.mkdir({base!r}, 0o755); open({base!r} + '/cert.pem', 'w').write('theirs')"], check=True)
try:
    tls.install(identity)
    print("INSTALLED")
except FrayError as exc:
    print("REFUSED", exc)
subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "rm", "-rf", base], check=False)
"""


@pytest.mark.skipif(os.getuid() != 0, reason="planting a directory as another user needs root (setpriv)")
def test_an_identity_directory_another_user_made_first_is_refused(tls_dir: Path) -> None:
    """issue 29: install() used a cert.pem it found in place without checking who made it; a directory made
    again after let_go() removed it took another user's authority."""
    done = subprocess.run(
        [sys.executable, "-c", INSTALL_AFTER_A_PLANT],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TMPDIR": "/tmp"},
        check=False,
    )
    assert "REFUSED" in done.stdout and "made by someone else" in done.stdout, (done.stdout, done.stderr[-2000:])


def test_a_process_identity_stays_private_and_checked_for_its_life(tls_dir: Path) -> None:
    code = (
        "import os\nfrom fray_monarch.net import tls\ntls.runtime_paths()\n"
        "tls.install(tls.issue(['127.0.0.1']))\nbase = os.environ[tls.OWNED_ENV].partition(':')[2]\n"
        "tls.install(tls.issue(['127.0.0.1']))  # again, later: checked, kept\n"
        "os.chmod(os.environ[tls.ENV_KEY], 0o644)\n"
        "try:\n    tls.install(tls.issue(['127.0.0.1']))\nexcept Exception as exc:\n    print('REFUSED', exc)\n"
        "tls.remove()\nprint('GONE', not os.path.exists(base))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert "REFUSED" in done.stdout and "not this user's own private file" in done.stdout, done.stderr[-2000:]
    assert "GONE True" in done.stdout, done.stdout
