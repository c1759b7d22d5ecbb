"""The OpenAI-compatible HTTP server and its Prometheus metrics (``hybridkv serve``).

Importing this package imports nothing heavy; ``app.create_app`` and ``launch.run_server``
bring in FastAPI and uvicorn.
"""
