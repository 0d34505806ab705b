"""Reaching other machines: TLS identities and the user's authority (tls), the driver's address and Monarch's
transport (network), and the lifeline that ends a driver's processes on other hosts when it ends (lifeline).
"""
