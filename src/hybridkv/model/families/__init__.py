"""Model families as data, importable without torch: one ``ModelFamily`` descriptor per family
(``<family>.py``: its architectures and their classes, model types, layer kinds, make-model
configs, checkpoint renames), the ``ModelFamily`` type (``family.py``), config parts several
families share (``parts.py``) and the registry (``registry.py``) the loader, ``make-model``, the
CLI's ``--arch`` choices and the parity tests read.
"""
