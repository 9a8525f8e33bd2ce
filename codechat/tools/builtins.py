"""Opt-in built-in tools: ``python`` (runs code in the sandbox) and ``calculator`` (safe arithmetic).

``builtin_tools(["python", "calculator"])`` returns ``{name: Tool}`` ready for a
:class:`~.dispatch.Dispatcher`; nothing is enabled unless it is named. Both executors are
module-level functions (the ``python`` one behind a ``functools.partial`` holding its limits), so
the dispatcher's worker process imports them by name.

- ``python``: the code runs in :mod:`codechat.eval.sandbox` (a forked child with a wall-clock
  timeout, ``RLIMIT_AS``, no network, a read-only filesystem where namespaces exist), and the tool
  returns ``{"status", "stdout", "stderr", "error"}``: ``status`` is ``"ok"`` when the code ran to
  its end, else the sandbox's ``"error"``, ``"syntax"``, ``"timeout"`` or ``"memory"``, with
  ``error`` the exception as ``Type: message``; stdout/stderr are the sandbox's tails
  (``Limits.output_tail_chars``). A program that fails is still a successful call: the model reads
  what went wrong.
- ``calculator``: :func:`calculate` parses the expression and walks its syntax tree against a
  whitelist — numbers, ``+ - * / // % **``, unary ``+ -``, parentheses, the functions in
  :data:`FUNCTIONS` and the constants in :data:`CONSTANTS`, called by plain name. Names,
  attributes, strings, imports, subscripts, comparisons, lambdas, ``or``/``and``: rejected before
  anything is evaluated. Integers are bounded to :data:`MAX_INT_BITS` bits *before* a power or a
  product is computed (``9**9**9`` is refused in microseconds, never attempted); floats must stay
  finite.

Their schemas are short on purpose: with the ``tiny`` preset's context of 512 tokens both take 259
tokens of the system turn (the speedrun's 4096-id tokenizer; 403 with the longer descriptions they
had), leaving room for a question, a call and its response. Limits the schema does not state are
checked by the tools themselves (an over-long expression is a :class:`CalculatorError` the model reads).
"""
from __future__ import annotations

import ast
import functools
import math
import operator
from collections.abc import Callable, Iterable
from typing import Any

from .schema import Tool, ToolError

__all__ = ["BUILTIN_NAMES", "CONSTANTS", "FUNCTIONS", "MAX_DEPTH", "MAX_EXPRESSION_CHARS", "MAX_INT_BITS",
           "MAX_ROUND_DIGITS", "builtin_tools", "calculate", "run_python"]

MAX_EXPRESSION_CHARS = 1000  # longest expression the calculator accepts
MAX_INT_BITS = 4096  # largest integer result (about 1233 decimal digits)
MAX_DEPTH = 100  # deepest syntax tree (nested operators / parentheses)
MAX_ROUND_DIGITS = 100  # |ndigits| of round(): round(5, -10**8) would build 10**(10**8)

PYTHON_TIMEOUT_S = 5.0  # the python tool's wall clock per run (keep it below the dispatcher's timeout_s)
PYTHON_MEMORY_MB = 512  # the python tool's address-space limit per process


class CalculatorError(ValueError):
    """An expression the calculator refuses or cannot evaluate; the message says why."""


def _round(x: int | float, ndigits: int | None = None) -> int | float:
    if ndigits is not None:
        if not isinstance(ndigits, int) or isinstance(ndigits, bool):
            raise CalculatorError("round()'s second argument must be an integer")
        if abs(ndigits) > MAX_ROUND_DIGITS:
            raise CalculatorError(f"round()'s second argument must be within +-{MAX_ROUND_DIGITS}")
        return round(x, ndigits)
    return round(x)


#: name -> (function, fewest arguments, most arguments)
FUNCTIONS: dict[str, tuple[Callable[..., Any], int, int]] = {
    "abs": (abs, 1, 1), "round": (_round, 1, 2), "min": (min, 2, 16), "max": (max, 2, 16),
    "sqrt": (math.sqrt, 1, 1), "exp": (math.exp, 1, 1), "log": (math.log, 1, 2), "log2": (math.log2, 1, 1),
    "log10": (math.log10, 1, 1), "sin": (math.sin, 1, 1), "cos": (math.cos, 1, 1), "tan": (math.tan, 1, 1),
    "asin": (math.asin, 1, 1), "acos": (math.acos, 1, 1), "atan": (math.atan, 1, 1),
    "floor": (math.floor, 1, 1), "ceil": (math.ceil, 1, 1),
}
CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e, "tau": math.tau}

