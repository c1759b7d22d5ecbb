"""``OffloadingConnector``: restore units of KV kept in CPU memory, on local disk and in a shared store.

Files: ``config`` (options), ``units`` (what a restore unit holds and where its parts go),
``policies`` (LRU / ARC eviction order), ``tier`` (residency, pins and byte accounting shared by
the tiers), ``tier_base`` (the ``Tier`` contract), ``tiers/`` (one folder per tier: cpu, disk,
remote), ``tier_registry`` (a ``TierEntry`` per tier: name, KV events medium, options, factory;
the built-ins listed in ``builtin_tiers``), ``scheduler`` (lookups, load and store planning),
``loads`` (verified copies of a load's parts into the device cache), ``worker`` (load threads,
timeouts, stores, backpressure), ``connector`` (the factory).
See ``docs/offloading.md``.
"""
