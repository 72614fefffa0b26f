"""Tier building blocks: what every tier and tier wrapper needs, by composition (issue 16).

The protocols stay structural: nothing here is a required base class.
"""

from __future__ import annotations

# wrappers
from kvproto.tierkit._forwarding import ForwardingPrimary, ForwardingSecondary, declared_capabilities

__all__ = [
    # wrappers
    "ForwardingPrimary",
    "ForwardingSecondary",
    "declared_capabilities",
]
