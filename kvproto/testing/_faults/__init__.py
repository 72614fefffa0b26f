"""The kit's fault injection, all of it in the kit (KIT-15, TIERKIT-4): wrappers around a tier
(``secondary``, ``primary``, ``latency``, over the shared raise rules of ``rules``) and around a
:class:`~kvproto.tierkit.BlobBackend` (``backend``: :class:`~kvproto.testing.FaultyBackend`;
``probes``: the kit's counting and gating instruments below it), and ``jobs``
(:func:`~kvproto.testing.faulty_jobs`: a tier class that fails the jobs a FaultyBackend below it
arms, above the tier's job path), ``requests`` (:class:`~kvproto.testing.RequestFaults`: a remote tier's
requests counted and failed, for its conformance spec). Public through :mod:`kvproto.testing.faults` and
:mod:`kvproto.testing`."""
