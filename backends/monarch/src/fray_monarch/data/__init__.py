"""The data plane: each process's shared-memory store (arena: owner side; mappings: readers on the same host;
store: both), and the transfers between hosts (transfer: reader side and the choice of path; transfer_server:
owner side; transfer_wire: the wire format; transfer_tls: TLS between the ends).
"""
