"""The translation server (``onmt_lite serve``): OpenNMT-py's and LibreTranslate's HTTP APIs over
the translator, sentences of many requests decoded in shared batches. Needs the ``serve`` extra
(FastAPI, uvicorn); the translator itself has no HTTP code."""
