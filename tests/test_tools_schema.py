"""Tool schemas: derived from Python, declared by decorator, loaded from executors files and data, checked at load."""
from __future__ import annotations

import functools
import json
import textwrap
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import pytest

from codechat.chat.conversation import TOOLS_HEADER, Conversation, Message, split_tools, system_text
from codechat.data.formats import load_records
from codechat.tools import (Tool, ToolError, check_schema, load_callables, load_executors, normalize_schema,
                            parse_docstring, tool, tool_from_function, tool_from_schema, validate_arguments)
from conftest import shared_file


def one_param(annotation: Any, **default: Any) -> Any:
    """A function ``f(x: annotation [= default])`` built at run time."""
    def f(x=default.get("default")):  # noqa: ANN001 - the annotation is set below
        return x
    if "default" not in default:
        f.__defaults__ = None
    f.__annotations__ = {"x": annotation}
    return f


def write(tmp_path: Path, text: str, name: str = "my_tools.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# ----------------------------------------------------------------------------- derivation
@pytest.mark.parametrize("annotation, expected, required", [
    (str, {"type": "string"}, True),
    (int, {"type": "integer"}, True),
    (float, {"type": "number"}, True),
    (bool, {"type": "boolean"}, True),
    (list, {"type": "array"}, True),
    (list[str], {"type": "array", "items": {"type": "string"}}, True),
    (list[list[int]], {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}}, True),
    (dict, {"type": "object", "additionalProperties": True}, True),
    (dict[str, Any], {"type": "object", "additionalProperties": True}, True),
    (dict[str, float], {"type": "object", "additionalProperties": {"type": "number"}}, True),
    (Literal["celsius", "fahrenheit"], {"type": "string", "enum": ["celsius", "fahrenheit"]}, True),
    (Literal[1, 2, 3], {"type": "integer", "enum": [1, 2, 3]}, True),
    (Optional[int], {"type": ["integer", "null"]}, False),
    (str | None, {"type": ["string", "null"]}, False),
    (Optional[Literal["a", "b"]], {"type": ["string", "null"], "enum": ["a", "b", None]}, False),
    (Union[int, str], {"type": ["integer", "string"]}, True),
    (list[int] | str, {"anyOf": [{"type": "array", "items": {"type": "integer"}}, {"type": "string"}]}, True),
    (Any, {}, False),
    (Annotated[int, "how many"], {"type": "integer", "description": "how many"}, True),
])
def test_each_supported_annotation_gives_its_exact_schema(annotation, expected, required):
    t = tool_from_function(one_param(annotation))
    want = {"type": "object", "properties": {"x": expected}}
    if required:
        want["required"] = ["x"]
    assert t.parameters == want
    assert check_schema(t.parameters, "t") == want
    assert normalize_schema(t.parameters) == (want, [])  # derived schemas need no repair


def test_defaults_are_not_required_and_recorded_in_type_order():
    def book(city: str, nights: int = 1, budget: float | None = None, tags: list[str] = (), fast: bool = False,
             limit: int = None, when: object = object()):  # type: ignore[assignment]
        """Book a hotel."""
    with pytest.raises(ToolError, match="parameter 'when'"):
        tool_from_function(book)  # object is not a type we express

    def book(city: str, nights: int = 1, budget: float | None = None, tags: list[str] = (), fast: bool = False,
             limit: int = None, unit: Literal["eur", "usd"] = "eur"):  # type: ignore[assignment]  # noqa: F811
        """Book a hotel."""
    t = tool_from_function(book)
    assert t.parameters == {"type": "object", "properties": {
        "city": {"type": "string"},
        "nights": {"type": "integer", "default": 1},
        "budget": {"type": ["number", "null"], "default": None},
        "tags": {"type": "array", "items": {"type": "string"}, "default": []},
        "fast": {"type": "boolean", "default": False},
        "limit": {"type": ["integer", "null"], "default": None},  # `int = None`: None is a value it takes
        "unit": {"type": "string", "enum": ["eur", "usd"], "default": "eur"},
    }, "required": ["city"]}
    assert (t.name, t.description, t.fn) == ("book", "Book a hotel.", book)
    assert t.source.endswith("test_tools_schema.py:"
                             "test_defaults_are_not_required_and_recorded_in_type_order.<locals>.book")


