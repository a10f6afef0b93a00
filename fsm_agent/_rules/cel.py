"""CEL conditions: compiled and type-checked once, evaluated on screened inputs.

The engine is ``cel-expr-python``, the CEL team's binding of the C++ implementation (see
``docs/concepts/own-rules-design.md`` for the measurements behind the choice). It has a
real checker: an unknown variable, an unknown function or a type error is found when the
rule set is built, with the line and column, before any run.

Every phase declares only the variables that exist in it (``args`` in an ``answer`` rule
is an unknown variable, found at construction, not a run-time surprise). Inputs are
screened before they cross into C++: the library crashes the process on data nested a few
thousand deep and refuses lone surrogates with an unhelpful message, so :func:`screen`
turns every such value into a precise :class:`Unrepresentable` that the caller fails
closed on.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from fsm_agent._rules import celfast

__all__ = [
    "MAX_DEPTH",
    "PHASE_VARIABLES",
    "CelBatch",
    "CelProblem",
    "CelProgram",
    "Quantifier",
    "Tally",
    "Unrepresentable",
    "activation",
    "argument_fields",
    "available",
    "compile_batch",
    "compile_condition",
    "quantifier",
    "referenced_names",
    "screen",
    "selected_fields",
]

#: The nesting a screened input may have; the same bound strict JSON parsing uses for
#: tool arguments in ``fsm_agent._core.jsonsafe`` (and far below where the C++ engine's
#: recursion overflows the stack, a few thousand levels).
MAX_DEPTH = 100

#: CEL's integers: int is signed 64-bit and uint unsigned 64-bit; a larger value has no
#: CEL reading, and another library's silent conversion to a double is what we avoid.
_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1

#: The variables each phase declares, and their CEL types (``dyn`` where a value is any
#: JSON value). ``counters`` holds nested maps (``tool_attempts`` per tool), hence dyn.
PHASE_VARIABLES: Mapping[str, Mapping[str, str]] = {
    "before_tool": {
        "tool": "string",
        "effect": "string",
        "args": "map",
        "counters": "map",
        "calls": "list",
        "context": "map",
    },
    "after_tool": {
        "tool": "string",
        "effect": "string",
        "args": "map",
        "result": "dyn",
        "counters": "map",
        "calls": "list",
        "context": "map",
    },
    "before_model": {"counters": "map", "calls": "list", "context": "map"},
    "answer": {"answer": "string", "counters": "map", "calls": "list", "context": "map"},
}

#: The element types of a batch whose every condition gave a verdict.
_BOOL = {bool}

_ERROR_LINE = re.compile(r"ERROR: <input>:(-?\d+):(-?\d+): (.*)")
_STRING_LITERAL = re.compile(
    r"""[rR]?(?:'''.*?'''|\"\"\".*?\"\"\"|'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*")""", re.S
)
_IDENTIFIER = re.compile(r"(?<![.\w])[A-Za-z_]\w*")
_ARG_FIELD = re.compile(r"(?<![.\w])args\s*\.\s*([A-Za-z_]\w*)")


@dataclass(frozen=True)
class CelProblem:
    """One mistake in a condition: 1-based line and column (0 when the engine gives none)."""

    line: int
    column: int
    message: str

    def where(self) -> str:
        return f"line {self.line}, column {self.column}" if self.line > 0 else "(no position)"


class Unrepresentable(ValueError):
    """An input value CEL cannot take: names where it is and what it is."""


def available() -> bool:
    """Whether the CEL engine is installed (it needs Python 3.11+ and the ``cel`` extra)."""
    return _cel() is not None


def _cel() -> Any:
    try:
        from cel_expr_python import cel
    except ImportError:  # not installed (Python 3.10, or no `cel` extra)
        return None
    return cel


_ENVS: dict[str, Any] = {}


def _env(phase: str) -> Any:
    """The phase's checking environment, built once per process (it is immutable)."""
    env = _ENVS.get(phase)
    if env is None:
        cel = _cel()
        kinds = {
            "string": cel.Type.STRING,
            "dyn": cel.Type.DYN,
            "map": cel.Type.Map(cel.Type.STRING, cel.Type.DYN),
            "list": cel.Type.List(cel.Type.DYN),
        }
        names = PHASE_VARIABLES[phase]
        env = cel.NewEnv(variables={name: kinds[kind] for name, kind in names.items()})
        _ENVS[phase] = env
    return env


