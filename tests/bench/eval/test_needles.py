"""Multi-needle retrieval: prompts (exact length, needles at their depths, distinct keys, none in the haystack),
one prefill per haystack giving the answers of the whole prompt, scoring, effective length, heat maps."""

import itertools
import json
import random
import re

import pytest
import torch

from posenc_bench.bench.eval import needles
from posenc_bench.bench.eval.needles import HaystackText, Sweep, build_trial
from posenc_bench.bench.records import measured_needles, needle_record, not_measured
from posenc_bench.env import cpu_name, git_commit, versions
from posenc_bench.errors import ConfigError, PositionOutOfRange

PLACES, DEEDS = ("the harbor town", "the capital", "the old mill", "the county seat", "the river valley"), (
    "met on a Tuesday", "read the long report aloud", "argued until noon", "voted to adjourn", "waited for news")
PROSE = HaystackText([f" The {who} of {where} {deed}{end}" for who in ("committee", "council", "clerk", "mayor")
                      for where in PLACES for deed in DEEDS for end in (".",) if (len(who) + len(deed)) % 3]
                     + [" Nobody expected the vote to pass so quickly!", " What would the senators say next?"])
NEEDLE_RE = re.compile(r"One of the special magic numbers for ([a-z]+-[a-z]+) is: (\d{7})\.")


def measured(row: dict) -> dict:
    """A row without its records' wall times, which differ from run to run."""
    return {**row, "records": [{k: v for k, v in r.items() if k != "length_time_s"} for r in row["records"]]}


class NeedleOracle:
    """Bytes in, and the right next answer character out when the needles it needs are within its last
    ``sight`` tokens (else '0'); a KV cache of its own when ``cache`` (prefill keeps the haystack's tokens)."""

    name = "oracle"
    train_len = 256
    device = torch.device("cpu")

    def __init__(self, sight=10**9, max_len=10**9, cache=True, colon=False):
        self.sight, self.max_len, self.cache, self.held, self.colon = sight, max_len, cache, None, colon
        self.calls = []

    def encode(self, text):
        return list(text.encode())

    def prefix(self):
        return [256]

    def set_length(self, length):
        if length > self.max_len:
            raise PositionOutOfRange(f"table has {self.max_len} rows")

    def _next(self, ids, i):
        seen = bytes(t for t in ids[max(0, i + 1 - self.sight) : i + 1] if t < 256).decode()
        q = seen.rfind("\nWhat are all the special magic numbers for ")
        prefix = seen.rfind("mentioned in the provided text are")
        if q < 0 or prefix < q:
            return ord("0")
        asked = re.match(r"\nWhat are all the special magic numbers for (.+?) mentioned", seen[q:]).group(1)
        keys = re.split(r", and |, ", asked)
        found = NEEDLE_RE.findall(seen[:q])
        values = [v for k in keys for key, v in found if key == k]
        expected = " " + ", ".join(values)
        done = seen[prefix + len("mentioned in the provided text are"):]
        if self.colon and done == "":
            return ord(":")  # "are: 1234567", as SmolLM2 often writes it
        return ord(expected[len(done)]) if expected.startswith(done) and len(done) < len(expected) else ord("0")

    def logits(self, ids, last=None):
        ids = ids[0].tolist()
        self.calls.append(("logits", len(ids)))
        rows = range(len(ids) - (last or len(ids)), len(ids))
        out = torch.zeros(len(rows), 257)
        for r, i in enumerate(rows):
            out[r, self._next(ids, i)] = 1.0
        return out

    def can_cache(self):
        return self.cache

    def prefill(self, ids):
        self.calls.append(("prefill", ids.shape[1]))
        self.held = ids[0].tolist()

    def extend(self, ids):
        self.calls.append(("extend", ids.shape[1]))
        full = torch.tensor(self.held + ids[0].tolist())[None]
        return self.logits(full, last=ids.shape[1])


