"""One forward pass per ``SchedulerOutput``: the ``ModelRunner`` (``runner.py``) and what it
builds for a step. ``step_builder.py`` turns the scheduled requests into the ``StepContext``
the layers read (``layers/step_context.py``; request-level tensors in ``request_tensors.py``, the
pure-torch attention metadata in ``attn_meta_torch.py``); ``cache_tensors.py`` allocates the
KV cache as the layout places it (on huge pages, ``host_memory.py``); ``threads.py`` sizes the
compute threads per step.
"""
