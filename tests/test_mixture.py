"""Weighted data mixtures: case 21, spec parsing, determinism, resume, subsets, hf sources.

The data-driven tests run on the project's own inputs (``fixtures``: tests/fixtures/cases_b and sources generated
here) and on the public data (``shared``: shared/cases/21-mixture, MBPP, Code Alpaca), which skip when shared/ is
absent.
"""
from __future__ import annotations

import json
import logging
import sys
import types
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from codechat.config.sft import SFTConfig
from codechat.config.stages import ConfigError
from codechat.data.benchmarks import mbpp_split
from codechat.data.mixture import BLOCK, Mixture
from codechat.data.spec import SourceSpec, missing_sources, parse_spec
from conftest import shared_file

FIXTURES = Path(__file__).parent / "fixtures" / "sft"
CASES_B = Path(__file__).parent / "fixtures" / "cases_b"


@pytest.fixture(scope="module", params=["fixtures", "shared"])
def case21(request) -> Path:
    """A folder with a.jsonl (3 records), b.jsonl (2) and empty.jsonl (0), and specs.json: the project's own
    (tests/fixtures/cases_b/mixture) and shared/cases/21-mixture (skipped when absent)."""
    if request.param == "shared":
        return shared_file("cases/21-mixture")
    return CASES_B / "mixture"


@dataclass(frozen=True)
class TwoSources:
    """Two sources of different sizes under ``base``: ``a`` (``n_a`` records) and ``b`` (``n_b``)."""

    base: Path
    a: str
    n_a: int
    b: str
    n_b: int


@pytest.fixture(scope="module", params=["fixtures", "shared"])
def two_sources(request, tmp_path_factory) -> TwoSources:
    """Generated here (97 question/answer lines, a JSON array of 201 alpaca records), or MBPP and Code Alpaca 2k
    from shared/data (skipped when absent)."""
    if request.param == "shared":
        return TwoSources(shared_file("data"), "mbpp/mbpp.jsonl", 974, "code_alpaca/code_alpaca_2k.json",
                          2017)
    base = tmp_path_factory.mktemp("two_sources")
    (base / "qa.jsonl").write_text("".join(json.dumps({"question": f"{k} + {k}?", "answer": str(2 * k)}) + "\n"
                                           for k in range(97)))
    (base / "alpaca.json").write_text(json.dumps([{"instruction": f"Print {k}.", "input": "",
                                                   "output": f"print({k})"} for k in range(201)]))
    return TwoSources(base, "qa.jsonl", 97, "alpaca.json", 201)


@dataclass(frozen=True)
class MbppData:
    """An MBPP-layout file and its sanitized JSON array, with the counts decontamination must give."""

    full: Path
    sanitized: Path
    n: int  # records of ``full``
    n_test: int  # its test-split tasks (11..510)
    n_held_out: int  # its test + validation tasks (11..600)
    n_sanitized_held_out: int
    test_line: int  # 0-based line of one test task in ``full``


@pytest.fixture(scope="module", params=["fixtures", "shared"])
def mbpp_data(request) -> MbppData:
    """tests/fixtures/cases_b/mbpp (tasks 2-4, 11-13, 511, 601-604; 604 copies test task 12), or the real MBPP
    from shared/data (skipped when absent)."""
    if request.param == "shared":
        return MbppData(shared_file("data/mbpp/mbpp.jsonl"), shared_file("data/mbpp/sanitized-mbpp.json"), 974, 500,
                        590, 257 + 43, 10)
    return MbppData(CASES_B / "mbpp/mbpp.jsonl", CASES_B / "mbpp/sanitized-mbpp.json", 11, 3, 4, 3, 3)


def mix(spec: str, base: Path, **cfg) -> Mixture:
    return Mixture.from_spec(spec, SFTConfig(**cfg), base_dir=base)


def draws(m: Mixture, n: int) -> list[tuple[str, int]]:
    return [(Path(r.source).name, r.line) for r in (next(m) for _ in range(n))]