def test_a_default_that_is_not_json_is_not_shown_and_one_that_misfits_is_an_error():
    def f(x: list[int] = [1, 2], y: float = float("inf")):  # noqa: B006
        """F."""
    assert tool_from_function(f).parameters["properties"] == {
        "x": {"type": "array", "items": {"type": "integer"}, "default": [1, 2]}, "y": {"type": "number"}}

    def g(n: int = "3"):  # type: ignore[assignment]
        """G."""
    with pytest.raises(ToolError, match=r"g: parameter 'n': default '3' does not fit its type"):
        tool_from_function(g)


def test_google_docstring_gives_description_and_parameter_texts():
    def get_weather(city: str, unit: Literal["c", "f"] = "c", days: int = 1) -> str:
        """Get the weather forecast
        for a city.

        Longer text that is not shown to the model.

        Args:
            city (str): The city, e.g.
                "Paris".
            unit: Temperature unit (c or f).
            days (int, optional): How many days (1-7).

        Returns:
            The forecast.
        """
    t = tool_from_function(get_weather)
    assert t.description == "Get the weather forecast for a city."
    assert t.parameters == {"type": "object", "properties": {
        "city": {"type": "string", "description": 'The city, e.g. "Paris".'},
        "unit": {"type": "string", "enum": ["c", "f"], "description": "Temperature unit (c or f).", "default": "c"},
        "days": {"type": "integer", "description": "How many days (1-7).", "default": 1},
    }, "required": ["city"]}


def test_numpy_docstring_gives_description_and_parameter_texts():
    def area(width: float, height: float, unit: str = "m") -> float:
        """Area of a rectangle.

        Parameters
        ----------
        width, height : float
            Side lengths,
            positive.
        unit : str, optional
            Length unit.

        Returns
        -------
        float
            The area.
        """
    t = tool_from_function(area)
    assert t.description == "Area of a rectangle."
    assert t.parameters["properties"] == {
        "width": {"type": "number", "description": "Side lengths, positive."},
        "height": {"type": "number", "description": "Side lengths, positive."},
        "unit": {"type": "string", "description": "Length unit.", "default": "m"},
    }


def test_sphinx_docstring_and_no_docstring():
    assert parse_docstring("Add two numbers.\n\n:param a: first\n:param int b: second,\n    an int\n:returns: sum") \
        == ("Add two numbers.", {"a": "first", "b": "second, an int"})
    assert parse_docstring(None) == ("", {})
    assert parse_docstring("Args:\n    x: only args") == ("", {"x": "only args"})


def test_bound_methods_partials_and_callable_objects():
    class Counter:
        """Counts."""

        def __call__(self, step: int = 1) -> int:
            """Advance the counter.

            Args:
                step: how far.
            """
            return step

        def reset(self, to: int) -> None:
            """Reset it."""

    def scale(x: float, factor: float) -> float:
        """Scale x."""
        return x * factor

    assert tool_from_function(Counter().reset).parameters == {
        "type": "object", "properties": {"to": {"type": "integer"}}, "required": ["to"]}
    obj = tool_from_function(Counter(), name="count")
    assert (obj.name, obj.description) == ("count", "Advance the counter.")
    assert obj.parameters["properties"] == {"step": {"type": "integer", "description": "how far.", "default": 1}}
    part = tool_from_function(functools.partial(scale, factor=2.0))
    assert (part.name, part.description, part.parameters["required"]) == ("scale", "Scale x.", ["x"])


@pytest.mark.parametrize("source, message", [
    ("def f(*xs: int):\n    pass", r"f: parameter 'xs': \*xs cannot be passed"),
    ("def f(**kw: int):\n    pass", r"f: parameter 'kw': \*\*kw has no schema"),
    ("def f(a: int, /):\n    pass", r"f: parameter 'a': positional-only"),
    ("def f(a):\n    pass", r"f: parameter 'a' has no type annotation"),
    ("class Point:\n    pass\ndef f(p: Point):\n    pass", r"f: parameter 'p': type Point has no JSON Schema"),
    ("def f(m: dict[int, str]):\n    pass", r"f: parameter 'm': dict keys must be str"),
    ("def f(t: tuple[int, int]):\n    pass", r"f: parameter 't': type tuple\[int, int\] has no JSON Schema"),
    ("from __future__ import annotations\ndef f(a: Undefined):\n    pass", r"f: cannot read the signature or resolve"),
])
def test_an_inexpressible_parameter_is_an_error_naming_file_function_and_parameter(tmp_path, source, message):
    path = write(tmp_path, source)
    with pytest.raises(ToolError, match=message) as e:
        load_executors(path)
    assert str(e.value).startswith(f"{path}:f") and "\n" not in str(e.value)


