"""The runtime: configuration, the sync and async drivers, and the ``Runtime`` facade."""

from fsm_agent._runtime.runtime import Model, Runtime

__all__ = ["Model", "Runtime"]
