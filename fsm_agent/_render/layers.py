"""The package's layers as a picture, drawn from its real imports.

Every module of ``fsm_agent`` is parsed (``ast``, nothing is imported) and each
``import`` of another top-level part of the package (``_core``, ``_trace``, ``_durable``,
...) becomes an arrow between the two parts, so the architecture page shows what the code
does rather than what someone drew once. Imports inside functions count too (they are
deferred, not absent) and are drawn dashed; ``TYPE_CHECKING`` blocks are left out (types
only). An arrow implied by a longer path (``_cli`` → ``_core`` when ``_cli`` → ``_runtime`` →
``_core``) is left out of the picture, so the layering shows; :func:`layer_imports` keeps
them all.
"""

from __future__ import annotations

import ast
from pathlib import Path

__all__ = ["LAYERS", "layer_dot", "layer_imports", "reduced"]

#: The layers, lowest first (as ``fsm_agent/__init__.py`` lists them).
LAYERS: tuple[str, ...] = (
    "_errors",
    "_rules",
    "_core",
    "_trace",
    "_durable",
    "tools",
    "_runtime",
    "models",
    "otel",
    "_render",
    "testing",
    "server",
    "_cli",
)

_BLURB = {
    "_errors": "one exception tree",
    "_rules": "your own rules:\\nRule, RuleSet, CEL",
    "_core": "table, guards, select,\\nstate, sans-IO loop",
    "_trace": "events, JSONL, checker",
    "_durable": "stores, resume, review",
    "tools": "registry, MCP",
    "_runtime": "drivers (all I/O), Runtime",
    "models": "scripted, providers",
    "otel": "GenAI spans (interceptor)",
    "_render": "diagrams, replay, viewer",
    "testing": "pytest toolkit",
    "server": "review API, live feed, UI",
    "_cli": "fsm-agent command",
}


def _part(module: str) -> str | None:
    pieces = module.split(".")
    if pieces[0] != "fsm_agent" or len(pieces) < 2:
        return None
    return pieces[1].removesuffix(".py")


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[tuple[str, bool]]:
    """``(module, deferred)`` for each import, skipping ``if TYPE_CHECKING:`` blocks."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, deferred: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                continue
            inner = deferred or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                found.extend((alias.name, deferred) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                found.append((child.module, deferred))
                found.extend((f"{child.module}.{a.name}", deferred) for a in child.names)
            visit(child, inner)

    visit(tree, False)
    return found


def layer_imports(package: Path) -> dict[tuple[str, str], bool]:
    """``(from, to) -> deferred only`` for every import between two parts."""
    edges: dict[tuple[str, str], bool] = {}
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package.parent).with_suffix("")
        source = _part(".".join(relative.parts))
        if source not in LAYERS:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for module, deferred in _imports(tree):
            target = _part(module)
            if target in LAYERS and target != source:
                key = (source, target)
                edges[key] = edges.get(key, True) and deferred
    return edges


def reduced(edges: dict[tuple[str, str], bool]) -> dict[tuple[str, str], bool]:
    """The edges not implied by a longer path (a transitive reduction of the DAG)."""
    after: dict[str, set[str]] = {}
    for source, target in edges:
        after.setdefault(source, set()).add(target)

    def reachable(start: str, skip: tuple[str, str]) -> set[str]:
        seen: set[str] = set()
        todo = [start]
        while todo:
            node = todo.pop()
            for nxt in after.get(node, ()):
                if (node, nxt) != skip and nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    return {e: d for e, d in edges.items() if e[1] not in reachable(e[0], e)}


def layer_dot(package: Path) -> str:
    """DOT of the layers, highest at the top, an arrow from each part to what it imports."""
    edges = reduced(layer_imports(package))
    lines = [
        "digraph layers {",
        "  graph [rankdir=TB, fontname=Helvetica, fontsize=13, nodesep=0.35, ranksep=0.4, "
        'label="fsm_agent: an arrow goes from a part to a part it imports (drawn from the '
        'code;\\ndashed: only inside functions; arrows implied by a longer path left out)", '
        "labelloc=t];",
        '  node [shape=box, style="rounded,filled", fillcolor="#e8f0fe", '
        "fontname=Helvetica, fontsize=13];",
        '  edge [color="#5f6368", arrowsize=0.7];',
    ]
    for layer in LAYERS:
        lines.append(f'  {layer} [label="{layer}/\\n{_BLURB[layer]}"];')
    for (source, target), deferred in sorted(edges.items()):
        style = ", style=dashed" if deferred else ""
        lines.append(f'  {source} -> {target} [id="import-{source}-{target}"{style}];')
    lines.append("}")
    return "\n".join(lines) + "\n"