# ----------------------------------------------------------------------------- decorator
def test_decorator_bare_and_with_name_and_description_overrides():
    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @tool(name="sub_ints", description="Subtract b from a.")
    def sub(a: int, b: int) -> int:
        """Not this text."""
        return a - b

    assert add(2, 3) == 5 and sub(5, 3) == 2  # still plain functions
    t, s = tool_from_function(add), tool_from_function(sub)
    assert (t.name, t.description, t.fn) == ("add", "Add two integers.", add)
    assert (s.name, s.description) == ("sub_ints", "Subtract b from a.")
    assert s.parameters == {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                            "required": ["a", "b"]}


def test_decorator_explicit_schema_is_used_without_annotations():
    schema = {"type": "object", "properties": {"expr": {"type": "string", "description": "e.g. 2*(3+4)"},
                                               "digits": {"type": "integer", "minimum": 0}}, "required": ["expr"]}

    @tool(parameters=schema)
    def calc(expr, digits=6, **_ignored):
        """Evaluate an arithmetic expression."""
        return round(eval(expr), digits)  # noqa: S307 - a test

    t = tool_from_function(calc)
    assert t.parameters == schema and t.parameters is not schema  # a copy: later edits do not leak in
    assert t.description == "Evaluate an arithmetic expression."
    assert validate_arguments(t, {"expr": "1+1", "digits": -1}) == "digits: -1 is less than the minimum of 0"


def test_decorator_rejects_an_invalid_or_mismatched_schema_at_definition():
    with pytest.raises(ToolError, match=r"test_tools_schema.py:.*f: parameters.properties.x.type is not valid "
                                        r"JSON Schema.*normalize_schema would repair it: "
                                        r"parameters.properties.x: type 'int' -> \{\"type\": \"integer\"\}"):
        @tool(parameters={"type": "object", "properties": {"x": {"type": "int"}}})
        def f(x):
            pass
    with pytest.raises(ToolError, match=r"f2: parameters must be an object schema"):
        @tool(parameters={"type": "array"})
        def f2(x):
            pass
    with pytest.raises(ToolError, match=r"f3: schema property 'y' is not a parameter of the function"):
        @tool(parameters={"type": "object", "properties": {"x": {}, "y": {}}, "required": ["x"]})
        def f3(x):
            pass
    with pytest.raises(ToolError, match=r"f4: parameter 'x' has no default but the schema does not require it"):
        @tool(parameters={"type": "object", "properties": {"x": {}}})
        def f4(x):
            pass
    with pytest.raises(ToolError, match=r"f5: tool name 'has space'"):
        @tool(name="has space")
        def f5(x: int):
            pass


def test_a_decorated_function_wrapped_again_calls_the_wrapper():
    calls = []

    def logged(fn):
        @functools.wraps(fn)
        def wrapper(*a, **k):
            calls.append(k)
            return fn(*a, **k)
        return wrapper

    @logged
    @tool
    def ping(host: str) -> str:
        """Ping a host."""
        return host

    t = tool_from_function(ping)
    assert t.fn is ping and t.parameters["required"] == ["host"]
    assert t.fn(host="a") == "a" and calls == [{"host": "a"}]


# ----------------------------------------------------------------------------- executors files
def test_executors_file_exposes_the_public_functions_defined_in_it(tmp_path):
    write(tmp_path, '''
        def helper_from_sibling(x: int) -> int:
            """Imported by the executors file: not its tool."""
            return x
    ''', name="sibling.py")
    path = write(tmp_path, '''
        """My tools."""
        from __future__ import annotations

        import json
        from os.path import join
        from typing import Literal
        from sibling import helper_from_sibling

        from codechat.tools import tool

        LIMIT = 3


        def get_time(zone: Literal["utc", "local"] = "utc") -> str:
            """Current time."""
            return "12:00"


        def _private(x: int) -> int:
            return x


        class NotATool:
            def method(self, x: int) -> int:
                return x


        @tool(name="add_numbers")
        def add(a: float, b: float) -> float:
            """Add a and b."""
            return a + b
    ''')
    tools = load_executors(path)
    assert [t.name for t in tools] == ["get_time", "add_numbers"]
    assert [t.source for t in tools] == [f"{path}:get_time", f"{path}:add"]
    assert tools[0].parameters == {"type": "object", "properties": {
        "zone": {"type": "string", "enum": ["utc", "local"], "default": "utc"}}}  # string hints resolved
    assert tools[1].fn(a=1, b=2) == 3
    assert str(tmp_path) not in __import__("sys").path  # the file's folder was on sys.path only while importing