#: ``env -> True | False | None``: a condition read into Python (``celfast``), ``None``
#: meaning "ask the engine".
Fast = celfast.Fast


class CelProgram:
    """A checked condition of one phase; :meth:`evaluate` never raises."""

    __slots__ = (
        "_error", "_expression", "checked", "fast", "names", "phase", "quantifier", "source",
    )  # fmt: skip

    def __init__(self, source: str, phase: str, expression: Any, names: frozenset[str]) -> None:
        self.source = source
        self.phase = phase
        self._expression = expression
        self._error = _cel().Type.ERROR  # looked up once: evaluate is the hot path
        self.names = names  # the phase variables the source mentions: all it is given
        #: The condition as a quantifier over ``calls`` whose body reads only the call,
        #: when it is one (then it can be judged call by call, each call once per run).
        self.quantifier = quantifier(source, phase)
        #: The condition in Python where it is within ``celfast``'s subset, else ``None``.
        self.checked: bytes = expression.serialize()  # the checked AST (cel.expr.CheckedExpr)
        self.fast: Fast | None = celfast.compile_checked(self.checked, *_kinds(phase))

    def evaluate_on(self, screened: dict[str, Any], activation: Callable[[], Any]) -> bool | str:
        """:meth:`evaluate`, in Python where that is sure to agree with the engine:
        ``screened`` holds the screened inputs, ``activation()`` gives them as an
        activation (built only when the engine is asked)."""
        fast = self.fast
        if fast is not None:
            value = fast(screened)
            if value is not None:
                return value
        return self.evaluate(activation())

    def evaluate(self, activation: Any) -> bool | str:
        """``True``/``False``, or a string saying why the condition has no value.

        ``activation`` comes from :func:`activation` (inputs already screened)."""
        try:
            value = self._expression.eval(activation)
            if value.type() == self._error:
                return _one_line(str(value.value()))
            result = value.value()
        except Exception as exc:  # the engine's errors are RuntimeError or ValueError
            return _one_line(f"{type(exc).__name__}: {exc}")
        if not isinstance(result, bool):
            return f"the condition gave {type(result).__name__} {result!r:.60}, not a bool"
        return result


class CelBatch:
    """Several checked conditions of one phase as one program, ``[c1, c2, ...]``.

    One evaluation instead of one per rule: crossing into C++ and reading the result
    costs more than a typical condition itself. CEL is side-effect free, so evaluating
    a condition past the one that decides changes nothing; when any of them fails the
    whole list fails, and the caller evaluates them one by one (to fail closed on the
    right rule, and only when an earlier one did not decide)."""

    __slots__ = ("_error", "_expression", "fast", "size")

    def __init__(self, expression: Any, size: int, fast: celfast.FastMany | None = None) -> None:
        self._expression = expression
        self._error = _cel().Type.ERROR
        self.size = size
        #: Every condition in Python (``celfast``), or ``None`` where one is not.
        self.fast = fast

    def evaluate_on(
        self, screened: dict[str, Any], activation: Callable[[], Any]
    ) -> list[bool] | None:
        """:meth:`evaluate`, in Python where every condition is sure to agree with the
        engine (as :meth:`CelProgram.evaluate_on`); the engine is asked otherwise."""
        fast = self.fast
        if fast is not None:
            results = fast(screened)
            if results is not None:
                return results
        return self.evaluate(activation())

    def evaluate(self, activation: Any) -> list[bool] | None:
        try:
            value = self._expression.eval(activation)
            if value.type() == self._error:
                return None
            results = value.plain_value()
        except Exception:  # any failure: the caller evaluates the rules one by one
            return None
        if type(results) is not list or len(results) != self.size:
            return None
        return results if set(map(type, results)) == _BOOL else None


