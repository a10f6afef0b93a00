"""CEL conditions of a strict subset, evaluated in Python where that is sure to agree.

Crossing into the C++ engine (an activation, the evaluation, reading the result back)
costs several times what a typical condition does itself: ``args.order_id == 'A1'`` on
a screened dict is a dict lookup and a string compare. So each checked condition is also
translated here into one Python function, from the engine's *own* checked AST
(``cel.expr.CheckedExpr``, cel-spec's protobuf, which ``Expression.serialize()`` gives):
there is no second parser, and macros arrive expanded into comprehensions, whose
general semantics are translated once. The function is generated as straight-line code
(as attrs and dataclasses generate ``__init__``), because a closure per AST node costs
about as much as the crossing it replaces. No text of the condition reaches the
generated source: constants, field and variable names are handed to it as values
(``_k0``, ``_k1``, ...), the source holds only names made here.

The functions answer only where their reading cannot differ from the engine's, and say
"not sure" otherwise (:class:`Unsure`), upon which the caller asks the engine, which stays
the checker and the authority:

* equality, ordering and ``in`` on two values of one scalar kind (string, bool, 64-bit
  int, double; null for equality with null): CEL's heterogeneous numeric comparisons
  (``1 == 1.0`` is true) and its unsigned integers (past 2**63) are the engine's;
* field selection, ``has()``, indexing, ``size``, ``startsWith``/``endsWith``/
  ``contains``, ``type()`` against a type name, ``&&``/``||``/``!``/``?:`` with CEL's
  error absorption, ``+``/``-``/``*`` on ints (within 64 bits) and doubles, string and
  list concatenation, list literals, and comprehensions over lists (``exists``, ``all``,
  ``exists_one``, ``filter``, ``map``);
* a missing key or an index out of range is a CEL error: absorbed where CEL absorbs it
  (``false && error`` is false), and where it is the result the caller asks the engine,
  for its message.

Anything else (another function, a map literal, bytes, uint or duration literals, a
comprehension over a map, two iteration variables) leaves the condition to the engine
whole. ``tests/test_rules_celfast.py`` holds the two readings against each other on
generated conditions and inputs.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Unsure", "compile_checked", "compile_many"]

#: How deep an AST is translated (the generated code nests a block per level).
_MAX_DEPTH = 60

_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1
#: The kinds Python's operators compare as CEL does, within one kind.
_SCALARS = (str, int, float, bool)


class Unsure(Exception):
    """This reading may differ from the engine's: the caller evaluates with the engine."""


_MISSING = object()