def test_executors_dict_gives_exactly_those_tools_named_by_their_keys(tmp_path):
    path = write(tmp_path, '''
        from os.path import basename

        def shout(text: str) -> str:
            """Upper-case the text."""
            return text.upper()

        def unused(x: int) -> int:
            return x

        def base_name(path: str) -> str:
            """The last part of a path."""
            return basename(path)

        EXECUTORS = {"loud": shout, "basename": base_name}
    ''')
    tools = load_executors(path)
    assert [(t.name, t.description) for t in tools] == [("loud", "Upper-case the text."),
                                                       ("basename", "The last part of a path.")]
    assert [t.fn("a/b") for t in tools] == ["A/B", "b"]
    assert list(load_callables(path)) == ["loud", "basename"]


def test_loading_a_file_twice_gives_independent_modules(tmp_path):
    path = write(tmp_path, "STATE = []\ndef push(x: int) -> int:\n    STATE.append(x)\n    return len(STATE)\n")
    a, b = load_executors(path)[0], load_executors(path)[0]
    assert a.fn(x=1) == 1 and a.fn(x=2) == 2 and b.fn(x=3) == 1
    assert a.fn.__module__ != b.fn.__module__


@pytest.mark.parametrize("source, message", [
    (None, "no such executors file"),
    ("def f(x: int:\n    pass", "does not import: SyntaxError: "),
    ("raise RuntimeError('no API key\\nset KEY')", "does not import: RuntimeError: no API key set KEY"),
    ("import sys\nsys.exit(3)", "does not import: SystemExit: 3"),
    ("import json\nfrom os.path import join\nX = 1\ndef _p(x: int):\n    pass",
     r"no public function defined in the file \(and no EXECUTORS dict\)"),
    ("EXECUTORS = []", "EXECUTORS must be a non-empty dict of name -> callable, got list"),
    ("EXECUTORS = {'x': 3}", r"EXECUTORS\['x'\] must map a string name to a callable, got int"),
    ("from codechat.tools import tool\n@tool(name='g')\ndef f(x: int):\n    pass\ndef g(x: int):\n    pass",
     "two tools named 'g'"),
])
def test_a_bad_executors_file_is_an_error_naming_the_file(tmp_path, source, message):
    path = tmp_path / "missing.py" if source is None else write(tmp_path, source)
    with pytest.raises(ToolError, match=message) as e:
        load_executors(path)
    assert str(e.value).startswith(f"{path}: ") and "\n" not in str(e.value)


def test_an_invalid_explicit_schema_in_an_executors_file_fails_at_load(tmp_path):
    path = write(tmp_path, '''
        from codechat.tools import tool

        @tool(parameters={"type": "object", "properties": {"n": {"type": "integer", "minimum": "zero"}}})
        def count(n=0):
            return n
    ''')
    with pytest.raises(ToolError, match=r"my_tools.py:count: parameters.properties.n.minimum is not valid JSON "
                                        r"Schema: 'zero' is not of type 'number'"):
        load_executors(path)