def _kinds(phase: str) -> tuple[frozenset[str], frozenset[str]]:
    """The phase's variables, and those of them declared as maps (for ``celfast``)."""
    names = PHASE_VARIABLES[phase]
    return frozenset(names), frozenset(n for n, kind in names.items() if kind == "map")


def compile_batch(programs: list[CelProgram], phase: str) -> CelBatch | None:
    """One program for ``programs`` (already checked one by one), or ``None`` when the
    list does not compile (past the engine's nesting limit, say): then one by one."""
    if len(programs) < 2:
        return None
    try:
        expression = _env(phase).compile("[" + ", ".join(f"({p.source})" for p in programs) + "]")
    except Exception:
        return None
    fast = None
    if all(p.fast is not None for p in programs):
        fast = celfast.compile_many([p.checked for p in programs], *_kinds(phase))
    return CelBatch(expression, len(programs), fast)


class Quantifier:
    """``calls.exists(c, BODY)`` (``all``, ``exists_one``, or ``calls.filter(c,
    BODY).size() OP N``) where ``BODY`` reads no phase variable, only its call ``c``.

    Its value follows from ``BODY`` on each call alone, and a run's calls only grow, so
    it is judged from a tally of the calls seen (:class:`Tally`), each call evaluated
    once per run, instead of handing CEL every executed call at every judgement (the
    binding converts each again, and keeps no converted value between evaluations).
    The tally gives CEL's own verdict (``exists``: true if any call holds, else an error
    if any call's body is one, else false; ``all`` the converse; ``exists_one`` and a
    filter's size: an error if any call's body is one); where it is an error, the caller
    evaluates the condition whole, for CEL's own message."""

    __slots__ = ("_error", "_expression", "bound", "fast", "kind", "op", "source", "variable")

    def __init__(
        self, kind: str, variable: str, source: str, expression: Any, op: str, bound: int
    ) -> None:
        self.kind, self.variable, self.op, self.bound = kind, variable, op, bound
        self.source = source  # the body
        self._expression = expression
        self._error = _cel().Type.ERROR
        #: The body in Python where it is within ``celfast``'s subset, else ``None``.
        self.fast: Fast | None = celfast.compile_checked(
            expression.serialize(), frozenset({variable})
        )

    def holds(self, call: Any) -> bool | None:
        """``BODY`` on one screened call: ``None`` where it is an error or not a bool."""
        fast = self.fast
        if fast is not None:
            value = fast({self.variable: call})
            if value is not None:
                return value
        try:
            value = self._expression.eval(data={self.variable: call})
            if value.type() == self._error:
                return None
            result = value.value()
        except Exception:  # the engine's errors: counted as errors (the caller re-evaluates)
            return None
        return result if type(result) is bool else None

    def verdict(self, tally: Tally) -> bool | None:
        """The condition's value from the tally of every call, ``None`` for an error."""
        if self.kind == "exists":
            return True if tally.trues else None if tally.errors else False
        if self.kind == "all":
            return False if tally.falses else None if tally.errors else True
        if tally.errors:
            return None
        if self.kind == "exists_one":
            return tally.trues == 1
        return bool(_COMPARE[self.op](tally.trues, self.bound))


class Tally:
    """How many calls so far the body held for, did not, and could not say."""

    __slots__ = ("errors", "falses", "seen", "trues")

    def __init__(self) -> None:
        self.seen = self.trues = self.falses = self.errors = 0

    @classmethod
    def of_falses(cls, count: int) -> Tally:
        """The tally of ``count`` calls the body was false for."""
        tally = cls()
        tally.seen = tally.falses = count
        return tally

    def add(self, held: bool | None) -> None:
        self.seen += 1
        if held is None:
            self.errors += 1
        elif held:
            self.trues += 1
        else:
            self.falses += 1


_COMPARE: Mapping[str, Any] = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b, "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
}  # fmt: skip
_QUANTIFIED = re.compile(
    r"\s*calls\s*\.\s*(exists_one|exists|all|filter)\s*(\()\s*([A-Za-z_]\w*)\s*,"
)
_SIZE_BOUND = re.compile(r"\.\s*size\s*\(\s*\)\s*(==|!=|>=|<=|>|<)\s*(\d{1,18})\s*")
_ELEMENT_ENVS: dict[str, Any] = {}


