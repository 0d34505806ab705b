"""A real OpenSSH server inside a namespaced host (see _netns), reachable by key from the network's other hosts.

Everything it needs (keys, config, pid and log files) lives in a private work directory; only the privilege
separation directory /run/sshd is shared with the machine, as sshd insists on that fixed path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from types import TracebackType

from _netns import Host

SSHD = "/usr/sbin/sshd"
LOGIN_WAIT = 20.0
CLIENT_OPTIONS = (
    "IdentitiesOnly=yes",
    "StrictHostKeyChecking=no",
    "UserKnownHostsFile=/dev/null",
    "BatchMode=yes",
    "LogLevel=ERROR",
    "ConnectTimeout=10",
)


def unavailable() -> str | None:
    """Why an sshd cannot be started here, or None if it can (namespaced hosts aside)."""
    for tool in (SSHD, "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"sshd tests need `{tool}`, not found (apt install openssh-server openssh-client)"
    return None


def require_sshd() -> None:
    """Skip the calling test, naming why, where an sshd cannot be started."""
    import pytest

    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)


class SshServer:
    """An sshd in `host`, listening on `host.address` port 22, admitting one client key; `close()` stops it."""

    def __init__(self, host: Host, workdir: Path) -> None:
        self.host = host
        self.workdir = workdir
        self.client_key = workdir / "client_key"
        self.log = workdir / "sshd.log"
        self.ssh_config = workdir / "ssh_config"
        self.process: subprocess.Popen[bytes] | None = None

    def client_args(self) -> list[str]:
        """ssh options that log a client on any host of the network in without a prompt."""
        return ["-i", str(self.client_key), *(arg for option in CLIENT_OPTIONS for arg in ("-o", option))]

    def config_args(self) -> list[str]:
        """The same as `client_args`, as `-F FILE` (for tools that take an ssh_config path)."""
        return ["-F", str(self.ssh_config)]

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no sshd log)"

    def start(self) -> None:
        self.workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.workdir, 0o700)
        host_key = self.workdir / "host_key"
        for key in (host_key, self.client_key):
            key.unlink(missing_ok=True)
            subprocess.run(["ssh-keygen", "-q", "-N", "", "-t", "ed25519", "-f", str(key)], check=True, timeout=30)
            os.chmod(key, 0o600)
        authorized = self.workdir / "authorized_keys"
        authorized.write_text(self.client_key.with_suffix(".pub").read_text())
        os.chmod(authorized, 0o600)
        config = self.workdir / "sshd_config"
        config.write_text(
            f"ListenAddress {self.host.address}\n"
            "Port 22\n"
            f"HostKey {host_key}\n"
            f"AuthorizedKeysFile {authorized}\n"
            f"PidFile {self.workdir / 'sshd.pid'}\n"
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "PermitRootLogin prohibit-password\n"
            "UsePAM no\n"
            "PrintMotd no\n"
            # The key files sit under /tmp (mode 1777), and with StrictModes every login is refused: "Authentication
            # refused: bad ownership or modes for directory /tmp".
            "StrictModes no\n"
        )
        options = "".join(f"  {option.replace('=', ' ', 1)}\n" for option in CLIENT_OPTIONS)
        self.ssh_config.write_text(f"Host *\n  IdentityFile {self.client_key}\n{options}")
        # sshd refuses to start without its privilege separation directory, a fixed path it checks itself.
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        with open(self.log, "wb") as log:
            self.process = self.host.popen(
                [SSHD, "-D", "-e", "-f", str(config)], stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        self._wait_for_login()

    def _wait_for_login(self) -> None:
        deadline = time.monotonic() + LOGIN_WAIT
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"sshd in {self.host.name} exited {self.process.returncode}:\n{self.log_tail()}")
            cmd = ["ssh", *self.client_args(), self.host.address, "true"]
            try:
                if self.host.run(cmd, timeout=15, capture_output=True).returncode == 0:
                    return
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"sshd in {self.host.name} took no key login in {LOGIN_WAIT}s:\n{self.log_tail()}")
            time.sleep(0.1)

    def close(self) -> None:
        """Stop sshd (its sessions' processes stay in the host: the host's own teardown kills those)."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None

    def __enter__(self) -> SshServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def start_sshd(host: Host, workdir: Path) -> SshServer:
    """A running sshd in `host` with its files in `workdir` (created 0700); use it in a `with` or `close()` it."""
    server = SshServer(host, workdir)
    try:
        server.start()
    except BaseException:
        server.close()
        raise
    return server