#: what each spec of case 21's specs.json gives: sampling probabilities, or the ConfigError's text
CASE21_OUTCOMES = {"a.jsonl:1.0,b.jsonl:0": [1.0, 0.0], "a.jsonl:0.5,b.jsonl:1.5": [0.25, 0.75],
                   "a.jsonl:1.0,empty.jsonl:1.0": "data source 'empty.jsonl' is empty",
                   "empty.jsonl:1.0,a.jsonl:1.0": "data source 'empty.jsonl' is empty",
                   "a.jsonl:0,b.jsonl:0": "all weights are zero", "a.jsonl:-1,b.jsonl:1": "negative weight",
                   "a.jsonl:nan,b.jsonl:1": "non-finite weight", "a.jsonl,b.jsonl:2": [1 / 3, 2 / 3],
                   "a.jsonl:1.0,b.jsonl:1.0": [0.5, 0.5]}


def test_case21_every_spec_of_the_specs_file_gives_its_outcome(case21):
    specs = [s["spec"].split(" ")[0] for s in json.loads((case21 / "specs.json").read_text())["specs"]]
    assert specs == list(CASE21_OUTCOMES)  # a spec added to the case needs an outcome here
    for spec, expected in CASE21_OUTCOMES.items():
        if isinstance(expected, str):
            with pytest.raises(ConfigError, match=expected):
                mix(spec, case21)
        else:
            assert mix(spec, case21).probabilities == pytest.approx(expected, abs=1e-12), spec


def test_case21_zero_weight_is_never_drawn_and_the_epoch_ends(case21):
    m = mix("a.jsonl:1.0,b.jsonl:0", case21, seed=0)
    assert m.probabilities == [1.0, 0.0]
    assert {name for name, _ in draws(m, 10_000)} == {"a.jsonl"}
    m = mix("a.jsonl:1.0,b.jsonl:0", case21, seed=0)
    epoch = [(Path(r.source).name, r.line) for r in m.iter_epoch()]  # terminates without exhausting b
    assert sorted(epoch) == [("a.jsonl", 1), ("a.jsonl", 2), ("a.jsonl", 3)] and m.epoch_size == 3
    e = mix("a.jsonl:1.0,b.jsonl:0", case21, seed=0, mix_mode="epoch")
    assert sorted(Path(r.source).name for r in e.iter_epoch()) == ["a.jsonl"] * 3


def test_case21_weights_are_normalised_to_sampling_probabilities(case21):
    m = mix("a.jsonl:0.5,b.jsonl:1.5", case21, seed=1234)
    assert m.probabilities == [0.25, 0.75]
    share = Counter(name for name, _ in draws(m, 10_000))
    assert abs(share["a.jsonl"] / 10_000 - 0.25) <= 0.03 and abs(share["b.jsonl"] / 10_000 - 0.75) <= 0.03
    report = {r["source"]: r for r in m.report()}
    assert report["a.jsonl"]["drawn"] == share["a.jsonl"] and report["b.jsonl"]["target_share"] == 0.75
    assert report["a.jsonl"]["share"] == round(share["a.jsonl"] / 10_000, 6)
    assert "a.jsonl: weight 0.5, target 0.250, realised" in m.format_report()


@pytest.mark.parametrize("spec", ["a.jsonl:1.0,empty.jsonl:1.0", "empty.jsonl:1.0,a.jsonl:1.0"])
def test_case21_an_empty_source_is_an_error_naming_it(case21, spec):
    with pytest.raises(ConfigError, match=r"data source 'empty.jsonl' is empty"):
        mix(spec, case21)


@pytest.mark.parametrize("spec,match", [("a.jsonl:0,b.jsonl:0", "all weights are zero"),
                                        ("a.jsonl:-1,b.jsonl:1", "negative weight"),
                                        ("a.jsonl:nan,b.jsonl:1", "non-finite weight"),
                                        ("a.jsonl:inf,b.jsonl:1", "non-finite weight")])
