"""The cpu tier: restore units in pinned-size host buffers (``tier``, ``host_buffers``)."""
