"""The runtime: configuration, the sync and async drivers, and the ``Runtime`` facade."""

from fsm_agent.runtime.runtime import Model, Runtime

__all__ = ["Model", "Runtime"]
