"""The data plane between hosts over TLS (`transport=tls`): each end presents this process's identity, the one
its Monarch control plane uses (net/tls.py), and accepts only a peer whose certificate chains to the user's
authority. TLS 1.3 then authenticates, protects and encrypts every byte, so the transfer messages inside carry
no tag of their own (transfer_wire.py); the capability proofs stay, as they bind a pull to one allocation of one
owner process, which a certificate of the user's does not.
"""

from __future__ import annotations

import functools
import os
import ssl
from dataclasses import dataclass

from fray.errors import FrayError
from fray_monarch.net.tls import ENV_CA, ENV_CERT, ENV_KEY


@dataclass(frozen=True)
class TlsContexts:
    server: ssl.SSLContext  # a transfer server's: a reader must present a certificate of the authority
    client: ssl.SSLContext  # a reader's: the owner must present one too


@functools.cache
def contexts() -> TlsContexts:
    """This process's TLS contexts for the data plane, from the identity files Monarch uses (made once)."""
    paths = {name: os.environ.get(name, "") for name in (ENV_CA, ENV_CERT, ENV_KEY)}
    missing = [name for name, path in paths.items() if not path or not os.path.isfile(path)]
    if missing:
        raise FrayError(
            f"transport=tls encrypts values between hosts with this process's TLS identity, and it has none "
            f"({', '.join(missing)} not set or not a file): it needs TLS between the machines (not insecure=true)"
        )
    made: list[ssl.SSLContext] = []
    for purpose in (ssl.PROTOCOL_TLS_SERVER, ssl.PROTOCOL_TLS_CLIENT):
        context = ssl.SSLContext(purpose)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.load_cert_chain(paths[ENV_CERT], paths[ENV_KEY])
        context.load_verify_locations(paths[ENV_CA])
        context.verify_mode = ssl.CERT_REQUIRED
        made.append(context)
    # A transfer server listens on an address its certificate need not name (the one that routes to the driver);
    # any certificate of the user's authority will do, and the capability proof then names the owner.
    made[1].check_hostname = False
    made[1].verify_mode = ssl.CERT_REQUIRED
    return TlsContexts(made[0], made[1])