def bodies(quantifiers: Sequence[Quantifier]) -> Callable[[Any], Sequence[bool | None]]:
    """``call -> [each quantifier's body on it]``: one evaluation for all of them (the
    call converted once), each one alone where that fails (to tell which erred). Where
    every body reads its call by field name only (``c.tool``, ``c.args``), the call is
    given as those fields: the binding converts no more of it (its ``result``, say)."""
    one: list[Callable[[Any], bool | None]] = [q.holds for q in quantifiers]
    if all(q.fast is not None for q in quantifiers):  # in Python: no conversion to spare
        return _fused(quantifiers, one)
    project = _projection(quantifiers)
    if len(quantifiers) < 2:
        return lambda call: [holds(project(call)) for holds in one]
    names = sorted({q.variable for q in quantifiers})
    env = _cel().NewEnv(variables={name: _cel().Type.DYN for name in names})
    try:
        expression = env.compile("[" + ", ".join(f"({q.source})" for q in quantifiers) + "]")
    except Exception:
        return lambda call: [holds(project(call)) for holds in one]
    error, size = _cel().Type.ERROR, len(quantifiers)

    def evaluate(call: Any) -> list[bool | None]:
        call = project(call)
        try:
            value = expression.eval(data=dict.fromkeys(names, call))
            results = value.plain_value() if value.type() != error else None
        except Exception:
            results = None
        if type(results) is list and len(results) == size and set(map(type, results)) == _BOOL:
            return results
        return [holds(call) for holds in one]

    return evaluate


def _fused(
    quantifiers: Sequence[Quantifier], one: list[Callable[[Any], bool | None]]
) -> Callable[[Any], Sequence[bool | None]]:
    """Every body (each within ``celfast``'s subset) as one generated function of the
    call; where it cannot say for one of them, each body alone (to tell which erred)."""
    names = sorted({q.variable for q in quantifiers})

    def alone(call: Any) -> list[bool | None]:
        return [holds(call) for holds in one]

    # Generated to take the call itself, a map (the engine's entries are): tested once,
    # not at every field read; where it cannot say (a call that is not a map, say), each
    # body alone tells which erred.
    many = celfast.compile_many(
        [q._expression.serialize() for q in quantifiers], frozenset(names), frozenset(names),
        otherwise=alone,
    )  # fmt: skip
    if many is None:
        return alone
    return cast(Callable[[Any], Sequence[bool | None]], many)  # (it takes the call itself)


def _projection(quantifiers: Sequence[Quantifier]) -> Callable[[Any], Any]:
    """``call -> the fields of it the bodies select``, or the call itself where a body
    reads it otherwise (indexed, iterated, passed whole)."""
    fields: set[str] = set()
    for q in quantifiers:
        selected = selected_fields(q.source, q.variable)
        if selected is None:
            return lambda call: call
        fields |= selected
    kept = tuple(sorted(fields))

    def project(call: Any) -> Any:
        if type(call) is not dict:
            return call
        return {field: call[field] for field in kept if field in call}

    return project


def quantifier(source: str, phase: str) -> Quantifier | None:
    """``source`` as a :class:`Quantifier`, or ``None`` if it is not one (then it is only
    ever evaluated whole). Read from the text with string literals blanked out, and
    refused at the least doubt: a comment, a body reading a phase variable, a body that
    does not check in an environment holding only its call."""
    if "calls" not in PHASE_VARIABLES[phase]:
        return None
    bare = _STRING_LITERAL.sub(lambda m: " " * len(m.group(0)), source)
    head = _QUANTIFIED.match(bare)
    if head is None or "//" in bare:
        return None
    kind, variable = head.group(1), head.group(3)
    close = _closing(bare, head.start(2))
    if close is None or variable in PHASE_VARIABLES[phase]:
        return None
    body, rest = source[head.end() : close], bare[close + 1 :]
    op, bound = "", 0
    if kind == "filter":
        tail = _SIZE_BOUND.fullmatch(rest)
        if tail is None:
            return None
        kind, op, bound = "count", tail.group(1), int(tail.group(2))
    elif rest.strip():
        return None
    if referenced_names(body, phase):
        return None
    env = _ELEMENT_ENVS.get(variable)
    if env is None:
        env = _ELEMENT_ENVS[variable] = _cel().NewEnv(variables={variable: _cel().Type.DYN})
    try:
        expression = env.compile(body)
    except Exception:
        return None
    returned = expression.return_type()
    if returned != _cel().Type.BOOL and returned != _cel().Type.DYN:
        return None
    return Quantifier(kind, variable, body, expression, op, bound)