class _Kind:
    """A CEL type as a value (``type(x)``, or a type name such as ``map``)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<CEL type {self.name}>"


#: The type names a condition may compare ``type(x)`` with; one value each.
_KINDS = {name: _Kind(name) for name in ("map", "list", "string", "int", "double", "bool",
                                         "null_type")}  # fmt: skip


class _NotCompiled(Exception):
    """The condition leaves the subset: the engine evaluates it."""


Fast = Callable[[dict[str, Any]], "bool | None"]
FastMany = Callable[[dict[str, Any]], "list[bool] | None"]


def compile_checked(
    serialized: bytes, variables: frozenset[str], maps: frozenset[str] = frozenset()
) -> Fast | None:
    """``serialized`` (``Expression.serialize()``) as ``env -> True | False | None``, or
    ``None`` when the condition is outside the subset. ``None`` from the function means
    "ask the engine": an error, a value of another kind, a case the subset leaves out.
    ``env`` maps the names in ``variables`` to screened values; those in ``maps`` are
    declared maps (a value of another kind: the engine is asked)."""
    many = compile_many([serialized], variables, maps)
    if many is None:
        return None

    def evaluate(env: dict[str, Any]) -> bool | None:
        results = many(env)
        return None if results is None else results[0]

    return evaluate


def compile_many(
    serialized: Sequence[bytes],
    variables: frozenset[str],
    maps: frozenset[str] = frozenset(),
    otherwise: Callable[[Any], Any] | None = None,
) -> FastMany | None:
    """Several conditions as one function ``env -> [each one's bool] | None`` (``None``
    where any one needs the engine), or ``None`` when one is outside the subset.

    ``otherwise``: the function takes one value, the value of every variable (not an
    env), and gives ``otherwise(value)`` where it would give ``None``."""
    try:
        trees = [_fold(_tree(_message(_any_value(s)))) for s in serialized]
        # A first pass finds the fields read outside any guard; the second reads those
        # once, up front (what raises there made the whole function ask the engine).
        probe = _Generator(variables, maps)
        probe.statements(trees)
        generator = _Generator(variables, maps, frozenset(probe.unguarded))
        if otherwise is not None:
            generator.whole, generator.fail = True, "_otherwise(_env)"
            generator.values["_otherwise"] = otherwise
        return generator.function(trees)
    except (_NotCompiled, IndexError, KeyError, ValueError, struct.error, UnicodeDecodeError):
        return None
    except RecursionError:
        return None


# ── the protobuf wire format, as much of it as CheckedExpr needs ──────────────────────


def _varint(buf: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _message(buf: bytes) -> dict[int, list[Any]]:
    """Field number -> its values in order (varints as ints, the rest as bytes)."""
    fields: dict[int, list[Any]] = {}
    at = 0
    while at < len(buf):
        key, at = _varint(buf, at)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, at = _varint(buf, at)
        elif wire == 1:
            value, at = buf[at : at + 8], at + 8
        elif wire == 2:
            size, at = _varint(buf, at)
            value, at = buf[at : at + size], at + size
        elif wire == 5:
            value, at = buf[at : at + 4], at + 4
        else:
            raise ValueError(f"wire type {wire}")
        if at > len(buf):
            raise ValueError("truncated")
        fields.setdefault(number, []).append(value)
    return fields


def _any_value(serialized: bytes) -> bytes:
    wrapped = _message(serialized)
    url = wrapped.get(1, [b""])[-1]
    if not url.endswith((b"/cel.expr.CheckedExpr", b"/google.api.expr.v1alpha1.CheckedExpr")):
        raise _NotCompiled("not a CheckedExpr")
    value: bytes = _message(wrapped[2][-1])[4][-1]  # CheckedExpr.expr
    return value


def _text(raw: bytes) -> str:
    return raw.decode("utf-8")


# ── the AST as tuples ─────────────────────────────────────────────────────────────────
#
# Expr: 3 const, 4 ident, 5 select, 6 call, 7 list, 8 struct, 9 comprehension; the tree:
# ("const", value) ("ident", name) ("select", operand, field, test_only)
# ("call", function, target | None, args) ("list", elements)
# ("comp", iter_var, range, accu_var, init, condition, step, result)

Tree = tuple[Any, ...]


def _tree(expr: dict[int, list[Any]], depth: int = 0) -> Tree:
    if depth > _MAX_DEPTH:
        raise _NotCompiled("too deep")
    if 3 in expr:
        return ("const", _constant(_message(expr[3][-1])))
    if 4 in expr:
        return ("ident", _text(_message(expr[4][-1]).get(1, [b""])[-1]))
    if 5 in expr:
        select = _message(expr[5][-1])
        operand = _tree(_message(select[1][-1]), depth + 1)
        return ("select", operand, _text(select.get(2, [b""])[-1]), bool(select.get(3, [0])[-1]))
    if 6 in expr:
        call = _message(expr[6][-1])
        target = _tree(_message(call[1][-1]), depth + 1) if 1 in call else None
        args = tuple(_tree(_message(a), depth + 1) for a in call.get(3, []))
        return ("call", _text(call.get(2, [b""])[-1]), target, args)
    if 7 in expr:
        listed = _message(expr[7][-1])
        if 2 in listed:
            raise _NotCompiled("optional list elements")
        return ("list", tuple(_tree(_message(e), depth + 1) for e in listed.get(1, [])))
    if 9 in expr:
        comp = _message(expr[9][-1])
        if 8 in comp:
            raise _NotCompiled("two iteration variables")
        parts = [_tree(_message(comp[n][-1]), depth + 1) for n in (2, 4, 5, 6, 7)]
        return ("comp", _text(comp[1][-1]), parts[0], _text(comp[3][-1]), *parts[1:])
    raise _NotCompiled("a kind of expression outside the subset")


def _constant(constant: dict[int, list[Any]]) -> Any:
    if 1 in constant:
        return None
    if 2 in constant:
        return bool(constant[2][-1])
    if 3 in constant:
        raw = constant[3][-1]
        return raw - 2**64 if raw >= 2**63 else raw
    if 5 in constant:
        return struct.unpack("<d", constant[5][-1])[0]
    if 6 in constant:
        return _text(constant[6][-1])
    raise _NotCompiled("a constant outside the subset")  # uint, bytes, duration...


def _fold(tree: Tree) -> Tree:
    """``tree`` with every strict call on constants computed (``80 + 2`` is ``82``), where
    that gives a value (an error on constants is left to run time, and to the engine)."""
    kind = tree[0]
    if kind == "select":
        return ("select", _fold(tree[1]), tree[2], tree[3])
    if kind == "list":
        return ("list", tuple(_fold(e) for e in tree[1]))
    if kind == "comp":
        return (*tree[:2], _fold(tree[2]), tree[3], *(_fold(t) for t in tree[4:]))
    if kind != "call":
        return tree
    _, function, target, args = tree
    target = _fold(target) if target is not None else None
    args = tuple(_fold(a) for a in args)
    helper = _STRICT.get((function, len(args))) if target is None else None
    if function in _COMPARISONS and target is None and len(args) == 2:
        helper = _COMPARE_HELPERS[_COMPARISONS[function]]
    if helper is not None and all(a[0] == "const" for a in args):
        try:
            return ("const", _HELPERS[helper](*(a[1] for a in args)))
        except Exception:  # an error on constants: the engine's, at run time
            pass
    return ("call", function, target, args)


#: Calls whose translation gives a bool or raises (no check of the result needed).
_BOOLEAN = {"_&&_", "_||_", "!_", "@in", "startsWith", "endsWith", "contains",
            "@not_strictly_false", "__not_strictly_false__", *("_==_", "_!=_", "_<_", "_<=_",
            "_>_", "_>=_")}  # fmt: skip


def _gives_bool(tree: Tree) -> bool:
    if tree[0] == "select":
        return bool(tree[3])  # has()
    if tree[0] == "const":
        return type(tree[1]) is bool
    return tree[0] == "call" and tree[1] in _BOOLEAN


# ── code generation ───────────────────────────────────────────────────────────────────
#
# A CEL error and a case outside the subset are both an exception here, never a value:
# the common path carries no error checks. Only ``&&``, ``||`` and a comprehension's
# loop condition catch one, and they turn it into a definite value only where CEL's
# answer does not depend on what the failed side would have been (``X && false`` is
# false whatever ``X`` is: a value, an error); everywhere else it propagates, and a
# condition that ends in one is "ask the engine".

#: Comparison operators and their Python spelling.
_COMPARISONS = {"_==_": "==", "_!=_": "!=", "_<_": "<", "_<=_": "<=", "_>_": ">", "_>=_": ">="}
_COMPARE_HELPERS = {"==": "_equals", "!=": "_not_equals", "<": "_less", "<=": "_less_equal",
                    ">": "_greater", ">=": "_greater_equal"}  # fmt: skip
_STRING_TESTS = {"startsWith": "_starts_with", "endsWith": "_ends_with", "contains": "_contains"}


class _Generator:
    """Statements and expressions for each node. A node's translation is a Python
    expression; nodes that need statements (``&&``, ``?:``, a comprehension) emit them
    first, at the current indent, and give the local holding their value."""

    def __init__(
        self,
        variables: frozenset[str],
        maps: frozenset[str],
        hoist: frozenset[tuple[str, str]] = frozenset(),
    ) -> None:
        self.variables = variables
        self.maps = maps  # the variables declared as maps (type-checked once, at load)
        self.lines: list[str] = []
        self.values: dict[str, Any] = {}  # _kN -> a constant, field or variable name
        self.loaded: dict[str, str] = {}  # variable name -> the local holding it
        self.count = 0
        #: How many guards (a ``try``, a branch, a loop) enclose what is being generated.
        self.guard = 0
        #: The fields of map variables read outside any guard: (the map's local, field).
        self.unguarded: set[tuple[str, str]] = set()
        #: Those read once, up front: (local, field) -> the local holding the value; and
        #: that local -> the local holding its type.
        self.hoist = hoist
        self.fields: dict[tuple[str, str], str] = {}
        self.types: dict[str, str] = {}
        #: The argument is every variable's value (not an env); what is returned where
        #: the engine must be asked.
        self.whole = False
        self.fail = "None"

    def statements(self, trees: list[Tree]) -> tuple[list[str], list[str]]:
        """Each condition's statements, and the local holding its result."""
        body: list[str] = []
        results = []
        for tree in trees:
            self.lines = []
            result = self.local()
            self.emit(2, f"{result} = {self.node(tree, {}, 2)}")
            if not _gives_bool(tree):
                self.emit(
                    2, f"if {result} is not True and {result} is not False: return {self.fail}"
                )
            body += self.lines
            results.append(result)
        return body, results

    def function(self, trees: list[Tree]) -> FastMany:
        body, results = self.statements(trees)
        loads = []
        for name, local in self.loaded.items():
            loads.append(
                f"        {local} = {'_env' if self.whole else f'_env[{self.value(name)}]'}"
            )
            if name in self.maps:
                loads.append(f"        if type({local}) is not dict: return {self.fail}")
        for (mapped, field), local in self.fields.items():
            loads.append(f"        {local} = {mapped}[{self.value(field)}]")
            loads.append(f"        {self.types[local]} = type({local})")
        # Any exception (a CEL error, Unsure, a case not foreseen) is "ask the engine".
        source = "\n".join([
            "def _conditions(_env):", "    try:", *loads, *body,
            f"        return [{', '.join(results)}]",
            "    except Exception:", f"        return {self.fail}",
        ]) + "\n"  # fmt: skip
        namespace = dict(_HELPERS)
        namespace.update(self.values)
        exec(compile(source, "<fsm_agent._rules.celfast>", "exec"), namespace)
        generated: FastMany = namespace["_conditions"]
        return generated

    # -- helpers of the generator ------------------------------------------------------

    def local(self) -> str:
        self.count += 1
        return f"_t{self.count}"

    def read(self, mapped: str, field: str) -> str:
        """A field of a map variable (loaded and tested a dict): read up front where it
        is read outside any guard somewhere (then once for all its reads)."""
        if (mapped, field) in self.hoist:
            local = self.fields.get((mapped, field))
            if local is None:
                local = self.fields[(mapped, field)] = f"_f{len(self.fields)}"
                self.types[local] = f"{local}_type"
            return local
        if not self.guard:
            self.unguarded.add((mapped, field))
        return f"{mapped}[{self.value(field)}]"

    def typed(self, value: str, t: str) -> tuple[str, str]:
        """``(the value, its type)`` as expressions: a field read up front has both in
        locals; anything else is held in ``t`` as its type is taken."""
        if value in self.types:
            return value, self.types[value]
        return t, f"type({t} := {value})"

    def value(self, value: Any) -> str:
        """A name for ``value`` in the generated function's globals."""
        name = f"_k{len(self.values)}"
        self.values[name] = value
        return name

    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)

    # -- nodes -------------------------------------------------------------------------

    def node(self, tree: Tree, scope: dict[str, str], indent: int) -> str:
        kind = tree[0]
        if kind == "const":
            return self.value(tree[1])
        if kind == "ident":
            return self.ident(tree[1], scope)
        if kind == "select":
            _, operand, field, test_only = tree
            mapped = self.map_variable(operand, scope)  # a dict: checked when loaded
            if mapped is not None:
                return (
                    f"({self.value(field)} in {mapped})" if test_only else self.read(mapped, field)
                )
            key = self.value(field)
            of, kind = self.typed(self.node(operand, scope, indent), self.local())
            used = f"{key} in {of}" if test_only else f"{of}[{key}]"
            return f"({used} if {kind} is dict else _unsure())"
        if kind == "call":
            return self.call(tree, scope, indent)
        if kind == "list":
            return "[" + ", ".join(self.node(e, scope, indent) for e in tree[1]) + "]"
        return self.comprehension(tree, scope, indent)

    def ident(self, name: str, scope: dict[str, str]) -> str:
        if name in scope:
            return scope[name]
        if name in self.variables:
            if name not in self.loaded:
                self.loaded[name] = f"_v{len(self.loaded)}"
            return self.loaded[name]
        if name in _KINDS:
            return self.value(_KINDS[name])
        raise _NotCompiled(f"the name {name}")

    def call(self, tree: Tree, scope: dict[str, str], indent: int) -> str:
        _, function, target, args = tree
        if target is None and function in ("_&&_", "_||_") and len(args) == 2:
            return self.logical(function == "_&&_", args, scope, indent)
        if target is None and function == "_?_:_" and len(args) == 3:
            return self.conditional(args, scope, indent)
        if target is None and function in ("@not_strictly_false", "__not_strictly_false__"):
            return self.not_strictly_false(args[0], scope, indent)
        if target is not None:
            if function == "size" and not args:
                return self.strict("_size", [target], scope, indent)
            if function in _STRING_TESTS and len(args) == 1:
                return self.strict(_STRING_TESTS[function], [target, args[0]], scope, indent)
            raise _NotCompiled(f"the method {function}")
        if function in _COMPARISONS and len(args) == 2:
            return self.comparison(_COMPARISONS[function], args, scope, indent)
        if function == "!_" and len(args) == 1:
            of, kind = self.typed(self.node(args[0], scope, indent), self.local())
            return f"(not {of} if {kind} is bool else _unsure())"
        helper = _STRICT.get((function, len(args)))
        if helper is None:
            raise _NotCompiled(f"the function {function}")
        return self.strict(helper, list(args), scope, indent)

    def strict(self, helper: str, args: list[Tree], scope: dict[str, str], indent: int) -> str:
        """A strict function (an error when an argument is one: here, it propagates),
        by a helper that raises :class:`Unsure` outside the subset; folded when every
        argument is a constant."""
        inline = self.inline(helper, args, scope, indent)
        if inline is not None:
            return inline
        values = [self.node(a, scope, indent) for a in args]
        return f"{helper}({', '.join(values)})"

    def map_variable(self, tree: Tree, scope: dict[str, str]) -> str | None:
        """The local of a variable declared as a map (a dict once loaded), if ``tree`` is one."""
        if tree[0] == "ident" and tree[1] not in scope and tree[1] in self.maps:
            return self.ident(tree[1], scope)
        return None

    def inline(
        self, helper: str, args: list[Tree], scope: dict[str, str], indent: int
    ) -> str | None:
        """The common helpers spelled out where their kinds are known or tested inline."""
        t = self.local()
        if helper == "_size":
            of, taken = self.typed(self.node(args[0], scope, indent), t)
            kind = self.local()
            return (f"(len({of}) if ({kind} := {taken}) is str or {kind} is list "
                    f"or {kind} is dict else _unsure())")  # fmt: skip
        constant = args[1][1] if len(args) == 2 and args[1][0] == "const" else _MISSING
        if helper in ("_starts_with", "_ends_with", "_contains") and type(constant) is str:
            part = self.value(constant)
            of, kind = self.typed(self.node(args[0], scope, indent), t)
            used = {"_starts_with": f"{of}.startswith({part})",
                    "_ends_with": f"{of}.endswith({part})",
                    "_contains": f"{part} in {of}"}[helper]  # fmt: skip
            return f"({used} if {kind} is str else _unsure())"
        if helper in ("_in", "_index"):
            mapped = self.map_variable(args[1] if helper == "_in" else args[0], scope)
            key = args[0] if helper == "_in" else args[1]
            if mapped is not None and key[0] == "const" and type(key[1]) is str:
                if helper == "_in":
                    return f"({self.value(key[1])} in {mapped})"
                return self.read(mapped, key[1])
        return None

    def comparison(self, op: str, args: Tree, scope: dict[str, str], indent: int) -> str:
        left, right = args
        constant: Any = next((a[1] for a in (right, left) if a[0] == "const"), _MISSING)
        kind = type(constant)
        both = left[0] == "const" and right[0] == "const"
        if both or kind not in _SCALARS or (kind is int and not _INT_MIN <= constant <= _INT_MAX):
            return self.strict(_COMPARE_HELPERS[op], [left, right], scope, indent)
        # One side a scalar constant: a type test and Python's operator, inline.
        of, taken = self.typed(self.node(right if left[0] == "const" else left, scope, indent),
                               self.local())  # fmt: skip
        test = f"{taken} is {kind.__name__}"
        a, b = (self.value(constant), of) if left[0] == "const" else (of, self.value(constant))
        if kind is int:
            test += f" and {_INT_MIN} <= {of} <= {_INT_MAX}"
        return f"({a} {op} {b} if {test} else _unsure())"

    def guarded(self, tree: Tree, scope: dict[str, str], indent: int, failed: str) -> str:
        """``tree``'s value in a local, or ``failed`` where it raises (an error)."""
        out = self.local()
        self.emit(indent, "try:")
        self.guard += 1
        self.emit(indent + 1, f"{out} = {self.node(tree, scope, indent + 1)}")
        self.guard -= 1
        self.emit(indent, f"except Exception: {out} = {failed}")
        return out

    def logical(self, conjunction: bool, args: Tree, scope: dict[str, str], indent: int) -> str:
        """``&&`` (``||`` mirrored): false if either side is, whatever the other is (an
        error included); true if both are true; otherwise an error (raised)."""
        decides, other = ("False", "True") if conjunction else ("True", "False")
        out = self.local()
        a = self.guarded(args[0], scope, indent, "_FAILED")
        self.emit(indent, f"if {a} is {decides}: {out} = {decides}")
        self.emit(indent, "else:")
        b = self.guarded(args[1], scope, indent + 1, "_FAILED")
        self.emit(indent + 1, f"if {b} is {decides}: {out} = {decides}")
        self.emit(indent + 1, f"elif {a} is {other} and {b} is {other}: {out} = {other}")
        self.emit(indent + 1, "else: raise _Unsure")
        return out

    def not_strictly_false(self, tree: Tree, scope: dict[str, str], indent: int) -> str:
        """A comprehension's loop condition: true for true and for an error."""
        out = self.guarded(tree, scope, indent, "True")
        self.emit(indent, f"if {out} is not True and {out} is not False: raise _Unsure")
        return out

    def conditional(self, args: Tree, scope: dict[str, str], indent: int) -> str:
        test, out = self.node(args[0], scope, indent), self.local()
        chosen = self.local()
        self.emit(indent, f"{chosen} = {test}")
        self.guard += 1  # (a branch: not always taken)
        self.emit(indent, f"if {chosen} is True:")
        self.emit(indent + 1, f"{out} = {self.node(args[1], scope, indent + 1)}")
        self.emit(indent, f"elif {chosen} is False:")
        self.emit(indent + 1, f"{out} = {self.node(args[2], scope, indent + 1)}")
        self.guard -= 1
        self.emit(indent, "else: raise _Unsure")
        return out

    def comprehension(self, tree: Tree, scope: dict[str, str], indent: int) -> str:
        _, iter_var, iter_range, accu_var, init, condition, step, result = tree
        elements, element, accu, out = self.local(), self.local(), self.local(), self.local()
        self.emit(indent, f"{elements} = {self.node(iter_range, scope, indent)}")
        self.emit(indent, f"if type({elements}) is not list: raise _Unsure")
        self.emit(indent, f"{accu} = {self.node(init, scope, indent)}")
        self.emit(indent, f"for {element} in {elements}:")
        inner = {**scope, iter_var: element, accu_var: accu}
        go_on = self.local()
        self.guard += 1  # (a loop's body: not run for no element)
        self.emit(indent + 1, f"{go_on} = {self.node(condition, inner, indent + 1)}")
        self.emit(indent + 1, f"if {go_on} is False: break")
        self.emit(indent + 1, f"if {go_on} is not True: raise _Unsure")
        self.emit(indent + 1, f"{accu} = {self.node(step, inner, indent + 1)}")
        self.guard -= 1
        self.emit(indent, f"{out} = {self.node(result, {**scope, accu_var: accu}, indent)}")
        return out


