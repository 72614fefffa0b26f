"""Test-side companions of spec/CONTRACT.md: deliberately wrong scans (mutants) the verification must catch. Not installed."""
