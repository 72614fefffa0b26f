"""Tests of the reference filesystem tier (impls/fs, distribution kvproto-fs)."""
