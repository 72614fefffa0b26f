"""Tests of the reference CPU primary tier (impls.cpu)."""
