"""Conversations and the chat layout, the one function-call parser, and the chat sessions.

- :mod:`.conversation`: :class:`Message`, :class:`Conversation`, :func:`render` (token ids with the
  assistant-only loss mask) and reading a rendering back; its names are this package's (``codechat.chat.render``);
- :mod:`.calls`: function calls and replies as text, the one parser;
- :mod:`.budget`: a rendering cut to SFT's token budgets, every cut counted;
- :mod:`.openai_messages`: OpenAI chat messages <-> :class:`Message`, both ways;
- :mod:`.repl`: ``codechat chat``; :mod:`.funcall`: ``codechat funcall``; :mod:`.cli`: the ``sample``,
  ``chat`` and ``funcall`` subcommands' flags.

Imports point one way: ``funcall -> repl -> budget -> conversation -> calls`` (and
``openai_messages -> conversation``); only :mod:`.repl` and :mod:`.funcall` use the engine.
"""
from .conversation import *  # noqa: F401,F403 (the package's names: codechat.chat.render, ...)
from .conversation import __all__  # noqa: F401