def test_case21_bad_weights_are_errors(case21, spec, match):
    with pytest.raises(ConfigError, match=match):
        mix(spec, case21)


def test_case21_a_missing_weight_defaults_to_one(case21):
    m = mix("a.jsonl,b.jsonl:2", case21)
    assert m.probabilities == pytest.approx([1 / 3, 2 / 3])


def test_case21_epoch_mode_gives_each_row_once_per_epoch(case21):
    m = mix("a.jsonl:1.0,b.jsonl:1.0", case21, seed=3, mix_mode="epoch")
    rows = {("a.jsonl", 1), ("a.jsonl", 2), ("a.jsonl", 3), ("b.jsonl", 1), ("b.jsonl", 2)}
    orders = []
    for epoch in range(3):
        assert m.epoch == epoch
        got = [(Path(r.source).name, r.line) for r in m.iter_epoch()]
        assert sorted(got) == sorted(rows) and len(got) == 5
        orders.append(got)
    assert len({tuple(o) for o in orders}) > 1  # reshuffled each epoch
    up = mix("a.jsonl:2,b.jsonl:0.5", case21, seed=3, mix_mode="epoch")  # a twice, one of b's two rows
    assert Counter(Path(r.source).name for r in up.iter_epoch()) == {"a.jsonl": 6, "b.jsonl": 1}


@pytest.mark.parametrize("spec,expected", [
    ("data.jsonl", [SourceSpec("data.jsonl", 1.0)]),
    ("a.jsonl:0.5, b.json.gz:2", [SourceSpec("a.jsonl", 0.5), SourceSpec("b.json.gz", 2.0)]),
    ("hf:org/name", [SourceSpec("hf:org/name", 1.0)]),
    ("hf:org/name:cfg@test", [SourceSpec("hf:org/name:cfg@test", 1.0)]),
    ("hf:org/name:cfg:3", [SourceSpec("hf:org/name:cfg", 3.0)]),
    ("x.jsonl#alpaca:1e-1", [SourceSpec("x.jsonl", 0.1, "alpaca")]),
    ("mine::0.5", [SourceSpec("mine:", 0.5)]),
    ("glaive.json@train#sharegpt:2", [SourceSpec("glaive.json", 2.0, "sharegpt", "train")]),
    ("glaive.json@heldout", [SourceSpec("glaive.json", 1.0, "auto", "heldout")]),
])
def test_spec_parsing(spec, expected):
    assert parse_spec(spec) == expected


@pytest.mark.parametrize("spec,match", [("", "empty"), ("a.jsonl,,b.jsonl", "item 2 is empty"),
                                        ("a.jsonl#yaml:1", "unknown format 'yaml'"),
                                        ("a.jsonl@test", "unknown split 'test'")])
def test_bad_specs(spec, match):
    with pytest.raises(ConfigError, match=match):
        parse_spec(spec)


def test_a_misspelled_zero_weight_source_is_still_an_error(case21):
    with pytest.raises(ConfigError, match="does not exist"):
        mix("a.jsonl:1,typo.jsonl:0", case21)


def test_order_is_deterministic_for_a_seed(two_sources):
    t = two_sources
    spec = f"{t.a}:1,{t.b}:1"
    a, b = mix(spec, t.base, seed=7), mix(spec, t.base, seed=7)
    assert draws(a, 300) == draws(b, 300)
    assert draws(mix(spec, t.base, seed=8), 300) != draws(mix(spec, t.base, seed=7), 300)
    one = mix(t.a, t.base, seed=7)
    assert sorted(line for _, line in draws(one, t.n_a)) == list(range(1, t.n_a + 1))  # every record once per cycle


