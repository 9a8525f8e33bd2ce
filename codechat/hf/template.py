"""The Jinja chat template of an exported tokenizer: codechat's :func:`~codechat.chat.conversation.render`, as text.

``tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True)`` gives the ids
of :func:`~codechat.chat.conversation.render_for_completion` (and without the generation prompt those of
:func:`~codechat.chat.conversation.render`), because every special token of the text below is an added token of
the exported ``tokenizer.json`` and the text between two of them is exactly what ``render``
encodes on its own: the system text with the tools block, each message's content, each call's
JSON. What the template reads (the conversions of :mod:`codechat.data.formats`):

- ``messages``: ``role`` ``system`` / ``developer`` (first only), ``user``, ``assistant``, and
  ``tool`` / ``function`` / ``ipython`` / ``function_response`` for a function's result;
  ``content`` a string, ``null`` or a list of ``{"type": "text", "text"}`` parts (joined);
- an assistant's call as codechat's ``function_call`` ``{"name", "arguments"}`` or OpenAI's
  ``tool_calls`` ``[{"type": "function", "function": {"name", "arguments"}}]``; several calls are
  several assistant turns, the content in the first. ``arguments`` an object is written with
  ``tojson`` (``json.dumps``, as ``render`` does); a JSON *string* is inserted as written, which is
  ``render``'s text when the string is ``json.dumps``'s (Jinja cannot parse JSON);
- ``tools``: function schemas, OpenAI's ``{"type": "function", "function": {...}}`` unwrapped,
  one ``tojson`` line each after the header of :data:`codechat.chat.conversation.TOOLS_HEADER`.
"""
from __future__ import annotations

from codechat.chat.calls import FUNCTION_CALL_TOKEN
from codechat.chat.conversation import ROLE_TOKENS, TOOLS_HEADER

_TEMPLATE = r"""
{%- macro text(content) -%}
{%- if content is string -%}{{ content }}
{%- elif content is iterable -%}{%- for part in content -%}{{ part.text }}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- macro call(fc) -%}
{%- set args = fc.arguments -%}
{%- if args is string and args | trim -%}{{ '{"name": ' ~ (fc.name | tojson) ~ ', "arguments": ' ~ (args | trim) ~ '}' }}
{%- else -%}{{ {"name": fc.name, "arguments": (args if args is mapping else {})} | tojson }}
{%- endif -%}
{%- endmacro -%}
{%- set header = {"user": "@USER@", "assistant": "@ASSISTANT@", "tool": "@RESPONSE@", "function": "@RESPONSE@",
                  "ipython": "@RESPONSE@", "function_response": "@RESPONSE@"} -%}
{%- if messages and messages[0].role in ["system", "developer"] -%}
{%- set base = text(messages[0].content) -%}
{%- set rest = messages[1:] -%}
{%- else -%}
{%- set base = none -%}
{%- set rest = messages -%}
{%- endif -%}
{%- if tools -%}
{%- set ns = namespace(block="@TOOLS_HEADER@") -%}
{%- for t in tools -%}
{%- set ns.block = ns.block ~ "\n" ~ ((t.function if (t.type == "function" and t.function is mapping) else t) | tojson) -%}
{%- endfor -%}
{%- set system = (base ~ "\n\n" ~ ns.block) if base else ns.block -%}
{%- else -%}
{%- set system = base -%}
{%- endif -%}
@BOS@
{%- if system is not none -%}@SYSTEM@{{ system }}@END@{%- endif -%}
{%- for m in rest -%}
{%- if m.role not in header -%}{{ raise_exception("codechat's chat format has no role " ~ m.role ~ " here (a system message goes first)") }}{%- endif -%}
{%- if m.role == "assistant" and (m.tool_calls or m.function_call) -%}
{%- for c in (m.tool_calls if m.tool_calls else [m.function_call]) -%}
@ASSISTANT@{{ text(m.content) if loop.first else "" }}@CALL@{{ call(c.function if c.function is defined else c) }}@END@
{%- endfor -%}
{%- else -%}
{{ header[m.role] }}{{ text(m.content) }}@END@
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}@ASSISTANT@{%- endif -%}
"""


def chat_template(bos: str, end: str) -> str:
    """The template with codechat's special-token spellings (``bos``/``end``: ``<|bos|>``/``<|end|>``).

    Raises:
        ValueError: a spelling that cannot sit inside a Jinja string literal.
    """
    values = {"@BOS@": bos, "@END@": end, "@SYSTEM@": ROLE_TOKENS["system"], "@USER@": ROLE_TOKENS["user"],
              "@ASSISTANT@": ROLE_TOKENS["assistant"], "@RESPONSE@": ROLE_TOKENS["function_response"],
              "@CALL@": FUNCTION_CALL_TOKEN, "@TOOLS_HEADER@": TOOLS_HEADER}
    out = _TEMPLATE.strip()
    for key, value in values.items():
        if any(c in value for c in '"\\{}%\n'):
            raise ValueError(f"{value!r} cannot be written into the chat template")
        out = out.replace(key, value)
    return out
