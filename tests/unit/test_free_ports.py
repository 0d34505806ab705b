"""free_ports: the ports fray chooses for a private Ray head (nine at once) and for SPMD rendezvous."""

from __future__ import annotations

import socket

from fray.host.net import _ephemeral_low, free_port, free_ports


def test_ports_chosen_together_are_distinct() -> None:
    # Picked and released one at a time, 9 ports held a duplicate in about 1 start of 450 here, and `ray start`
    # refused it ("trying to use a port number ... used by other components"). 400 picks nearly always repeat one.
    ports = free_ports(400)
    assert len(set(ports)) == 400 and all(0 < p < 65536 for p in ports)


def test_a_free_port_can_be_listened_on() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", free_port()))
        sock.listen()


def test_ports_are_picked_below_the_ephemeral_range() -> None:
    # A port from the ephemeral range may be handed to any process's connect or bind(0) before the listener it
    # was picked for binds it: an SPMD group's gloo rendezvous failed so with EADDRINUSE in CI.
    ports = free_ports(50)
    assert all(20000 <= p < _ephemeral_low() for p in ports), ports
