"""``FaultInjection``: wraps a real connector and fails, delays or corrupts its loads on a seeded
plan (``connector``; ``plan`` the parsed plan). For tests and the B5 benchmark."""
