"""A row is parsed once from its name, and knows what it evaluates: encoding, window, sinks, its trained model."""

from pathlib import Path

import pytest

from posenc_bench.bench.rows import Row, select_rows, variant_name
from posenc_bench.errors import ConfigError, UnknownEncodingError


@pytest.mark.parametrize("name,encoding,window", [
    ("rope", "rope", None),
    ("rope+sw64", "rope", 64),
    ("rope+rand", "rope+rand", None),  # a '+' inside a registered name
    ("rope+rand+sw64", "rope+rand", 64),
    ("learned+rand+sw8", "learned+rand", 8),
    ("rope-linear+sw16", "rope-linear", 16),
    ("rope+sink4+sw64", "rope+sink4+sw64", None),  # sinks zero-shot on the model trained without a window
    ("rope+sw64+sink4", "rope+sink4", 64),  # sinks added to the model trained with that window
    ("rope+sink4", "rope+sink4", None),  # the trained window comes from the config (RunConfig.rows)
    ("xpos+bca", "xpos+bca", None),
])
def test_a_name_parses_into_encoding_and_window_and_back(name, encoding, window):
    row = Row.parse(name)
    assert (row.encoding, row.window) == (encoding, window)
    assert row.name == str(row) == name
    assert Row.parse(row.name) is row  # parsed once: the same value again


def test_what_a_row_evaluates():
    rope, yarn, ft = Row.parse("rope+sw64"), Row.parse("rope-yarn+sw64"), Row.parse("rope-linear-ft")
    assert not rope.eval_only and not rope.finetuned and rope.trained == rope == rope.model
    assert yarn.eval_only and yarn.trained == rope and yarn.model == rope
    assert ft.finetuned and not ft.eval_only and ft.trained == Row("rope") and ft.model == ft  # its own checkpoint
    sinks = Row.parse("rope+sw64+sink4")
    assert sinks.sinks == (4, None) and sinks.eval_only and sinks.model == rope
    assert Row.parse("rope+sink4+sw60").sinks == (4, 60) and Row.parse("rope+sink4+sw60").trained == Row("rope")
    assert Row.parse("xpos+bca").trained == Row("xpos") and Row.parse("alibi").sinks is None


@pytest.mark.parametrize("bad,error,match", [
    ("rope+w64", ConfigError, r"bad encoding row 'rope\+w64': expected <encoding>, <encoding>\+sw<W>"),
    ("rope+sw0", ConfigError, "bad encoding row"),
    ("rope+bca", ConfigError, "bad encoding row 'rope\\+bca'"),  # a known encoding, an unknown suffix
    ("rope+swx", ConfigError, "bad encoding row"),
    ("ropey+sw4", UnknownEncodingError, "unknown encoding 'ropey'; valid encodings: sinusoidal, learned"),
    ("rotary", UnknownEncodingError, "valid encodings"),
    ("learned+sink4+sw60", ConfigError, "attention sinks cannot wrap 'learned'"),
])
def test_bad_names_are_refused_with_the_grammar_or_the_valid_encodings(bad, error, match):
    with pytest.raises(error, match=match):
        Row.parse(bad)


def test_zero_shot_variants_of_a_trained_row():
    rope = Row.parse("rope+sw64")
    assert rope.variant("yarn") == Row("rope-yarn", 64) and rope.variant("rerope").name == "rope-rerope+sw64"
    assert Row("rope").variant("sink4+sw124") == Row("rope+sink4+sw124")
    assert variant_name("alibi", "yarn") == "alibi-yarn" and variant_name("rope", "sink4+sw60") == "rope+sink4+sw60"
    assert [Row.parse(n).suffix for n in ("rope-yarn+sw64", "rope+sink4+sw124", "rope+sw64+sink4", "xpos+bca",
                                          "rope-linear-ft", "rope", "rope+rand")] == [
        "yarn", "sink4+sw124", "sink4", "bca", "linear-ft", "", ""]  # the inverse of variant, on the trained row
    assert Row("rope").with_sinks(4, 124) == Row("rope+sink4+sw124") and rope.with_sinks(2).name == "rope+sw64+sink2"
    with pytest.raises(ConfigError, match="no registered encoding 'alibi-yarn' evaluates the trained 'alibi' model"):
        Row("alibi").variant("yarn")
    with pytest.raises(ConfigError, match="'rope-linear-ft' evaluates"):  # fine-tuned rows are not zero-shot
        Row("rope").variant("linear-ft")


def test_a_rows_tuning_grid_holds_its_configured_options_and_needs_two_points():
    """Row.grid: the class's grid, authors' values first; a configured option is dropped from every point and equal
    points merge; fewer than two points left is no grid (a trained row, YaRN at 1x, ReRoPE with its window set)."""
    yarn = Row("rope-yarn")
    grid = yarn.grid(512, 2048, {})
    assert grid[:2] == [{"beta_fast": 32.0, "beta_slow": 1.0}, {"beta_fast": 128.0, "beta_slow": 2.0}] and len(grid) == 6
    assert yarn.grid(512, 512, {}) == []  # 1x: nothing scales
    assert yarn.grid(512, 2048, {"beta_fast": 32.0}) == [{"beta_slow": 1.0}, {"beta_slow": 2.0}]  # six points, two left
    rerope = Row("rope-rerope")
    assert [p["window"] for p in rerope.grid(512, 1024, {})] == [64, 128, 256, 384]  # L/8 (the author's) first
    assert rerope.grid(512, 1024, {"window": 64}) == [] and Row("rope").grid(512, 1024, {}) == []