# ── what the generated code calls ─────────────────────────────────────────────────────


class _Failed:
    """What a side of ``&&``/``||`` that raised is (neither true nor false)."""

    __slots__ = ()


def _unsure() -> Any:
    raise Unsure("a value of another kind")


def _same_kind(a: Any, b: Any) -> None:
    """Raise :class:`Unsure` unless ``a`` and ``b`` are of one scalar kind (ints within
    64 signed bits: past that, CEL reads a uint)."""
    kind = type(a)
    if kind is not type(b) or kind not in _SCALARS:
        raise Unsure("operands of two kinds")
    if kind is int and not (_INT_MIN <= a <= _INT_MAX and _INT_MIN <= b <= _INT_MAX):
        raise Unsure("an integer past 64 signed bits (a CEL uint)")


def _equals(a: Any, b: Any) -> bool:
    if a is None and b is None:
        return True
    if type(a) is _Kind and type(b) is _Kind:
        return a is b
    _same_kind(a, b)
    return bool(a == b)


def _not_equals(a: Any, b: Any) -> bool:
    return not _equals(a, b)


def _less(a: Any, b: Any) -> bool:
    _same_kind(a, b)
    return bool(a < b)


def _less_equal(a: Any, b: Any) -> bool:
    _same_kind(a, b)
    return bool(a <= b)


