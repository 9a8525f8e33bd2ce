"""Closed schemas and honest endings through the real server, with the clients people use.

The server and model are ``test_serve_grammar.py``'s (random weights, temperature 1). The schemas are
the open ones clients send by default: tools derived from Python functions and pydantic models in
their default form, none of which says ``additionalProperties``. With the official ``openai``
client, streamed and not, 200 of 200 forced calls name only declared keys, each once; each that
finishes validates against the closed schema, and each cut by ``max_tokens`` comes back as a tool
call with partial arguments and ``finish_reason`` ``length``. With ``instructor`` in its TOOLS and
JSON_SCHEMA modes every reply parses into the model or is reported as cut by length.
"""
from __future__ import annotations

import json
from typing import Literal

import jsonschema
import pytest
from pydantic import BaseModel
from test_serve_grammar import client, server  # noqa: F401  (the module's fixtures)
from test_strict_closed import PARTIAL, book_room, get_weather, object_keys

from codechat.chat.strict import closed_schema
from codechat.tools import tool_from_function

pytest.importorskip("llguidance", reason="the grammar extra (llguidance) is not installed")
pytestmark = pytest.mark.timeout(300)

TOOLS = [{"type": "function", "function": tool_from_function(f).schema()} for f in (book_room, get_weather)]
CLOSED = {t["function"]["name"]: closed_schema(t["function"]["parameters"]) for t in TOOLS}
USER = [{"role": "user", "content": "Book me a room in Oslo."}]


def calls_of(client, stream: bool, **kw) -> list[tuple[str, str, str]]:  # noqa: F811
    """Each choice's ``(tool name, arguments text, finish_reason)``; exactly one call per choice."""
    out: dict[int, list] = {}
    if not stream:
        for c in client.chat.completions.create(model="codechat", **kw).choices:
            [t] = c.message.tool_calls
            out[c.index] = [t.function.name, t.function.arguments, c.finish_reason]
    else:
        for ch in client.chat.completions.create(model="codechat", stream=True, **kw):
            for c in ch.choices:
                p = out.setdefault(c.index, ["", "", None])
                for t in c.delta.tool_calls or []:
                    p[0] += t.function.name or ""
                    p[1] += t.function.arguments or ""
                p[2] = c.finish_reason or p[2]
    return [tuple(p) for _, p in sorted(out.items())]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("strict", [True, None], ids=["strict", "no-strict-flag"])
def test_forced_calls_to_derived_tools_name_declared_keys_once_and_end_honestly(client, stream, strict):  # noqa: F811
    tools = [{**t, "function": {**t["function"], **({"strict": strict} if strict else {})}} for t in TOOLS]
    got = []
    for seed in range(25):
        got += calls_of(client, stream, messages=USER, tools=tools, tool_choice="required", n=8, seed=seed,
                        temperature=1.0, max_tokens=64)
    assert len(got) == 200
    for name, arguments, finish in got:
        assert finish in ("tool_calls", "length"), (name, arguments, finish)
        keys = object_keys(arguments)[0] if arguments.startswith("{") else []
        whole = [k for k in keys if not k.endswith(PARTIAL)]
        assert len(whole) == len(set(whole)) and set(whole) <= set(CLOSED[name]["properties"]), arguments
        if finish == "tool_calls":
            jsonschema.validate(json.loads(arguments), CLOSED[name])
    done = sum(f == "tool_calls" for _, _, f in got)
    print(f"stream={stream}: {done} of 200 calls finished, {200 - done} cut by length (partial arguments)")
    assert done >= 20


class Booking(BaseModel):  # pydantic's default: extra keys ignored, the schema open
    city: str
    nights: int
    room: Literal["single", "double"] = "single"


@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_instructor_replies_parse_into_the_model_or_say_they_were_cut(client, mode):  # noqa: F811
    instructor = pytest.importorskip("instructor", reason="instructor (a test dependency) is not installed")
    from instructor.core.exceptions import IncompleteOutputException
    ic = instructor.from_openai(client, mode=getattr(instructor.Mode, mode))
    parsed = cut = 0
    for seed in range(16):
        try:
            b = ic.chat.completions.create(model="codechat", response_model=Booking, messages=USER, seed=seed,
                                           temperature=1.0, max_tokens=96, max_retries=1)
        except IncompleteOutputException:
            cut += 1
            continue
        assert isinstance(b, Booking)
        parsed += 1
    print(f"instructor {mode}: {parsed} parsed, {cut} cut by length")
    assert parsed + cut == 16 and parsed >= 2
