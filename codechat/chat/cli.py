"""``codechat sample``, ``chat`` and ``funcall``: the commands that talk to a trained model in the terminal.

:func:`add_cli` registers the three; torch, the model and the engine are imported only when one runs."""
from __future__ import annotations

import argparse
import sys

from codechat.config.cli_args import MODEL_HELP, add_common, message_type


def add_cli(sub: argparse._SubParsersAction) -> None:
    """Add ``sample``, ``chat`` and ``funcall`` to the ``codechat`` command's subparsers."""
    _add_sample(sub)
    _add_chat(sub)
    _add_funcall(sub)


def _add_sample(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sample", help="continue a prompt with a trained model",
                       description="Sample a continuation of --prompt from a checkpoint or a stage directory.")
    p.add_argument("--model", required=True, help=MODEL_HELP)
    p.add_argument("--prompt", type=message_type("to sample from the start of a document"),
                   help="text to continue, not empty (default: start of a document)")
    _add_sampling(p, max_new_tokens=200, temperature=0.8)
    p.add_argument("--num-samples", type=int, default=1, help="continuations, one after the other (default 1)")
    add_common(p)
    p.set_defaults(func=_cmd_sample)


def _cmd_sample(args: argparse.Namespace) -> int:
    from codechat.checkpoint import load_model
    from codechat.config.device import resolve_device
    from codechat.engine import Engine, EngineConfig, Request
    device = resolve_device(args.device or "auto")
    model, tok, _ = load_model(args.model, device)
    engine = Engine(model, EngineConfig(slots=1))
    text = args.prompt or ""
    prompt = [tok.end_id] + tok.encode(text)  # documents follow an <|end|> in pretraining
    room = engine.max_len - len(prompt)
    if room < 1:
        raise SystemExit(f"error: the prompt ({len(prompt)} tokens) fills the model's context of {engine.max_len}")
    cfg = _sampling_config(args, min(args.max_new_tokens, room))
    seed = _seed(args.seed)
    for i in range(args.num_samples):
        if args.num_samples > 1:
            print(f"--- sample {i + 1}")
        stream = tok.stream()
        sys.stdout.write(text)
        for ev in engine.stream(Request(prompt, cfg, samples=[i], seed=seed, stop_ids=[tok.end_id])):
            if ev.token == tok.end_id:
                break
            sys.stdout.write(stream.push(ev.token))
            sys.stdout.flush()
        sys.stdout.write(stream.flush() + "\n")
    return 0


def _add_sampling(p: argparse.ArgumentParser, *, max_new_tokens: int, temperature: float) -> None:
    """``--max-new-tokens``, ``--temperature``, ``--top-k``, ``--top-p``, the penalties and
    ``--logit-bias`` of ``sample`` and ``chat``, with their defaults in the help."""
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens,
                   help="tokens generated at most (default %(default)s; the model's context caps it)")
    p.add_argument("--temperature", type=float, default=temperature,
                   help="sampling temperature (default %(default)s; 0: greedy)")
    p.add_argument("--top-k", type=int, default=0,
                   help="sample among the k likeliest tokens (default %(default)s: off)")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass (default %(default)s; 1: off)")
    p.add_argument("--presence-penalty", type=float, default=0.0,
                   help="OpenAI's presence penalty in [-2, 2]: subtracted from every token already generated (default 0)")
    p.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="OpenAI's frequency penalty in [-2, 2]: subtracted once per time a token was generated (default 0)")
    p.add_argument("--logit-bias", type=_logit_bias, default=(), metavar="ID:BIAS,...",
                   help="biases in [-100, 100] added to token ids' logits, e.g. 50256:-100 (bans it in effect)")


def _logit_bias(text: str) -> tuple[tuple[int, float], ...]:
    try:
        return tuple((int(i), float(b)) for i, b in (pair.split(":") for pair in text.split(",") if pair))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ID:BIAS pairs separated by commas, got {text!r}") from None


def _sampling_config(args: argparse.Namespace, max_new_tokens: int):
    """The :class:`~codechat.engine.SamplingConfig` of :func:`_add_sampling`'s options."""
    from codechat.engine import SamplingConfig
    return SamplingConfig(max_new_tokens, args.temperature, args.top_k, args.top_p,
                          presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
                          logit_bias=args.logit_bias)


def _seed(seed: int | None) -> int:
    """``--seed``, or a fresh random one when none was given."""
    import secrets
    return secrets.randbits(31) if seed is None else seed


