"""The kit's fault injection, all of it in the kit (KIT-15): wrappers around a tier (``secondary``,
``primary``, ``latency``, over the shared raise rules of ``rules``) and around a
:class:`~kvproto.tierkit.BlobBackend` (``backend``: :class:`~kvproto.testing.FaultyBackend`;
``probes``: the kit's counting and gating instruments below it). Public through
:mod:`kvproto.testing.faults` and :mod:`kvproto.testing`."""
