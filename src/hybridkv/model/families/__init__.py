"""Model families: the registry of Hugging Face architecture names -> model classes
(``registry.py``, imported lazily) and the make-model configs of the newer families
(``parts.py``)."""