def _add_chat(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="talk to a chat model (interactive, or one answer with --prompt)",
                       description="A multi-turn conversation with streamed answers; /reset starts over, /quit "
                                   "leaves. With --prompt, prints one answer and exits.")
    p.add_argument("--model", required=True, help="a chat model (SFT or RL): " + MODEL_HELP)
    p.add_argument("--prompt", type=message_type("for an interactive chat"),
                   help="answer this one user message (not empty) and exit")
    p.add_argument("--system", default="", help="system message (default: none)")
    _add_sampling(p, max_new_tokens=256, temperature=0.7)
    add_common(p)
    p.set_defaults(func=_cmd_chat)


def _cmd_chat(args: argparse.Namespace) -> int:
    from codechat.chat.conversation import Conversation, Message
    from codechat.chat.repl import repl, reply
    from codechat.checkpoint import load_model
    from codechat.config.device import resolve_device
    from codechat.engine import Engine, EngineConfig
    model, tok, _ = load_model(args.model, resolve_device(args.device or "auto"))
    engine = Engine(model, EngineConfig(slots=1))
    cfg = _sampling_config(args, args.max_new_tokens)
    if args.prompt is None:
        repl(engine, tok, cfg, system=args.system, seed=_seed(args.seed))
        return 0
    messages = ([Message("system", args.system)] if args.system else []) + [Message("user", args.prompt)]
    answer = reply(engine, tok, Conversation(messages), cfg, seed=_seed(args.seed),
                   on_text=lambda s: (sys.stdout.write(s), sys.stdout.flush()),
                   on_notice=lambda s: print(s, file=sys.stderr))
    if answer.function_call is not None:
        print(f"\n[function call: {answer.function_call}]", end="")
    print()
    return 0


def _add_funcall(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("funcall", help="a conversation in which the model calls your Python functions",
                       description="The system turn declares the tools; each call the model makes is validated "
                                   "against its schema and run in a worker process, and its result (or the error) "
                                   "goes back to the model until it answers in text. Interactive without --user.")
    p.add_argument("--model", required=True, help=MODEL_HELP.replace("its rl/", "its funcall/, rl/"))
    p.add_argument("--executors", help="Python file: each public function defined in it (or its EXECUTORS dict) "
                                       "is a tool, its schema from type hints and docstring")
    p.add_argument("--tools", help="built-in tools to add, comma-separated: python (runs code in the sandbox), "
                                   "calculator")
    p.add_argument("--user", type=message_type("for an interactive session"),
                   help="answer this one user message (not empty) and exit")
    p.add_argument("--system", default="", help="system message (the tool list is appended to it)")
    p.add_argument("--max-tool-calls", type=int, default=4, help="function calls answered per user turn (default 4)")
    p.add_argument("--show-trace", action="store_true", help="print every call and function response")
    p.add_argument("--max-new-tokens", type=int, default=256,
                   help="tokens generated per model turn at most (default %(default)s; the model's context caps it)")
    p.add_argument("--temperature", type=float, default=0.0, help="default 0: greedy, the most reliable calls")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default %(default)s: off)")
    p.add_argument("--tool-choice", default="auto", metavar="auto|required|none|NAME",
                   help="auto (default): the model calls a tool or answers in text; required: the first reply to "
                        "each user turn is a call (to any tool), NAME: a call to that tool — both constrained to the "
                        "tools' schemas, the replies after a function response then auto; none: no tool is declared "
                        "and nothing runs")
    p.add_argument("--strict", action="store_true",
                   help="constrain every call to the declared tools and their parameter schemas (under auto too): "
                        "calls always parse and validate. Constraints need the grammar extra "
                        "(pip install 'codechat[grammar]'); a schema it cannot compile is an error naming where")
    add_common(p)
    p.set_defaults(func=_cmd_funcall)


def _cmd_funcall(args: argparse.Namespace) -> int:
    from codechat.chat.funcall import check_tool_choice, load_tools, run_session  # no torch: tools checked in a second
    if args.max_tool_calls < 0:
        raise ValueError(f"--max-tool-calls must be >= 0, got {args.max_tool_calls}")
    tools = load_tools(args.executors, args.tools)  # a bad executors file is reported before torch and the model load
    check_tool_choice(args.tool_choice, tools)
    from codechat.checkpoint import FUNCALL_STAGES, load_model, resolve
    from codechat.config.device import resolve_device
    from codechat.engine import Engine, EngineConfig, SamplingConfig
    model, tok, _ = load_model(resolve(args.model, FUNCALL_STAGES), resolve_device(args.device or "auto"))
    engine = Engine(model, EngineConfig(slots=1))
    cfg = SamplingConfig(args.max_new_tokens, args.temperature, 0, args.top_p)
    run_session(engine, tok, tools, cfg, system=args.system, user=args.user, max_tool_calls=args.max_tool_calls,
                show_trace=args.show_trace, seed=_seed(args.seed), tool_choice=args.tool_choice, strict=args.strict)
    return 0
