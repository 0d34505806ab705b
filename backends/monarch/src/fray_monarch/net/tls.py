"""TLS between the machines of a monarch context: a certificate authority per user, and an identity per process.

Monarch 0.7 authenticates both ends of its `tls` channels (mutual TLS): a process presents the certificate in
HYPERACTOR_TLS_CERT (key in HYPERACTOR_TLS_KEY) and accepts peers whose certificate chains to HYPERACTOR_TLS_CA.
Monarch reads those variables when it is imported and the files when a channel opens, never later, and does not
pass them to other hosts. So `_runtime` points the variables at files of this process (`runtime_paths`) before
Monarch is imported, and `install` writes them when a context first needs TLS; the processes a host worker spawns
inherit its variables and so its identity.

Every identity is issued by the user's own authority, in `tls_dir()` (FRAY_TLS_DIR, else ~/.fray/tls: a 0700
directory, keys 0600), made on first use. Machines that share the home directory (a Slurm cluster) share it; to
other machines the authority travels with the launch (ssh: over the connection's stdin) or is copied by the user.
A peer without a certificate from this authority cannot attach, nor be attached to.
"""

from __future__ import annotations

import datetime
import fcntl
import ipaddress
import json
import os
import secrets
import socket
import stat
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fray.errors import FrayError

if TYPE_CHECKING:
    from cryptography import x509
from fray.backend import private_dir, settings
from fray_monarch.core.trust import fray_home

__all__ = ["Identity", "authority", "install", "issue", "own_names", "runtime_paths", "tls_dir"]

TLS_DIR_ENV = settings.TLS_DIR.name
ENV_CA, ENV_CERT, ENV_KEY = "HYPERACTOR_TLS_CA", "HYPERACTOR_TLS_CERT", "HYPERACTOR_TLS_KEY"
OWNED_ENV = settings.TLS_RUNTIME_DIR.name  # "<pid>:<dir>": who chose the paths (absent: the user did)
MONARCH_SPAWNED_ENV = "HYPERACTOR_MESH_BOOTSTRAP_MODE"  # set by Monarch in the processes it spawns
CA_CERT, CA_KEY = "ca.pem", "ca-key.pem"
CA_DAYS, IDENTITY_DAYS = 3650, 365

_installed: Identity | None = None  # this process's identity, once written


