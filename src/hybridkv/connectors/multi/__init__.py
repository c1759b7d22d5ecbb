"""``MultiConnector``: several connectors in order; a load comes from the first that has the
most (``connector``; ``config`` its options, ``select`` the choice, ``worker`` the worker side)."""
