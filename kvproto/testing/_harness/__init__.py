"""What every kit check runs on (KIT-1..KIT-19): the check decorator (``decorator``), failures and
who they are attributed to (``failures``, ``attribution``, ``expected``), profiles (``settings``), the
drivers that drive a tier as a scheduler would (``driver``, ``primary_driver``, ``secondary_driver``),
test data (``data``), the state machines' step log (``steps``), the crash child
(``crash``), the preflight, the thread ledger, and how a tier presents itself (``tier_spec``,
``hosting``)."""