# ----------------------------------------------------------------------------- schemas from data
def test_normalize_repairs_a_sloppy_schema_and_says_what_it_repaired():
    sloppy = {"type": "dict", "properties": {
        "city": {"type": "str", "required": True, "description": "City"},
        "days": {"type": "int", "required": False},
        "ids": {"type": "List[int]"},
        "scale": {"type": "float, optional"},
        "verbose": "bool",
        "note": {"type": "String", "nullable": True},
        "when": {"type": "date"},
        "extra": {"type": "any"},
        "point": {"type": "tuple", "items": [{"type": "float"}, {"type": "float"}]},
        "opts": {"type": "object", "properties": [{"name": "k", "type": "integer"}], "required": "k"},
    }, "required": ["ids", "ids", "ghost"]}
    before = json.dumps(sloppy)
    fixed, changes = normalize_schema(sloppy)
    assert json.dumps(sloppy) == before  # the input is not changed
    assert fixed == {"type": "object", "properties": {
        "city": {"type": "string", "description": "City"},
        "days": {"type": "integer"},
        "ids": {"type": "array", "items": {"type": "integer"}},
        "scale": {"type": "number"},
        "verbose": {"type": "boolean"},
        "note": {"type": ["string", "null"]},
        "when": {"type": "string", "format": "date"},
        "extra": {},
        "point": {"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}]},
        "opts": {"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]},
        "ghost": {},
    }, "required": ["ids", "ghost", "city"]}
    assert len(changes) == 20, changes
    assert changes[0] == "parameters: type 'dict' -> {\"type\": \"object\"}"
    assert "parameters.properties.city: 'required: true' inside the property -> in the object's required list" \
        in changes
    assert "parameters.properties.scale: type 'float, optional' -> {\"type\": \"number\"} (not required)" in changes
    assert "parameters: required 'ghost' is not a property: added as {} (any value)" in changes
    assert check_schema(fixed, "x") == fixed
    assert normalize_schema(fixed) == (fixed, [])  # idempotent


def test_normalize_reads_the_xlam_layout_and_fills_an_empty_schema():
    xlam = {"n": {"type": "int", "description": "How many.", "default": 10},
            "query": {"type": "str", "description": "Search text."},
            "lang": {"type": "str, optional", "description": "Language."}}
    fixed, changes = normalize_schema(xlam)
    assert fixed == {"type": "object", "properties": {
        "n": {"type": "integer", "description": "How many.", "default": 10},
        "query": {"type": "string", "description": "Search text."},
        "lang": {"type": "string", "description": "Language."}}, "required": ["query"]}
    assert len(changes) == 5 and changes[-1] == "parameters: required inferred (no default, not optional): ['query']"
    assert normalize_schema({}) == ({"type": "object", "properties": {}},
                                    ["parameters: no 'type': 'object'", "parameters: no 'properties': {}"])
    fixed, changes = normalize_schema({"type": "dict", "required": ["q"]})
    assert fixed == {"type": "object", "properties": {"q": {}}, "required": ["q"]} and len(changes) == 3
    assert normalize_schema({"type": "object", "properties": {"x": {"type": "object"}}}) == (
        {"type": "object", "properties": {"x": {"type": "object"}}}, [])  # a nested free-form object is kept


@pytest.mark.parametrize("parameters, message", [
    ([1, 2], "parameters must be a JSON Schema object, got list"),
    ({"type": "array", "items": {}}, "parameters must be an object schema"),
    ({"type": "object", "properties": {"x": {"type": "date-ish"}}}, "parameters.properties.x.type is not valid"),
    ({"type": "object", "properties": {}, "required": ["x"]}, r"required \['x'\] not among the properties"),
    ({"name": "f", "parameters": {}}, "this looks like a whole tool schema"),
])
def test_check_schema_rejects_what_is_not_an_object_json_schema(parameters, message):
    with pytest.raises(ToolError, match=message) as e:
        check_schema(parameters, "tools.json: tools[0]")
    assert str(e.value).startswith("tools.json: tools[0]: ")


def test_tool_from_schema_unwraps_openai_normalises_and_checks():
    wrapped = {"type": "function", "function": {"name": "convert", "description": "Convert money.", "parameters": {
        "type": "object", "properties": {"amount": {"type": "float"}, "to": {"type": "string"}},
        "required": ["amount", "to"]}}}
    t = tool_from_schema(wrapped, "data.json:3: tools[0]")
    assert t.schema() == {"name": "convert", "description": "Convert money.", "parameters": {
        "type": "object", "properties": {"amount": {"type": "number"}, "to": {"type": "string"}},
        "required": ["amount", "to"]}}
    assert t.changes == ("parameters.properties.amount: type 'float' -> {\"type\": \"number\"}",)
    assert (t.fn, t.source) == (None, "data.json:3: tools[0] (convert)")
    bare = tool_from_schema({"name": "now"}, "w")
    assert bare.parameters == {"type": "object", "properties": {}} and bare.description == ""
    with pytest.raises(ToolError, match=r"w \(convert\): parameters.properties.amount.type is not valid"):
        tool_from_schema(wrapped, "w", normalize=False)
    with pytest.raises(ToolError, match="w: a tool schema must be a JSON object with a string 'name'"):
        tool_from_schema({"description": "nameless"}, "w")
    with pytest.raises(ToolError, match="tool name 'two words'"):
        tool_from_schema({"name": "two words"}, "w")

    def convert(amount: float) -> str:
        return str(amount)
    with pytest.raises(ToolError, match=r"w \(convert\): schema property 'to' is not a parameter of the function"):
        tool_from_schema(wrapped, "w", fn=convert)


def check_data_tool_schemas(path: Path, n_tools: int, n_distinct: int) -> dict[str, Tool]:
    """Every tool schema of a function-calling data file loads as written (nothing to repair); returns them by name."""
    records = load_records(path)
    tools = [tool_from_schema(schema, f"{r.source}:{r.line}: tools[{i}]")
             for r in records for i, schema in enumerate(r.conversation.tools or ())]
    assert len(tools) == n_tools and len({json.dumps(t.schema(), sort_keys=True) for t in tools}) == n_distinct
    assert sum(len(t.changes) for t in tools) == 0  # clean JSON Schema: nothing to repair
    assert all(check_schema(t.parameters, t.source) == t.parameters for t in tools)
    return {t.name: t for t in tools}


def test_every_tool_schema_of_the_glaive_demo_loads():
    by_name = check_data_tool_schemas(shared_file("data/function_calling_glaive/glaive_toolcall_en_demo.json"), 219,
                                      177)
    assert validate_arguments(by_name["search_recipes"], {"ingredients": ["rice"]}) is None
    assert validate_arguments(by_name["search_recipes"], {"ingredients": "rice"}) == \
        "ingredients: 'rice' is not of type 'array'"


def test_every_tool_schema_of_the_sharegpt_fixture_loads():
    by_name = check_data_tool_schemas(Path(__file__).parent / "fixtures/cases_b/glaive_sharegpt/sample.json", 12, 5)
    assert sorted(by_name) == ["convert_units", "find_recipes", "get_stock_price", "set_reminder", "split_bill"]
    assert by_name["find_recipes"].source.endswith("sample.json:11: tools[0] (find_recipes)")  # the last record
    assert validate_arguments(by_name["find_recipes"], {"ingredients": ["rice"]}) is None
    assert validate_arguments(by_name["find_recipes"], {"ingredients": "rice"}) == \
        "ingredients: 'rice' is not of type 'array'"
    assert validate_arguments(by_name["set_reminder"], {"text": "x", "when": {"day": "Mon", "hour": "9"}}) == \
        "when.hour: '9' is not of type 'integer'"
    assert validate_arguments(by_name["split_bill"], {"total": 10}) == "arguments: 'people' is a required property"


# ----------------------------------------------------------------------------- arguments and the system turn
def test_validate_arguments_on_a_derived_schema_reports_the_path():
    def plan(meals: list[dict[str, float]], unit: Literal["kcal", "kj"] = "kcal", note: str | None = None):
        """Plan meals."""
    t = tool_from_function(plan)
    assert validate_arguments(t, {"meals": [{"rice": 200.0}], "note": None}) is None
    assert validate_arguments(t, {"meals": [{"rice": 200}, {"beans": "lots"}]}) == \
        "meals.1.beans: 'lots' is not of type 'number'"
    assert validate_arguments(t, {"meals": [], "unit": "cal"}) == "unit: 'cal' is not one of ['kcal', 'kj']"
    assert validate_arguments(t, {"unit": "kj"}) == "arguments: 'meals' is a required property"
    assert validate_arguments(t, {"meals": [], "note": 3}) == "note: 3 is not of type 'string', 'null'"


def test_derived_tools_go_into_the_one_system_turn_layout_of_chat():
    def get_time(zone: str = "utc") -> str:
        """Current time in a zone."""
    t = tool_from_function(get_time)
    conv = Conversation((Message("system", "Be brief."), Message("user", "time?")), tools=(t.schema(),))
    text = system_text(conv)
    assert text == "Be brief.\n\n" + TOOLS_HEADER + "\n" + json.dumps(t.schema(), ensure_ascii=False)
    assert split_tools(text) == ("Be brief.", (t.schema(),))
    assert isinstance(t, Tool) and tool_from_schema(t.schema(), "round trip").schema() == t.schema()