_BINARY: dict[type, tuple[str, Callable[[Any, Any], Any]]] = {
    ast.Add: ("+", operator.add), ast.Sub: ("-", operator.sub), ast.Mult: ("*", operator.mul),
    ast.Div: ("/", operator.truediv), ast.FloorDiv: ("//", operator.floordiv), ast.Mod: ("%", operator.mod),
    ast.Pow: ("**", operator.pow),
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_ALLOWED = ("numbers, + - * / // % **, unary + -, parentheses, the functions "
            + ", ".join(FUNCTIONS) + " and the constants " + ", ".join(CONSTANTS))


def _refuse(what: str) -> CalculatorError:
    return CalculatorError(f"{what} is not allowed; only {_ALLOWED}")


def _check(node: ast.AST, depth: int = 0) -> None:
    """Raise for the first node outside the whitelist (nothing is evaluated yet)."""
    if depth > MAX_DEPTH:
        raise CalculatorError(f"the expression is nested more than {MAX_DEPTH} levels deep")
    if isinstance(node, ast.Expression):
        return _check(node.body, depth + 1)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise _refuse(f"the literal {node.value!r:.40}")
        return None
    if isinstance(node, ast.BinOp):
        if type(node.op) not in _BINARY:
            raise _refuse(f"the operator {type(node.op).__name__}")
        _check(node.left, depth + 1)
        return _check(node.right, depth + 1)
    if isinstance(node, ast.UnaryOp):
        if type(node.op) not in _UNARY:
            raise _refuse(f"the operator {type(node.op).__name__}")
        return _check(node.operand, depth + 1)
    if isinstance(node, ast.Name):
        if node.id not in CONSTANTS:
            raise _refuse(f"the name {node.id!r:.40}")
        return None
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name):
            _check(node.func, depth + 1)  # raises: an attribute, a call of a call, ...
            raise _refuse("calling the result of an expression")
        if node.func.id not in FUNCTIONS:
            raise _refuse(f"calling {node.func.id!r:.40}")
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            raise _refuse("keyword or * arguments")
        _, lo, hi = FUNCTIONS[node.func.id]
        if not lo <= len(node.args) <= hi:
            raise CalculatorError(f"{node.func.id}() takes {lo}" + (f" to {hi}" if hi > lo else "")
                                  + f" arguments, got {len(node.args)}")
        for arg in node.args:
            _check(arg, depth + 1)
        return None
    if isinstance(node, ast.Attribute):
        raise _refuse(f"attribute access (.{node.attr:.40})")
    raise _refuse(_SYNTAX_NAMES.get(type(node), f"{type(node).__name__} syntax"))


_SYNTAX_NAMES: dict[type, str] = {
    ast.BoolOp: "'and' / 'or'", ast.Compare: "a comparison", ast.Subscript: "indexing", ast.Lambda: "lambda",
    ast.IfExp: "'if ... else'", ast.NamedExpr: "':='", ast.JoinedStr: "an f-string", ast.List: "a list",
    ast.Tuple: "a tuple", ast.Dict: "a dict", ast.Set: "a set", ast.ListComp: "a comprehension",
    ast.GeneratorExp: "a generator", ast.Starred: "'*'",
}


