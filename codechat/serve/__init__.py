"""Serving: an OpenAI-compatible HTTP API (chat completions and the Responses API) on the engine's
scheduler, and a web chat page.

- :mod:`.config`: :class:`~.config.ServeConfig`, the server's names and limits;
- :mod:`.errors`: :class:`~.errors.APIError`, OpenAI's error object;
- :mod:`.constraints`: the grammar of a reply (``tool_choice``, strict tools, ``response_format``),
  compiled by the server's one lazily built grammar compiler, and each API's spelling of them
  (:class:`~.constraints.Shape`);
- :mod:`.protocol`: OpenAI's chat-completions request read into a conversation, a prompt and an
  engine request (its grammar included), and the field readers the APIs share;
- :mod:`.choices`: one choice built token by token (stop strings, function calls ->
  ``tool_calls``) and the ``chat.completion`` / ``chat.completion.chunk`` objects;
- :mod:`.worker`: the thread that owns and steps the engine (and runs its teacher-forced passes),
  with a bounded queue;
- :mod:`.completions`: OpenAI's legacy completions (``/v1/completions``): prompts as text or token
  ids, ``echo``, the legacy ``logprobs`` object, ``text_completion`` objects and chunks;
- :mod:`.responses`: the Responses API (``POST /v1/responses``): its request read with
  :mod:`.protocol`'s readers, its ``response`` object and typed stream events built from a choice's
  deltas; stateless (``previous_response_id``, ``store: true``, ... are 400s);
- :mod:`.app`: the FastAPI app (:func:`~.app.create_app`); ``static/``: the chat page;
- :mod:`.cli`: ``codechat serve``.

Imports point one way: config, errors <- constraints <- protocol <- choices, worker <- completions,
responses <- app <- cli. Only :mod:`.app` imports fastapi, and only when ``codechat serve`` runs (the serve extra:
``pip install 'codechat[serve]'``); nothing outside this package imports it.
"""