def _closing(bare: str, opening: int) -> int | None:
    """The index of the parenthesis closing the one at ``opening`` (strings blanked)."""
    depth = 0
    for index in range(opening, len(bare)):
        char = bare[index]
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return index
    return None


def activation(phase: str, variables: Mapping[str, Any]) -> Any:
    """One set of screened inputs that every condition of ``phase`` can be evaluated on."""
    return _env(phase).Activation(variables)


def compile_condition(source: str, phase: str) -> CelProgram | list[CelProblem]:
    """Parse and type-check ``source`` in ``phase``; the problems if it does not check."""
    if not isinstance(source, str) or not source.strip():
        return [CelProblem(0, 0, "the condition is empty")]
    try:
        expression = _env(phase).compile(source)
    except Exception as exc:
        return _problems(str(exc), phase, source)
    returned = expression.return_type()
    cel = _cel()
    if returned != cel.Type.BOOL and returned != cel.Type.DYN:
        return [CelProblem(1, 1, f"the condition is of type {returned.name().lower()}, not bool")]
    return CelProgram(source, phase, expression, referenced_names(source, phase))


def referenced_names(source: str, phase: str) -> frozenset[str]:
    """The phase variables ``source`` may read (identifiers outside string literals).

    An over-approximation (a comprehension variable named like one is counted) is fine:
    it only decides which inputs are screened and handed over."""
    bare = _STRING_LITERAL.sub(lambda m: " " * len(m.group(0)), source)
    return frozenset(_IDENTIFIER.findall(bare)) & PHASE_VARIABLES[phase].keys()


_SELECTION = re.compile(r"\s*\.\s*([A-Za-z_]\w*)(\s*\()?")


def selected_fields(source: str, variable: str) -> frozenset[str] | None:
    """The fields ``NAME`` of ``variable.NAME`` in ``source`` when every mention of
    ``variable`` (outside string literals) is such a selection, else ``None`` (it is read
    otherwise: indexed, passed whole, sized, iterated). A condition that only selects
    fields reads those and nothing else of the variable: it is given only them."""
    bare = _STRING_LITERAL.sub(lambda m: " " * len(m.group(0)), source)
    fields: set[str] = set()
    for match in re.finditer(rf"(?<![.\w]){re.escape(variable)}(?!\w)", bare):
        selection = _SELECTION.match(bare, match.end())
        if selection is None or selection.group(2) is not None:  # `counters.size()`
            return None
        fields.add(selection.group(1))
    return frozenset(fields)


def argument_fields(source: str) -> list[tuple[str, int, int]]:
    """Each ``args.NAME`` in ``source`` (outside string literals): name, line, column."""
    bare = _STRING_LITERAL.sub(lambda m: " " * len(m.group(0)), source)
    found = []
    for match in _ARG_FIELD.finditer(bare):
        line = bare.count("\n", 0, match.start()) + 1
        column = match.start() - (bare.rfind("\n", 0, match.start()) + 1) + 1
        found.append((match.group(1), line, column))
    return found


def _problems(text: str, phase: str, source: str) -> list[CelProblem]:
    """The engine's message as problems: ``ERROR: <input>:L:C: message`` per mistake."""
    found = []
    for match in _ERROR_LINE.finditer(text):
        line, column, message = int(match.group(1)), int(match.group(2)), match.group(3)
        message = message.removesuffix(" [INVALID_ARGUMENT]").strip()
        if "max recursion depth" in message:
            line, column, message = 0, 0, "the expression is nested too deep for CEL"
        found.append(CelProblem(max(line, 0), max(column, 0), _hint(message, phase, source)))
    if not found:
        if "recursion limit" in text:
            return [CelProblem(0, 0, "the expression is nested too deep for CEL")]
        return [CelProblem(0, 0, _one_line(text))]
    return list(dict.fromkeys(found))  # the engine repeats some errors