def _greater(a: Any, b: Any) -> bool:
    _same_kind(a, b)
    return bool(a > b)


def _greater_equal(a: Any, b: Any) -> bool:
    _same_kind(a, b)
    return bool(a >= b)


def _in(a: Any, b: Any) -> bool:
    if type(b) is dict:
        if type(a) is not str:
            raise Unsure("a map key that is not a string")
        return a in b
    if type(b) is not list:
        raise Unsure("in on a value that is neither a list nor a map")
    return any([_equals(a, element) for element in b])  # each compared (NaN is in no list)


def _index(a: Any, b: Any) -> Any:
    if type(a) is dict and type(b) is str:
        return a[b]  # a missing key raises: a CEL error
    if type(a) is list and type(b) is int and 0 <= b < len(a):
        return a[b]
    raise Unsure("an index of another kind, or out of range (a CEL error)")


def _size(a: Any) -> int:
    kind = type(a)
    if kind is str or kind is list or kind is dict:
        return len(a)  # a string's size is its code points, as len() counts them
    raise Unsure("size() of another kind")


def _type(a: Any) -> _Kind:
    kind = type(a)
    if kind is int and not _INT_MIN <= a <= _INT_MAX:
        raise Unsure("an integer past 64 signed bits (a CEL uint)")
    name = _TYPE_NAMES.get(kind)
    if name is None:
        raise Unsure("a value of another kind")
    return _KINDS[name]