@pytest.mark.parametrize("variant", list(needles.VARIANTS))
def test_prompts_are_the_length_with_needles_at_their_depths_distinct_and_not_in_the_haystack(variant):
    lm, depths = NeedleOracle(), [0.0, 0.3, 0.7, 1.0]
    trial = build_trial(lm, PROSE, variant, 1500, depths, random.Random(3))
    sizes = [len(trial.prompt(q)) for q in range(len(trial.questions))]
    assert max(sizes) == 1500 and len(trial.questions) == (4 if variant == "multikey" else 1)
    text = bytes(t for t in trial.context if t < 256).decode()
    assert trial.context[0] == 256 and text.startswith(needles.INTRO)
    found = NEEDLE_RE.findall(text)
    assert found == [(n.key, n.value) for n in trial.needles] and [n.depth for n in trial.needles] == depths
    head = 1 + len(needles.INTRO)
    needle_bytes = sum(len(needles.NEEDLE.format(key=n.key, value=n.value)) for n in trial.needles)
    room = len(trial.context) - head - needle_bytes
    longest = max(len(s) for s in PROSE.sentences)
    sizes = [len(needles.NEEDLE.format(key=m.key, value=m.value)) for m in trial.needles]
    for n, before in zip(trial.needles, [0, *itertools.accumulate(sizes)]):
        assert bytes(trial.context[n.at : n.at + 20]).decode() == " One of the special "
        haystack_before = n.at - head - before  # haystack tokens before this needle: the nearest sentence end
        assert abs(haystack_before - n.depth * room) <= longest / 2 + 1
        assert text[n.at - 1 - 1] in ".!?\n" or haystack_before in (0, room)  # between sentences
    keys, values = [n.key for n in trial.needles], [n.value for n in trial.needles]
    assert len(set(values)) == 4 and len(set(keys)) == (1 if variant == "multivalue" else 4)
    assert not any(s in trial.haystack for s in keys + values)
    asked = bytes(trial.questions[0].ids).decode()
    if variant == "multiquery":  # every key asked in one question, in a shuffled order, values in that order
        order = re.search(r"numbers for (.+?) mentioned", asked).group(1).split(", ")
        assert sorted(k.removeprefix("and ") for k in order) == sorted(keys)
    assert asked.endswith(" " + ", ".join(trial.needles[i].value for i, _, _ in trial.questions[0].answers))
    # scored: each value's own tokens, not the space token before it
    assert all(bytes(q.ids[a:b]).decode() == trial.needles[i].value for q in trial.questions for i, a, b in q.answers)


def test_a_key_that_occurs_in_the_haystack_is_drawn_again():
    lm = NeedleOracle()
    first = build_trial(lm, PROSE, "multivalue", 700, [0.0, 1.0], random.Random(7)).needles[0].key
    clash = HaystackText([f"{s[:-1]}, said the {first}." for s in PROSE.sentences])  # as many: the same draws
    trial = build_trial(lm, clash, "multivalue", 700, [0.0, 1.0], random.Random(7))
    assert first in trial.haystack and trial.needles[0].key != first and trial.needles[0].key not in trial.haystack
    with pytest.raises(ConfigError, match="needle length 300 is too short for 2 needles"):
        build_trial(lm, PROSE, "multikey", 300, [0.0, 1.0], random.Random(0))


def test_a_copying_oracle_gets_every_needle_and_one_that_sees_a_window_misses_the_far_ones():
    sweep = Sweep(PROSE, [600, 1200], depths=[0.0, 0.5, 1.0], trials=2)

    def row(lm):
        return needles.needle_sweep(lm, sweep, log=lambda s: None)["rows"][0]

    full = row(NeedleOracle())
    assert {r["accuracy"] for r in full["records"]} == {1.0} and full["effective_length"] == 1200
    assert all(r["needles"] == 2 and len(r["tried"]) == 2 for r in full["records"])
    near = row(NeedleOracle(sight=700))
    acc = {(r["variant"], r["length"], r["depth"]): r["accuracy"] for r in near["records"]}
    assert all(acc[v, 600, d] == 1.0 for v in needles.VARIANTS for d in (0.0, 0.5, 1.0))
    assert acc["multikey", 1200, 0.0] == 0.0 and acc["multikey", 1200, 1.0] == 1.0
    assert near["effective_length"] == 600 and near["effective_by_variant"]["multikey"] == 600
    assert measured(row(NeedleOracle(sight=700))) == measured(near)  # the same haystacks every time
    assert {r["device"] for r in near["records"]} == {"cpu:" + cpu_name(threads=torch.get_num_threads())}
    assert {r["git_commit"] for r in near["records"]} == {git_commit()} and near["records"][0]["versions"] == versions()
    assert len({r["length_time_s"] for r in near["records"] if r["length"] == 600}) == 1  # the length's wall time
    cut = row(NeedleOracle(max_len=1000))
    assert {r["status"] for r in cut["records"] if r["length"] == 1200} == {"n/a"} and cut["effective_length"] == 600


class StoppedAt(NeedleOracle):
    """The oracle, stopped (as a machine that goes down) when it is first set to ``stop`` tokens."""

    def __init__(self, stop=None, **kw):
        super().__init__(**kw)
        self.stop, self.lengths = stop, []

    def set_length(self, length):
        self.lengths.append(length)
        if length == self.stop:
            raise KeyboardInterrupt
        super().set_length(length)


