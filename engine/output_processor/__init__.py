"""The output processor: per-step core outputs → text, stop strings, timings, RequestOutputs.

``processor`` holds the OutputProcessor, ``request_state`` what it keeps per request,
``detokenizer`` the incremental detokenizer.
"""

from engine.output_processor.processor import OutputProcessor, ProcessedOutputs

__all__ = ["OutputProcessor", "ProcessedOutputs"]
