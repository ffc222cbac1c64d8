"""The output processor: per-step core outputs → text, stop strings, timings, RequestOutputs.

``processor`` holds the OutputProcessor, ``request_state`` what it keeps per request,
``detokenizer`` the incremental detokenizer.
"""

from engine.output_processor.processor import OutputProcessor, ProcessedOutputs
from engine.output_processor.request_state import RequestState, SampleState

__all__ = ["OutputProcessor", "ProcessedOutputs", "RequestState", "SampleState"]
