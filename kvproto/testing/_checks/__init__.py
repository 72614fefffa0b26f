"""The kit's checks, one file per contract area (KIT-1): what :class:`~kvproto.testing.SecondaryTierTests`
and :class:`~kvproto.testing.PrimaryTierTests` are made of.

* ``shared.py``: the checks both kinds of tier pass (LR-1, TIER-4, TIER-12, TIER-14, TIER-16, TIER-17),
  and the bodies of the role-named ones (TIER-1, TIER-15, TIER-16);
* ``threads_and_order.py``: batch answers in any key order, calls from changing threads, a declared
  LRU order (TIER-17, TIER-19, TIER-20, CAP-6), for both kinds;
* ``machines.py``: how the state machines of :mod:`kvproto.testing.stateful` run as checks (KIT-7, KIT-8);
* ``secondary/``: ``suite.py`` (the composed class: jobs, capabilities, lifecycle), ``role.py``
  (fixtures, hook stubs, the role interface), ``lookups_jobs_bytes.py``, ``threads_and_order.py``
  (events, layouts), ``sharing.py``, ``namespaces.py``, ``faults_below.py``, ``faults_inside.py``,
  ``crash.py``, ``held_hits.py``, ``budgets.py``, ``request_plans.py``;
* ``primary/``: ``suite.py``, ``pins.py``, ``deadlines.py``, ``optional_abilities.py``,
  ``threads_and_order.py``.

``kvproto conform TARGET --explain CHECK`` names the file and line of any check.
"""
