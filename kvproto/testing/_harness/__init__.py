"""What every kit check runs on (KIT-1..KIT-19), importing no check: the check decorator
(``decorator``), failures and who they are attributed to (``failures``, ``attribution``,
``expected``), profiles (``settings``), the drivers that drive a tier as a scheduler would
(``driver``, ``primary_driver``, ``secondary_driver``), test data (``data``), the state machines'
step log (``steps``), the crash child (``crash``), the preflight, the thread ledger, how a tier
presents itself (``tier_spec``, re-exporting :mod:`kvproto.hosting`'s TierSpec) and the kit's options
for engine targets (``engine_targets``)."""
