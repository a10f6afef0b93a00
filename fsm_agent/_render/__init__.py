"""Pictures of the run machine, drawn from the transition table, and replays of traces.

``edges`` groups the table into drawn edges, ``dot``/``mermaid`` write the diagram
sources, ``engine`` turns DOT into SVG/PNG (Graphviz ``dot`` or its WebAssembly build),
``replay`` walks a trace into frames, ``stepper`` shows it in a terminal and ``html``
writes the self-contained viewer.
"""

from fsm_agent._render.dot import machine_dot
from fsm_agent._render.edges import EDGES, DrawnEdge, edge_of
from fsm_agent._render.engine import RenderError, render
from fsm_agent._render.mermaid import machine_mermaid

__all__ = [
    "EDGES",
    "DrawnEdge",
    "RenderError",
    "edge_of",
    "machine_dot",
    "machine_mermaid",
    "render",
]