@pytest.mark.parametrize("mode,stop", [("sample", 137), ("sample", BLOCK - 5), ("epoch", -3)])
def test_resume_continues_the_exact_order(two_sources, mode, stop):
    t = two_sources
    stop = stop if stop > 0 else t.n_a + t.n_b + stop  # epoch: 3 rows before the end of the first epoch
    spec = f"{t.a}:1,{t.b}:1"
    ref = mix(spec, t.base, seed=11, mix_mode=mode)
    draws(ref, stop)
    state = json.loads(json.dumps(ref.state_dict()))  # as saved in a checkpoint
    expected = draws(ref, 40)
    resumed = mix(spec, t.base, seed=11, mix_mode=mode)
    resumed.load_state_dict(state)
    assert draws(resumed, 40) == expected
    assert resumed.taken == ref.taken and resumed.epoch == ref.epoch


def test_a_state_from_another_mixture_is_rejected(case21):
    state = mix("a.jsonl:1,b.jsonl:1", case21, seed=1).state_dict()
    with pytest.raises(ConfigError, match="different data mixture"):
        mix("a.jsonl:1,b.jsonl:2", case21, seed=1).load_state_dict(state)
    with pytest.raises(ConfigError, match="different data mixture"):
        mix("a.jsonl:1,b.jsonl:1", case21, seed=2).load_state_dict(state)


def test_max_examples_takes_a_seeded_subset(two_sources):
    t = two_sources
    spec = f"{t.a}:1,{t.b}:3"
    m = mix(spec, t.base, seed=5, max_examples=40)
    subset = {(r.source, r.line) for s in m.sources for r in s.records}
    assert len(subset) == 40 == m.epoch_size
    assert {(r.source, r.line) for r in m.iter_epoch()} == subset  # the epoch is exactly the subset
    again = mix(spec, t.base, seed=5, max_examples=40)
    assert {(r.source, r.line) for s in again.sources for r in s.records} == subset
    other = mix(spec, t.base, seed=6, max_examples=40)
    assert {(r.source, r.line) for s in other.sources for r in s.records} != subset
    counts = Counter(Path(src).name for src, _ in subset)
    assert counts[Path(t.b).name] > counts[Path(t.a).name]  # drawn by weight


def test_bad_records_fail_or_are_skipped_and_reported():
    with pytest.raises(ConfigError, match="bad.jsonl:2: alpaca record has no field 'output'") as e:
        Mixture.from_spec(str(FIXTURES / "bad.jsonl"))
    assert str(e.value).endswith("(codechat sft --skip-bad, codechat distill --skip-bad and codechat data inspect "
                                 "--skip-bad skip and count such records)")  # the commands that have the flag
    m = Mixture.from_spec(str(FIXTURES / "bad.jsonl"), SFTConfig(skip_bad=True))
    assert m.report()[0]["records"] == 2 and m.report()[0]["skipped"] == 3