def test_a_row_stopped_part_way_resumes_at_its_next_length(tmp_path):
    """Each finished length of a row is kept in needles.partial.json (under a hash of the test): a rerun after a
    stop measures only the lengths left, to the row of a run never stopped, and the file goes once the row is
    whole; another test (other depths) never takes them."""
    sweep = Sweep(PROSE, [600, 900, 1200], depths=[0.0, 1.0])
    whole = needles.needle_sweep(NeedleOracle(sight=700), sweep, log=lambda s: None)
    stopped = StoppedAt(1200, sight=700)
    with pytest.raises(KeyboardInterrupt):
        needles.needle_sweep(stopped, sweep, log=lambda s: None, folder=tmp_path)
    kept = json.loads((tmp_path / needles.PARTIAL).read_text())["oracle"]["records"]
    assert sorted(kept) == ["600", "900"] and stopped.lengths == [600, 900, 1200]
    other = StoppedAt(None, sight=700)
    needles.needle_sweep(other, Sweep(PROSE, [600, 900, 1200], depths=[0.0, 0.5]), log=lambda s: None, folder=tmp_path)
    assert other.lengths == [600, 900, 1200]  # another test: nothing taken (and its own entry replaced the row's)
    with pytest.raises(KeyboardInterrupt):  # stopped again, from the start
        needles.needle_sweep(StoppedAt(1200, sight=700), sweep, log=lambda s: None, folder=tmp_path)
    resumed, log = StoppedAt(None, sight=700), []
    result = needles.needle_sweep(resumed, sweep, log=log.append, folder=tmp_path)
    assert resumed.lengths == [1200] and "  oracle L=600: done before, kept" in log
    assert [measured(r) for r in result["rows"]] == [measured(r) for r in whole["rows"]]
    assert not (tmp_path / needles.PARTIAL).exists()


def test_one_prefill_per_haystack_and_the_whole_prompt_per_question_without_a_cache():
    lm = NeedleOracle()
    trial = build_trial(lm, PROSE, "multikey", 900, [0.0, 0.5, 1.0], random.Random(1))
    with_cache = needles.answer(lm, trial)
    assert [c[0] for c in lm.calls] == ["prefill", "extend", "logits", "extend", "logits", "extend", "logits"]
    assert lm.calls[0] == ("prefill", len(trial.context))
    lm.calls.clear()
    assert needles.answer(NeedleOracle(cache=False), trial) == with_cache == needles.answer(lm, trial, use_cache=False)
    assert needles.retrieved(trial, with_cache) == [True, True, True]
    colon = NeedleOracle(colon=True)  # ": 1234567" rather than " 1234567": the value is still right
    assert needles.retrieved(trial, needles.answer(colon, trial)) == [True, True, True]


def test_cached_and_uncached_answers_agree_on_a_hugging_face_model(llama_dir):
    from posenc_bench.bench.eval.passkey import load_lm

    lm = load_lm(f"hf:{llama_dir}")
    # every fix through our attention caches its keys unrotated (a window of sinks too: sw100 < 512 tokens)
    for scaling in (None, "yarn", "dynamic", "rerope", "leaky", "selfextend", "ntk", "string", "sink2+sw100"):
        row = lm.with_scaling(scaling)
        row.set_length(512)
        for variant in ("multikey", "multiquery") if scaling is None else ("multikey",):
            trial = build_trial(row, PROSE, variant, 512, [0.0, 1.0], random.Random(0))
            whole = needles.answer(row, trial, use_cache=False)
            assert needles.cached(row) == (scaling != "dynamic")  # dynamic NTK: its frequencies follow the forward
            if needles.cached(row):
                assert needles.answer(row, trial, use_cache=True) == whole
                row.prefill(torch.tensor(trial.context)[None])
                q = trial.questions[-1].ids[:-1]
                got = row.extend(torch.tensor(q)[None])
                full = row.logits(torch.tensor(trial.context + q)[None], last=len(q))
                assert torch.allclose(got, full, atol=1e-4)
                assert torch.equal(row.extend(torch.tensor(q)[None]), got)  # the cache was cropped back
        row.release()
    assert lm.hf.model.config._attn_implementation != "posenc"  # the fix's attention was put back


