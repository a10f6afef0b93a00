"""Traces: events, JSON Lines reading and writing, the chain, and the checker."""

from fsm_agent._trace.chain import encode_events, strip_links
from fsm_agent._trace.io import JsonlTrace, TraceSink, iter_trace, read_trace

__all__ = ["JsonlTrace", "TraceSink", "encode_events", "iter_trace", "read_trace", "strip_links"]