def test_hf_sources_go_through_datasets(monkeypatch):
    calls = []

    def load_dataset(path, config=None, split=None, streaming=None):
        calls.append((path, config, split, streaming))
        return [{"question": "1+1?", "answer": "2"}, {"question": "2+2?", "answer": "4"}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    m = Mixture.from_spec("hf:openai/gsm8k:main@test:2")
    assert calls == [("openai/gsm8k", "main", "test", False)]  # SFT reads the whole split (cached by datasets)
    rec = next(m)
    assert rec.source == "hf:openai/gsm8k:main@test" and rec.format == "qa" and rec.line in (1, 2)
    Mixture.from_spec("hf:org/ds")
    assert calls[-1] == ("org/ds", None, "train", False)
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    with pytest.raises(ConfigError, match=r"needs the `datasets` package, which is not installed: "
                                          r"pip install 'codechat\[data\]'"):
        Mixture.from_spec("hf:org/ds")


def test_from_config_decontaminates_and_counts(mbpp_data):
    d = mbpp_data
    cfg = SFTConfig(data=f"{d.full}:1", decontam_mbpp=str(d.full), seed=0)
    m = Mixture.from_config(cfg)
    [row] = m.report()
    assert row["excluded"] == m.decontaminator.report()["excluded"] and row["excluded"] >= d.n_test  # the test split
    assert row["records"] + row["excluded"] == d.n
    assert m.decontaminator.report()["by_benchmark"]["MBPP"] >= d.n_test


def test_realised_proportions_are_not_reported_as_zeros_before_any_draw(case21):
    m = mix("a.jsonl:0.5,b.jsonl:1.5", case21, seed=0)
    assert [set(r) & {"drawn", "share"} for r in m.report(realised=False)] == [set(), set()]
    line = m.format_report(realised=False).splitlines()[0]
    assert line == "a.jsonl: weight 0.5, target 0.250 (3 records; 0 skipped, 0 excluded)"
    draws(m, 100)
    assert sum(r["drawn"] for r in m.report()) == 100 and "realised" in m.format_report()


def test_an_mbpp_source_keeps_only_its_train_and_prompt_tasks(mbpp_data, tmp_path, caplog):
    d = mbpp_data
    mbpp = d.full
    rows = [json.loads(line) for line in mbpp.read_text().splitlines()]
    task11 = rows[d.test_line]  # a test task, copied into a chat-format source
    assert mbpp_split(task11["task_id"]) == "test"
    chat = tmp_path / "chat.jsonl"
    chat.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": u}, {"role": "assistant",
                                                                                        "content": a}]})
                              for u, a in [(task11["text"], task11["code"]), ("Say hi.", "hi")]) + "\n")
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING, logger="codechat"):
        warnings.simplefilter("always")
        m = Mixture.from_config(SFTConfig(data=f"{mbpp},{chat}", seed=0))
    assert not [w for w in caught if "MBPP" in str(w.message)]
    assert not [r for r in caplog.records if "MBPP" in r.message]  # no "does not check MBPP"
    kept = {int(r.task_id) for r in m.sources[0].records}
    assert {r["task_id"] for r in rows if mbpp_split(r["task_id"]) == "prompt"} <= kept
    assert {mbpp_split(t) for t in kept} == {"prompt", "train"}
    rep = m.decontaminator.report()
    assert rep["by_rule"]["task_id"] == d.n_held_out  # every test and validation task, by its identity
    assert m.sources[0].excluded == d.n - len(kept) >= d.n_held_out  # (plus train near-duplicates of held-out tasks)
    assert [r.conversation.messages[0].content for r in m.sources[1].records] == ["Say hi."]
    assert m.sources[1].excluded == 1 and rep["excluded"] == m.sources[0].excluded + 1
    assert f"held-out MBPP tasks by task_id {d.n_held_out}," in m.decontaminator.format_report()
    s = Mixture.from_config(SFTConfig(data=str(d.sanitized), seed=0))
    assert {mbpp_split(int(r.task_id)) for r in s.sources[0].records} == {"prompt", "train"}
    assert s.decontaminator.report()["by_rule"]["task_id"] == d.n_sanitized_held_out


def test_an_mbpp_fixture_source_excludes_a_train_copy_of_a_test_task():
    """Exactly which fixture tasks survive: train task 604 copies test task 12's code, so n-gram overlap drops it."""
    m = Mixture.from_config(SFTConfig(data=str(CASES_B / "mbpp/mbpp.jsonl"), seed=0))
    assert sorted(int(r.task_id) for r in m.sources[0].records) == [2, 3, 4, 601, 602, 603]
    rep = m.decontaminator.report()
    assert rep["by_rule"] == {"task_id": 4, "ngram": 1} and rep["by_benchmark"] == {"MBPP": 5}
    assert [(e["line"], e["problem"], e["part"]) for e in rep["examples"] if e["part"] != "task_id"] == \
        [(11, "MBPP/12", "solution")]


def test_missing_sources_are_named_without_reading_records(case21):
    assert missing_sources("a.jsonl,hf:org/ds,b.jsonl:0", case21) == []
    assert missing_sources("a.jsonl,nope.jsonl:0,mine:/no/dir", case21) == [
        "data source '" + str(case21 / "nope.jsonl") + "' does not exist (--data); fix the path or remove it from "
        "the spec", "data source 'mine:/no/dir' (--data): directory '/no/dir' does not exist; fix the path"]
