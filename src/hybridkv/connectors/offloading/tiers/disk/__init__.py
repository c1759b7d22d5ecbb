"""The disk tier: one file per unit under a directory (``tier``; ``format`` the file header and
checksums, ``key`` file names, ``io`` timed reads and writes, ``scan`` and ``probe`` start-up)."""