def test_effective_length_is_rulers_on_hand_made_records():
    def rec(variant, L, correct, needles_=4, status="ok"):
        r = needle_record(variant, L, 256, 0.5)
        if status != "ok":
            return not_measured(r, status, "no")
        return measured_needles(r, [{"right": i < correct} for i in range(needles_)])

    records = [rec("multikey", 256, 4), rec("multivalue", 256, 3),  # (1 + 0.75) / 2 = 0.875: above 85.6%
               rec("multikey", 512, 3), rec("multivalue", 512, 3),  # 0.75: below
               rec("multikey", 1024, 4), rec("multivalue", 1024, 4)]  # above again, but a shorter one failed
    assert needles.accuracy_by_length(records) == {256: 0.875, 512: 0.75, 1024: 1.0}
    assert needles.effective_length(records) == 256 and needles.RULER_THRESHOLD == 0.856
    assert needles.effective_length(records, threshold=0.7) == 1024
    assert needles.effective_length(records, threshold=0.9) is None
    assert needles.effective_length(records[:2] + [rec("multikey", 512, 0, status="n/a")], 0.5) == 256
    # the other bar: the model's own accuracy at its train length (256 here), which each scaling must keep
    own = [rec("multikey", 256, 2), rec("multikey", 512, 1)]  # 0.5 at 1x, 0.25 at 2x
    yarn = [rec("multikey", 256, 2), rec("multikey", 512, 3)]  # 0.5, then 0.75: keeps it
    result = {"train_len": 256, "variants": ["multikey"], "rows": [{"row": "m", "records": own},
                                                                   {"row": "m+yarn", "records": yarn}]}
    needles.summarize(result, needles.OWN)
    assert result["threshold"] == 0.5 and result["threshold_rule"] == "1x: m at 256 tokens"
    assert [r["effective_length"] for r in result["rows"]] == [256, 512]
    assert needles.summarize(result)["rows"][1]["effective_length"] is None and result["threshold"] == 0.856
    result["train_len"] = 128
    with pytest.raises(ConfigError, match="--threshold 1x needs the model's own row measured at its train length 128"):
        needles.summarize(result, needles.OWN)


def test_records_come_from_the_record_builder_and_bad_settings_are_clear_errors():
    rec = measured_needles(needle_record("multikey", 512, 256, 0.25), [{"right": True}, {"right": False}])
    assert list(rec)[:9] == ["variant", "length", "ratio", "depth", "status", "reason", "needles", "correct", "accuracy"]
    assert rec["ratio"] == 2.0 and rec["accuracy"] == 0.5
    with pytest.raises(ConfigError, match="valid: multikey, multivalue, multiquery"):
        Sweep(PROSE, [512], variants=["multikeys"])
    with pytest.raises(ConfigError, match="depth 1.5 is outside"):
        Sweep(PROSE, [512], depths=[0, 1.5])
    with pytest.raises(ConfigError, match="--threshold 85.6: a share"):
        Sweep(PROSE, [512], threshold=85.6)


def test_heat_maps_and_the_table(tmp_path):
    from posenc_bench.analysis.plots import plot_needle_heatmaps

    sweep = Sweep(PROSE, [600, 1200], variants=["multikey", "multivalue"], depths=[0.0, 1.0])
    lm = NeedleOracle(sight=700, max_len=1000)
    wide = NeedleOracle(sight=700)  # a "scaling" that reaches 1200 tokens
    wide.name = "oracle+wide"
    lm.with_scaling = lambda s: wide
    result = needles.needle_sweep(lm, sweep, ["wide"], log=lambda s: None)
    assert [r["effective_length"] for r in result["rows"]] == [600, 600]
    paths = plot_needle_heatmaps(result, tmp_path)
    assert [p.name for p in paths] == ["needles-oracle.png", "needles-oracle+wide.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)
    table = needles.markdown(result)
    assert re.search(r"\| oracle +\| 100.0% +\| n/a +\| 600 \(2.34375x\) +\|", table)
    assert re.search(r"\| oracle\+wide +\| 100.0% +\| 25.0% +\| 600 \(2.34375x\) +\|", table)
    assert re.search(r"\| multikey +\| 0 +\| 1/1 +\| n/a +\|", table)


def test_the_summary_names_every_commit_and_device_with_its_rows():
    """A folder made in sittings: rows (or a row's lengths) from other commits or machines are each named with
    their rows, as a results table's caption does; records from before the fields existed add nothing."""
    def rec(commit, device, torch_version="2.13.0+cpu"):
        return {**needle_record("multikey", 600, 256, 0.0), "git_commit": commit, "device": device,
                "versions": {"torch": torch_version, "transformers": "5.25.0"}}

    rows = [{"row": "m", "records": [rec("a" * 40, "cpu:A")]},
            {"row": "m+yarn", "records": [rec("a" * 40, "cpu:A"), rec("b" * 40 + "-dirty", "cpu:B")]}]
    assert needles.made(rows) == (f"; commits {'a' * 12} (m, m+yarn); {'b' * 12}-dirty (m+yarn); devices cpu:A "
                                  "(m, m+yarn); cpu:B (m+yarn); with torch 2.13.0+cpu, transformers 5.25.0")
    assert needles.made(rows[:1]) == f"; commit {'a' * 12}; device cpu:A; with torch 2.13.0+cpu, transformers 5.25.0"
    assert needles.made([{"row": "m", "records": [needle_record("multikey", 600, 256, 0.0)]}]) == ""