def test_rope_row_names_the_rope_models_zero_shot_rows():
    from posenc_bench.bench.rows import rope_row

    assert rope_row("yarn") == Row("rope-yarn") and rope_row("sink4+sw124") == Row("rope+sink4+sw124")
    assert rope_row("ft") is None and rope_row("nonsense") is None


def test_select_rows_replaces_removes_and_lists_the_valid_names():
    base = ["sinusoidal", "rope", "alibi", "nope"]
    assert select_rows("rope,alibi", base) == ["rope", "alibi"]
    assert select_rows("-sinusoidal,-nope", base) == ["rope", "alibi"]
    assert select_rows("rope+sw16,-rope", base) == []  # '-rope' takes its windowed rows too
    assert "rope-yarn" in select_rows("all", base)
    every = ["rope", "rope+sw16", "hf:smollm2"]
    assert select_rows("-rope", every, every) == ["hf:smollm2"]
    with pytest.raises(ConfigError, match="row 'alibi' is not in the results; rows: rope, rope"):
        select_rows("alibi", every, every)
    with pytest.raises(UnknownEncodingError):
        select_rows("rotary", base)


# ---- no other module reads a row's name ---------------------------------------------------------------------

PACKAGE = Path(__file__).resolve().parents[2] / "posenc_bench"
# the homes of the row grammar: Row, and the attention-sink name pattern it asks (registered by encodings/)
ROW_HOMES = {"bench/rows.py", "encodings/sinks.py"}
_PARSING_METHODS = {"split", "rsplit", "partition", "rpartition", "removeprefix", "removesuffix", "startswith",
                    "endswith", "index", "find", "rfind", "replace"}
_GRAMMAR_PIECES = ("+", "-ft")  # in any argument
_GRAMMAR_WORDS = ("sw", "sink")  # as a whole argument


def _row_tokens() -> set[str]:
    from posenc_bench import encodings

    return {t for n in encodings.available() for t in (n, f"{n}-", f"{n}+")}


def row_name_parsing(source: str, tokens: set[str]) -> list[str]:
    """Where ``source`` reads a row's name itself: a string method called with a piece of the row grammar
    ('+', '-ft', 'sw', 'sink', an encoding's name as a prefix: 'rope-') or the sink pattern's parser."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _PARSING_METHODS:
            for arg in node.args:
                values = arg.elts if isinstance(arg, ast.Tuple) else [arg]
                for v in values:
                    if isinstance(v, ast.Constant) and isinstance(v.value, str) and (
                            v.value in tokens or v.value in _GRAMMAR_WORDS or any(g in v.value for g in _GRAMMAR_PIECES)):
                        found.append(f"line {node.lineno}: .{node.func.attr}({v.value!r})")
        if isinstance(node, ast.Attribute) and node.attr == "parse" and isinstance(node.value, ast.Name) \
                and node.value.id in ("sinks", "sink_rows"):
            found.append(f"line {node.lineno}: {node.value.id}.parse")
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("encodings.sinks") \
                and any(a.name == "parse" for a in node.names):
            found.append(f"line {node.lineno}: imports encodings.sinks.parse")
    return found


def test_no_module_but_rows_parses_a_row_name():
    """A row's meaning comes from ``Row`` (bench/rows.py), never from reading its name again: no other module
    splits a name on '+', strips 'rope-', looks for '+sw', '+rand' or '-ft', or asks the sink pattern."""
    tokens = _row_tokens()
    bad = [f"{path.relative_to(PACKAGE)} {hit}" for path in sorted(PACKAGE.rglob("*.py"))
           if str(path.relative_to(PACKAGE)) not in ROW_HOMES
           for hit in row_name_parsing(path.read_text(), tokens)]
    assert not bad, "ask bench/rows.Row instead:\n" + "\n".join(bad)


def test_the_row_name_guard_sees_what_it_must():
    tokens = _row_tokens()
    for parsing in ['row.split("+", 1)[0]', 'name.rpartition("+")', 'n.removeprefix("rope-")', 'e.endswith("-ft")',
                    'sinks.parse(name)', 'from posenc_bench.encodings.sinks import parse', 'r.startswith("rope")',
                    'tail.startswith(("sw", "x"))']:
        assert row_name_parsing(parsing, tokens), parsing
    for fine in ['value.split(",")', 'spec.partition(":")', 'name.startswith("hf:")', 'Row.parse(name).encoding',
                 'key.removeprefix("config.")']:
        assert not row_name_parsing(fine, tokens), fine
