"""The version of the contract, the kit and the CLI (one number: they ship in one wheel)."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.2.0"
