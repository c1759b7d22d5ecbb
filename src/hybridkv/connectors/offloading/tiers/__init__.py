"""The offloading tiers, one folder each: ``entry.py`` (the registry entry: options and factory)
beside the tier's own files. The contract is ``tier_base.Tier``; residency is ``tier.TierIndex``.
"""
