"""The remote tier: units in a shared Valkey/Redis store (``tier``; ``format`` the keyed-MAC
value, ``key`` key names and secrets, ``connect`` the client, ``reply`` and ``checks`` parsing
what the store returns)."""