def _bounded(value: Any) -> int | float:
    """``value`` if it is a finite real number within :data:`MAX_INT_BITS`; else raise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CalculatorError(f"the result is not a real number ({type(value).__name__})")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise CalculatorError(f"an intermediate result has {value.bit_length()} bits; the limit is {MAX_INT_BITS}")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("the result is not finite (overflow or undefined)")
    return value


def _power(base: int | float, exponent: int | float) -> int | float:
    """``base ** exponent``, refused when an integer result would exceed :data:`MAX_INT_BITS`."""
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        bits = exponent * math.log2(abs(base))
        if bits > MAX_INT_BITS:
            raise CalculatorError(f"the power would have about {bits:.3g} bits; the limit is {MAX_INT_BITS}")
    return base ** exponent


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return CONSTANTS[node.id]
    if isinstance(node, ast.UnaryOp):
        return _bounded(_UNARY[type(node.op)](_evaluate(node.operand)))
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left), _evaluate(node.right)
        symbol, op = _BINARY[type(node.op)]
        if symbol == "**":
            return _bounded(_power(left, right))
        if symbol == "*" and isinstance(left, int) and isinstance(right, int) \
                and left.bit_length() + right.bit_length() > MAX_INT_BITS + 1:
            raise CalculatorError(f"the product would exceed {MAX_INT_BITS} bits")
        return _bounded(op(left, right))
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)  # _check allowed nothing else
    fn = FUNCTIONS[node.func.id][0]
    return _bounded(fn(*(_evaluate(a) for a in node.args)))


def calculate(expression: str) -> int | float:
    """The value of an arithmetic expression, evaluated without ``eval``.

    Args:
        expression: at most :data:`MAX_EXPRESSION_CHARS` characters, e.g. ``"(17*23) + 4"`` or
            ``"sqrt(2) * pi"``.

    Returns:
        An int (exact, at most :data:`MAX_INT_BITS` bits) or a finite float.

    Raises:
        CalculatorError: not an expression, anything outside the whitelist (names, attributes,
            imports, strings, dunder walks), an integer that would grow past
            :data:`MAX_INT_BITS`, a non-finite or complex result, or a math error
            (``division by zero``, ``math domain error``).
    """
    if not isinstance(expression, str):
        raise CalculatorError(f"the expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"the expression is {len(expression)} characters; at most {MAX_EXPRESSION_CHARS}")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise CalculatorError(f"not an arithmetic expression: {getattr(e, 'msg', None) or e}") from None
    _check(tree)
    try:
        return _evaluate(tree)
    except CalculatorError:
        raise
    except OverflowError:
        raise CalculatorError("the result is too large (overflow)") from None
    except (ArithmeticError, ValueError, TypeError) as e:  # ZeroDivisionError, OverflowError, math domain
        raise CalculatorError(str(e) or type(e).__name__) from None


def run_python(code: str, *, timeout_s: float = PYTHON_TIMEOUT_S, memory_mb: int = PYTHON_MEMORY_MB) -> dict[str, Any]:
    """Run ``code`` in :mod:`codechat.eval.sandbox` and report what happened.

    Args:
        code: Python source (it runs with ``__name__ == "__sandbox__"``).
        timeout_s: wall-clock limit in seconds.
        memory_mb: address-space limit per process, MiB.

    Returns:
        ``{"status": "ok" | "error" | "syntax" | "timeout" | "memory", "stdout": str,
        "stderr": str, "error": str | None}`` (``error``: ``Type: message`` of the exception).

    Raises:
        codechat.eval.sandbox.SandboxError: the sandbox itself could not start.
    """
    from codechat.eval import sandbox  # lazy: only the python tool needs it

    r = sandbox.run(code, timeout_s=timeout_s, memory_mb=memory_mb)
    return {"status": "ok" if r.status == "passed" else r.status, "stdout": r.stdout, "stderr": r.stderr,
            "error": r.error or None}


def _python_tool(timeout_s: float, memory_mb: int) -> Tool:
    return Tool(
        name="python",
        description=f"Run Python code in a sandbox ({timeout_s:g} s, no network); returns what it printed.",
        parameters={"type": "object",
                    "properties": {"code": {"type": "string", "minLength": 1,
                                            "description": "e.g. print(2 ** 10)"}},
                    "required": ["code"]},
        fn=functools.partial(run_python, timeout_s=timeout_s, memory_mb=memory_mb),
        source="builtin")


def _calculator_tool() -> Tool:
    return Tool(
        name="calculator",
        description="Evaluate an arithmetic expression: + - * / // % **, sqrt, log, sin, pi, ...",
        parameters={"type": "object",
                    "properties": {"expression": {"type": "string", "minLength": 1, "description": "e.g. (17*23) + 4"}},
                    "required": ["expression"]},
        fn=calculate, source="builtin")


BUILTIN_NAMES: tuple[str, ...] = ("calculator", "python")


def builtin_tools(names: Iterable[str] | str, *, python_timeout_s: float = PYTHON_TIMEOUT_S,
                  python_memory_mb: int = PYTHON_MEMORY_MB) -> dict[str, Tool]:
    """The named built-in tools, ``{name: Tool}``.

    Args:
        names: some of :data:`BUILTIN_NAMES` (a list, or one comma-separated string as a CLI
            flag gives it: ``"python,calculator"``).
        python_timeout_s: the ``python`` tool's wall clock per run, seconds; keep it below the
            dispatcher's ``timeout_s`` so the sandbox, not the dispatcher, reports a timeout.
        python_memory_mb: the ``python`` tool's address-space limit, MiB.

    Raises:
        ToolError: an unknown name (the message lists the built-ins), or a name given twice.
    """
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    makers: dict[str, Callable[[], Tool]] = {
        "calculator": _calculator_tool,
        "python": lambda: _python_tool(python_timeout_s, python_memory_mb),
    }
    out: dict[str, Tool] = {}
    for name in names:
        if name not in makers:
            raise ToolError(f"unknown built-in tool {name!r}; the built-ins are: {', '.join(BUILTIN_NAMES)}")
        if name in out:
            raise ToolError(f"built-in tool {name!r} is named twice")
        out[name] = makers[name]()
    return out
