"""The speedrun's generation stages: code completions of the pretrained model (``samples``), the SFT model's
chat answers (``chat``), HumanEval (``eval``) and MBPP (``mbpp``) pass@k in the sandbox, and the held-out
function-calling figures (``funcall_eval``).

Each sizes its work to the running stage's deadline: prompts and questions one after the other while
the time lasts (the first always, generation cut at the deadline), problems started until the deadline.
:class:`GenerationStages` is a part of :class:`codechat.speedrun.run.Speedrun`, whose loop calls its
``_<stage>(grant, tag)`` methods.
"""
from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any

from codechat.engine import Engine, EngineConfig, SamplingConfig
from codechat.engine.completion import best_completion, sample_completions
from codechat.speedrun.plan import SpeedrunPlan
from codechat.speedrun.record import FUNCALL_KEYS, FUNCALL_OUTCOMES
from codechat.speedrun.report import parses_after_dropping_last_line


class GenerationStages:
    """The generation stages of :class:`~codechat.speedrun.run.Speedrun`, which provides ``p`` (the plan),
    ``run`` (the run directory), ``dev``, ``seed``, ``deadline`` (the running stage's wall-clock end,
    ``time.monotonic()``), ``time_left_at_start`` and ``time_left()``."""

    p: SpeedrunPlan
    run: Path
    deadline: float
    time_left_at_start: float

    def _samples(self, grant: float, tag: str) -> dict[str, Any]:
        """Completions of the plan's code prompts by the pretrained model, one prompt after the other
        while the stage's time lasts (``n`` of ``planned`` say how many): the first always starts, and
        generation stops at the stage's end (such samples are unfinished)."""
        p = self.p
        print(f"{tag} samples: up to {len(p.sample_prompts)} prompts x {p.sample_best_of}, while the stage's "
              f"{self.time_left():.0f} s last")
        from codechat.checkpoint import load_model
        model, tok, _ = load_model(self.run / "pretrain", self.dev)
        # uncompiled: ~10k tokens at most never repay torch.compile's start, the likely sink of a 17 s
        # stage that made no token of its first prompt on an H100 (benchmarks/RESULTS.md, tenth session)
        engine = Engine(model, EngineConfig(slots=p.sample_best_of, compile=False))
        cfg = SamplingConfig(max_new_tokens=p.sample_tokens, temperature=p.sample_temperature, top_p=p.sample_top_p)
        out = []
        for i, prompt in enumerate(p.sample_prompts):
            if i and not self._time_for_another(i):
                print(f"{tag} samples: {i} of {len(p.sample_prompts)} prompts done when the stage's time ran out")
                break
            cands = sample_completions(engine, tok, prompt, cfg, p.sample_best_of, seed=self.seed + i,
                                       deadline=self.deadline)
            best = best_completion(cands)
            out.append({"prompt": prompt, "text": prompt + best.text, "finished": best.finished,
                        "mean_logprob": best.mean_logprob,
                        "parses": parses_after_dropping_last_line(prompt + best.text),
                        "parses_each": [parses_after_dropping_last_line(prompt + c.text) for c in cands],
                        "finished_each": [c.finished for c in cands]})
        return {"n": len(out), "planned": len(p.sample_prompts), "parse_ok": sum(s["parses"] for s in out),
                "best_of": p.sample_best_of,
                "parse_ok_first_sample": sum(s["parses_each"][0] for s in out),
                "parse_ok_all_samples": sum(sum(s["parses_each"]) for s in out),
                "finished_all_samples": sum(sum(s["finished_each"]) for s in out),
                "temperature": p.sample_temperature, "top_p": p.sample_top_p, "max_new_tokens": p.sample_tokens,
                "completions": out}

    def _chat(self, grant: float, tag: str) -> dict[str, Any]:
        """The SFT model's answers to the plan's questions, one after the other while the stage's time
        lasts (the first always)."""
        print(f"{tag} chat")
        from codechat.chat.conversation import Conversation, Message
        from codechat.chat.repl import reply
        from codechat.checkpoint import load_model
        model, tok, _ = load_model(self.run / "sft", self.dev)
        engine = Engine(model, EngineConfig(slots=1, compile=False))  # a few answers: as ``_samples``
        cfg = SamplingConfig(max_new_tokens=self.p.chat_tokens, temperature=self.p.sample_temperature,
                             top_p=self.p.sample_top_p)
        answers = []
        for i, q in enumerate(self.p.chat_prompts):
            if i and not self._time_for_another(i):
                print(f"{tag} chat: {i} of {len(self.p.chat_prompts)} questions answered when the stage's time ran out")
                break
            answers.append({"prompt": q, "answer": reply(engine, tok, Conversation([Message("user", q)]), cfg,
                                                         seed=self.seed + i).content})
        return {"n": len(answers), "planned": len(self.p.chat_prompts), "answers": answers}

    def _time_for_another(self, done: int) -> bool:
        """Whether the running stage has time for one more item like the ``done`` it made so far (at their
        mean wall time since the stage started)."""
        spent = time.monotonic() - (self.deadline - self.time_left_at_start)
        return self.time_left() >= spent / done

    def _score(self, suite: str | list, name: str, tag: str, *, n: int, max_new_tokens: int, limit: int | None,
               stage: str = "sft", deadline: float | None = None, temperature: float | None = None) -> dict[str, Any]:
        """pass@k of ``stage`` on ``suite`` (a suite spec or problems), sandboxed, at ``temperature``
        (default the plan's ``eval_temperature``), starting no problem after ``deadline``
        (``time.monotonic()``; default: the running stage's end) but the first; results under
        ``eval/<name>[-<stage>]``."""
        from codechat.checkpoint import load_model
        from codechat.eval.suites import format_summary, run_suite
        p = self.p
        ks = tuple(k for k in p.eval_ks if k <= n)
        temperature = p.eval_temperature if temperature is None else temperature
        model, tok, state = load_model(self.run / stage, self.dev)
        out_dir = self.run / "eval" / (name.lower() + ("" if stage == "sft" else f"-{stage}"))
        left = max(0.0, (self.deadline if deadline is None else deadline) - time.monotonic())
        print(f"{tag} {name} on {stage}/: up to {limit or 'all'} problems x {n} samples, temperature "
              f"{temperature:g}, starting no problem after {left:.0f} s but the first")
        res = run_suite(model, tok, out_dir=out_dir, suite=suite, stage=state["meta"]["stage"], n=n, ks=ks,
                        temperature=temperature,
                        max_new_tokens=max_new_tokens, limit=limit, seed=self.seed, progress=False,
                        workers=p.judge_workers, timeout_s=p.eval_timeout_s,
                        model_id=str(self.run / stage), deadline_s=left)
        print(format_summary(res))
        solved = {t: v["c"] for t, v in res["per_task"].items() if v["c"]}
        return {"stage": stage, "mode": res["mode"], "temperature": temperature, "n": res["n"],
                "problems": res["problems"], "problems_planned": res["problems_planned"],
                "pass@k": res["pass@k"], "pass@1": res["pass@1"], "pass@1_stderr": res["pass@1_stderr"],
                "pass@1_ci95": res["pass@1_ci95"],
                "solved": solved, "counts": {k: v for k, v in res["counts"].items() if v}, "finish": res["finish"],
                "verdict": res["verdict_band"], "verdict_text": res["verdict"]}

    def _eval(self, grant: float, tag: str) -> dict[str, Any]:
        p = self.p
        return {"humaneval": self._score("humaneval", "HumanEval", tag, n=p.eval_n,
                                         max_new_tokens=p.eval_tokens, limit=p.eval_limit or None)}

    def _mbpp(self, grant: float, tag: str) -> dict[str, Any]:
        return self._score(f"mbpp:{self.p.mbpp}", "MBPP", tag, n=self.p.mbpp_n,
                           max_new_tokens=self.p.mbpp_tokens, limit=self.p.eval_limit or None)

    def _funcall_eval(self, grant: float, tag: str) -> dict[str, Any]:
        """The held-out function-calling figures, free and — with the grammar extra installed — strict
        (``strict``: the same rates with every reply under the strict tool grammar, both passes batched
        together; None without the extra, and ``strict_skipped`` says why)."""
        print(f"{tag} function-calling evaluation on {self.p.funcall_data} (held out)")
        from codechat.checkpoint import load_model
        from codechat.eval.funcall import format_summary, run_funcall_suite
        strict = importlib.util.find_spec("llguidance") is not None
        model, tok, _ = load_model(self.run / "funcall", self.dev)
        res = run_funcall_suite(Engine(model), tok, path=self.p.funcall_data, out_dir=self.run / "eval" / "funcall",
                                split="heldout", max_new_tokens=self.p.funcall_tokens,
                                limit=self.p.funcall_eval_limit or None, model_id=str(self.run / "funcall"),
                                strict="both" if strict else "off")
        print(format_summary(res))
        return {**{k: res[k] for k in ("cases", "call_turns", "text_turns", *FUNCALL_KEYS, *FUNCALL_OUTCOMES)},
                "strict": {k: res["strict"][k] for k in (*FUNCALL_KEYS, *FUNCALL_OUTCOMES, "grammar_errors")}
                if strict else None,
                **({} if strict else {"strict_skipped": "the grammar extra (llguidance) is not installed"})}