@dataclass(frozen=True)
class Identity:
    """A process's TLS identity: the authority's certificate, its own certificate and key (PEM text)."""

    ca: str
    cert: str
    key: str

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, line: str) -> Identity:
        try:
            data = json.loads(line)
            return cls(str(data["ca"]), str(data["cert"]), str(data["key"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise FrayError(f"not a fray TLS identity ({exc})") from None


def tls_dir() -> Path:
    """The user's TLS directory (FRAY_TLS_DIR, else ~/.fray/tls), private: FrayError if it is not this user's."""
    chosen = settings.TLS_DIR.read()
    if chosen is None:
        fray_home()  # ~/.fray 0700 first: private_dir would make a missing parent with the umask
    path = chosen or Path.home() / ".fray" / "tls"
    private_dir(path)
    return path


def runtime_paths() -> None:
    """Point Monarch's TLS variables at files of this process (called by _runtime, before Monarch is imported).
    Kept as they are: variables the user set, and a parent's when the parent made them (a process Monarch
    spawned: it serves with its host's identity). Any other process inheriting fray's variables (a driver or
    worker started from a fray process) gets paths of its own. The files exist only once `install` writes them."""
    owner, _, _ = settings.TLS_RUNTIME_DIR.read().partition(":")
    spawned_by_monarch = MONARCH_SPAWNED_ENV in os.environ and owner == str(os.getppid())
    if spawned_by_monarch or (
        OWNED_ENV not in os.environ and all(os.environ.get(name) for name in (ENV_CA, ENV_CERT, ENV_KEY))
    ):
        return
    base = os.path.join(tempfile.gettempdir(), f"fray-tls-{secrets.token_hex(8)}")  # unguessable: not pre-made
    os.environ[OWNED_ENV] = f"{os.getpid()}:{base}"
    os.environ[ENV_CA], os.environ[ENV_CERT], os.environ[ENV_KEY] = (
        os.path.join(base, name) for name in ("ca.pem", "cert.pem", "key.pem")
    )


def install(identity: Identity) -> None:
    """Write this process's identity where Monarch reads it (before the first TLS channel opens), once: the files
    stay for the life of the process (fray's watchdog removes them when it ends; `remove` when a host worker
    ends), so that their directory's name, which others can list in the temp directory, is never free for another
    user to make it again with an authority of theirs in it. A directory inherited from a parent
    process is the parent's identity, in use: checked, not written. Any directory or file that is not this
    user's and private is a FrayError, never used."""
    from fray.backend import watchdog

    owner, _, base = settings.TLS_RUNTIME_DIR.read().partition(":")
    if not base:
        raise FrayError(
            f"{ENV_CA}, {ENV_CERT} and {ENV_KEY} are set in the environment: fray uses those files for TLS and "
            "does not replace them (unset them to let fray issue this process's identity)"
        )
    global _installed
    if owner != str(os.getpid()) or _installed is not None:
        _check_private(base)  # the parent's (a process Monarch spawned), or written by this process before
        return
    try:
        os.mkdir(base, 0o700)
    except FileExistsError:
        raise FrayError(
            f"{base}, where this process's TLS identity goes, was made by someone else before this process wrote "
            "it: not used. Start the process again (it picks another, random, name)."
        ) from None
    watchdog.watch_path(base)
    for name, text in ((ENV_CA, identity.ca), (ENV_CERT, identity.cert), (ENV_KEY, identity.key)):
        _write_private(Path(os.environ[name]), text.encode())
    _installed = identity


def _check_private(base: str) -> None:
    """`base` and the identity files in it are this user's, private, and no symlinks: else FrayError."""
    for path in (base, *(os.environ[name] for name in (ENV_CA, ENV_CERT, ENV_KEY))):
        try:
            info = os.lstat(path)
        except OSError as exc:
            raise FrayError(f"{path}, of this process's TLS identity, cannot be checked ({exc.strerror})") from None
        kind_ok = stat.S_ISDIR(info.st_mode) if path == base else stat.S_ISREG(info.st_mode)
        if not kind_ok or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise FrayError(
                f"{path}, of this process's TLS identity, is not this user's own private "
                f"{'directory' if path == base else 'file'} (owner uid {info.st_uid}, mode "
                f"{stat.S_IMODE(info.st_mode):o}): not used"
            )


def remove() -> None:
    """The end of a host worker: its identity files go now (the watchdog that would remove them is one of the
    processes it is about to kill)."""
    from fray.backend import watchdog

    owner, _, base = settings.TLS_RUNTIME_DIR.read().partition(":")
    if _installed is None or owner != str(os.getpid()) or not os.path.isdir(base):
        return
    for name in (ENV_CA, ENV_CERT, ENV_KEY):
        Path(os.environ[name]).unlink(missing_ok=True)
    os.rmdir(base)
    watchdog.forget_path(base)


def authority(create: bool = True) -> tuple[bytes, bytes]:
    """(certificate, key) PEM of the user's authority in tls_dir(), made if there is none and `create`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    root = tls_dir()
    cert_path, key_path = root / CA_CERT, root / CA_KEY
    with open(os.open(root / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # host workers starting together on a shared home make one authority
        if cert_path.exists() or key_path.exists():
            return _read_private(cert_path), _read_private(key_path)
        if not create:
            raise FrayError(
                f"no fray TLS authority in {root}: copy the directory from the machine that made it (the driver's "
                f"~/.fray/tls, or set {TLS_DIR_ENV}), or start this host worker with --insecure on a trusted network"
            )
        key = ec.generate_private_key(ec.SECP256R1())
        subject = f"fray CA of {_user()}@{socket.gethostname()}"
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_usage(cert_sign=True), critical=True)
            .sign(key, hashes.SHA256())
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        _write_private(key_path, key_pem)
        _write_private(cert_path, cert_pem)
        return cert_pem, key_pem


def issue(names: Iterable[str], create: bool = True) -> Identity:
    """An identity for a process reached under `names` (host names and addresses: each becomes a subject
    alternative name, as a peer must address it by one of them), issued by the user's authority."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_pem, ca_key_pem = authority(create)
    ca_cert = x509.load_pem_x509_certificate(ca_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise FrayError(f"the TLS authority's key in {tls_dir()} is not an EC key fray made")
    unique = list(dict.fromkeys(n for n in names if n))
    alt: list[x509.GeneralName] = []
    for name in unique:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(name.strip("[]"))))
        except ValueError:
            alt.append(x509.DNSName(name))
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, unique[0] if unique else "fray")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=IDENTITY_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(cert_sign=False), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return Identity(ca_pem.decode(), cert.public_bytes(serialization.Encoding.PEM).decode(), key_pem.decode())


def own_names(*extra: str) -> list[str]:
    """The names this machine may be reached under: `extra` (the address it serves or binds), its host name,
    and the addresses that name resolves to."""
    names = [*extra, socket.gethostname(), socket.getfqdn()]
    try:
        names += [str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None, type=socket.SOCK_STREAM)]
    except OSError:
        pass
    return list(dict.fromkeys(n for n in names if n))


def _usage(cert_sign: bool) -> x509.KeyUsage:
    from cryptography import x509

    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=not cert_sign,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _read_private(path: Path) -> bytes:
    """A file of the TLS directory: this user's, not a symlink, unreadable to others (FrayError naming the fix)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise FrayError(f"cannot read {path} ({exc.strerror}): the TLS authority there is incomplete") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if info.st_uid != os.getuid() or not stat.S_ISREG(info.st_mode):
            raise FrayError(f"{path} is not a file of this user's: not used")
        if info.st_mode & 0o077:
            raise FrayError(f"{path} can be read by other users: `chmod 600 {path}` (and make a new authority)")
        return f.read()


def _user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return str(os.getuid())