def _hint(message: str, phase: str, source: str) -> str:
    """Name the phase variables when a name is unknown: the common mistake is reading
    ``args`` in an ``answer`` rule, or a typo."""
    match = re.match(r"undeclared reference to '([^']*)'", message)
    if not match:
        return message
    name = match.group(1).split(".")[0]  # the checker names `args.x` whole
    elsewhere = [p for p, names in PHASE_VARIABLES.items() if name in names and p != phase]
    known = ", ".join(PHASE_VARIABLES[phase])
    if elsewhere:
        only = ", ".join(elsewhere)
        return f"{name!r} is not available in {phase} rules (only in {only}); they read {known}"
    if re.search(rf"(?<![\w.]){re.escape(name)}\s*\(", source):
        return f"unknown function {name}(); CEL's standard functions and macros only"
    return f"unknown variable {name!r}; {phase} rules read {known}"


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]


def screen(value: Any, where: str) -> Any:  # noqa: C901 - one branch per kind of JSON value
    """``value`` as CEL may take it (tuples become lists), or :class:`Unrepresentable`.

    Iterative, so a hostile nesting depth costs no Python recursion either. A value's
    path is kept as a chain of (parent, key) and spelled out only for the error: building
    it for every element would cost more than the screen itself."""
    kind = type(value)
    if kind is str or kind is float or kind is bool or value is None:  # the common case
        if kind is str:
            _utf8(value, (None, where))
        return value
    root: list[Any] = [None]
    # (value, its depth, the container to store it into, the slot, its path)
    stack: list[tuple[Any, int, Any, Any, _Trail]] = [(value, 0, root, 0, (None, where))]
    while stack:
        item, depth, into, slot, trail = stack.pop()
        if depth > MAX_DEPTH:
            raise Unrepresentable(f"{_spell(trail)}: nested deeper than {MAX_DEPTH} levels")
        if item is None or isinstance(item, bool):
            into[slot] = item
        elif isinstance(item, int):
            if not _INT_MIN <= item <= _INT_MAX:
                raise Unrepresentable(f"{_spell(trail)}: an integer outside CEL's 64-bit range")
            into[slot] = int(item)
        elif isinstance(item, float):
            into[slot] = float(item)  # NaN and infinities are CEL doubles: compared, not refused
        elif isinstance(item, str):
            _utf8(item, trail)
            into[slot] = str(item)
        elif isinstance(item, Mapping):
            copy: dict[str, Any] = {}
            into[slot] = copy
            for key, element in item.items():
                if not isinstance(key, str):
                    raise Unrepresentable(
                        f"{_spell(trail)}: a key that is not a string ({key!r:.40})"
                    )
                _utf8(key, trail, "a key")
                stack.append((element, depth + 1, copy, key, (trail, key)))
        elif isinstance(item, list | tuple):
            elements: list[Any] = [None] * len(item)
            into[slot] = elements
            for index, element in enumerate(item):
                stack.append((element, depth + 1, elements, index, (trail, index)))
        else:
            raise Unrepresentable(f"{_spell(trail)}: a {type(item).__name__}, not a JSON value")
    return root[0]


#: Where a screened value is: (the parent's trail, the key or index), the root's parent
#: being ``None`` and its key the variable's name.
_Trail = tuple[Any, "str | int"]


def _utf8(text: str, trail: _Trail, what: str = "a string") -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise Unrepresentable(f"{_spell(trail)}: {what} with a lone surrogate") from None


def _spell(trail: _Trail) -> str:
    keys: list[str | int] = []
    node: Any = trail
    while node is not None:
        node, key = node
        keys.append(key)
    keys.reverse()
    return str(keys[0]) + "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in keys[1:])