_TYPE_NAMES = {dict: "map", list: "list", str: "string", int: "int", float: "double",
               bool: "bool", type(None): "null_type"}  # fmt: skip


def _checked_int(value: int) -> int:
    if not _INT_MIN <= value <= _INT_MAX:
        raise Unsure("an integer overflow (a CEL error)")
    return value


def _add(a: Any, b: Any) -> Any:
    kind = type(a)
    if kind is not type(b):
        raise Unsure("+ on two kinds")
    if kind is int:
        _same_kind(a, b)
        return _checked_int(a + b)
    if kind is float or kind is str or kind is list:
        return a + b
    raise Unsure("+ on another kind")


def _arithmetic(a: Any, b: Any) -> type:
    _same_kind(a, b)
    kind = type(a)
    if kind is not int and kind is not float:
        raise Unsure("arithmetic on another kind")
    return kind


def _subtract(a: Any, b: Any) -> Any:
    return _checked_int(a - b) if _arithmetic(a, b) is int else a - b


def _multiply(a: Any, b: Any) -> Any:
    return _checked_int(a * b) if _arithmetic(a, b) is int else a * b


def _strings(a: Any, b: Any) -> None:
    if type(a) is not str or type(b) is not str:
        raise Unsure("a string function on another kind")


def _starts_with(a: Any, b: Any) -> bool:
    _strings(a, b)
    return bool(a.startswith(b))


def _ends_with(a: Any, b: Any) -> bool:
    _strings(a, b)
    return bool(a.endswith(b))


def _contains(a: Any, b: Any) -> bool:
    _strings(a, b)
    return b in a


def _negate(a: Any) -> Any:
    kind = type(a)
    if kind is int:
        return _checked_int(-_checked_int(a))
    if kind is float:
        return -a
    raise Unsure("- on another kind")


_STRICT: dict[tuple[str, int], str] = {
    ("@in", 2): "_in",
    ("_[_]", 2): "_index",
    ("_+_", 2): "_add",
    ("_-_", 2): "_subtract",
    ("_*_", 2): "_multiply",
    ("-_", 1): "_negate",
    ("size", 1): "_size",
    ("type", 1): "_type",
}
_HELPERS: dict[str, Any] = {
    "_FAILED": _Failed(),
    "_Unsure": Unsure,
    **{name: globals()[name] for name in (
        "_unsure", "_equals", "_not_equals", "_less", "_less_equal", "_greater",
        "_greater_equal", "_in", "_index", "_add", "_subtract", "_multiply", "_negate",
        "_size", "_type", "_starts_with", "_ends_with", "_contains",
    )},
}  # fmt: skip
