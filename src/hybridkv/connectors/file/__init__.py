"""``FileConnector``: a prompt's KV saved to and loaded from one file per block span on a shared
directory (``connector``; ``format`` the file layout and checks, ``store`` names and atomic
writes, ``saves`` and ``worker`` the background I/O)."""
