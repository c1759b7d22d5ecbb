"""``OffloadingConnector``: restore units of KV kept in CPU memory and on local disk.

Files: ``config`` (options), ``units`` (what a restore unit holds and where its parts go),
``policies`` (LRU / ARC eviction order), ``tier`` (residency, pins and byte accounting shared by
both tiers), ``cpu_tier`` and ``disk_tier`` (the bytes), ``scheduler`` (lookups, load and store
planning), ``loads`` (verified copies of a load's parts into the device cache), ``worker``
(load threads, timeouts, stores, backpressure), ``tier_registry`` (a ``TierEntry`` per tier:
name, KV events medium, options, factory; the built-ins' in ``builtin_tiers``), ``connector``
(the factory).
See ``docs/offloading.md``.
"""
