"""Traces: events, JSON Lines reading and writing, and the checker."""

from fsm_agent.trace.io import JsonlTrace, TraceSink, iter_trace, read_trace

__all__ = ["JsonlTrace", "TraceSink", "iter_trace", "read_trace"]
