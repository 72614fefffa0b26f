"""Reference tier implementations for kvproto.

Each subpackage implements one tier through kvproto's public API only, so it
doubles as an example for third-party tier authors: ``impls.cpu`` is the CPU
primary tier (pinned host memory, torch data plane).
"""
