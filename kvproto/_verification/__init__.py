"""The scan verifier behind ``kvproto verify`` (SCAN-1..SCAN-12), out of the kit: its public face is
:mod:`kvproto.testing.scans`, which names what an engine integrator uses; the modules here hold the
reference scans, the inputs, the exhaustive, Hypothesis and CrossHair checks and the third-party
scan targets.
"""
