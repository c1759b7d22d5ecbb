"""``--reasoning-parser``: the model's thinking split from its answer (``reasoning_content``)."""
