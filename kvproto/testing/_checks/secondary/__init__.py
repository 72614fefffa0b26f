"""The secondary tier's checks by contract area; :mod:`.suite` composes them into
:class:`~kvproto.testing.SecondaryTierTests`."""
