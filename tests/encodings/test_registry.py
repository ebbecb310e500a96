"""Shared tests over every registered encoding: shapes, causality, running past the train length, shared
initialisation, gradients, the checkpoint round trip, family and paper."""

import pytest
import torch

from posenc_bench import encodings
from posenc_bench.errors import ConfigError, PositionOutOfRange, UnknownEncodingError
from posenc_bench.model.transformer import DecoderLM

NAMES = encodings.available()
TRAIN_LEN = 16


def test_registry_has_the_interface_names():
    assert set(NAMES) >= {"sinusoidal", "learned", "t5", "rope", "rope-linear", "alibi", "nope"}


def test_unknown_encoding_names_the_value_and_the_valid_ones():
    with pytest.raises(UnknownEncodingError) as e:
        encodings.get_class("rotary")
    msg = str(e.value)
    assert "'rotary'" in msg
    for name in NAMES:
        assert name in msg


# Every row's family, grouped: what family() gave before it read the classes only (it also guessed from module
# names and hooks then); a sink row's class is generated from its name.
FAMILY_ROWS = {
    "classic absolute": ["sinusoidal", "learned", "sinusoidal+ssmax", "learned+ssmax"],
    "rotary": ["rope", "rope-partial", "xpos", "xpos+bca", "rnope-swa", "fope", "rope+ssmax", "rope-partial+ssmax",
               "xpos+ssmax"],
    "rotary scaling (zero-shot)": ["rope-linear", "rope-ntk", "rope-dynamic", "rope-yarn", "rope-llama3"],
    "rotary scaling (fine-tuned)": ["rope-ft", "rope-linear-ft", "rope-ntk-ft", "rope-dynamic-ft", "rope-yarn-ft",
                                    "rope-llama3-ft"],
    "rotary fix (zero-shot)": ["rope-rerope", "rope-leaky", "rope-selfextend", "rope-string"],
    "relative bias": ["t5", "alibi", "kerple", "kerple-power", "fire", "dape-kerple", "dape-alibi"],
    "contextual": ["cope", "fox", "path", "stickbreaking"],
    "none": ["nope", "nope+ssmax"],
    "randomized positions": ["sinusoidal+rand", "learned+rand", "rope+rand", "rope-partial+rand", "xpos+rand",
                             "alibi+rand", "kerple+rand", "kerple-power+rand", "fire+rand"],
    "attention sinks (zero-shot)": ["rope+sink4+sw64", "alibi+sink2", "rope+rand+sink4+sw64"],
}


def test_every_encoding_names_its_family_and_paper():
    for name in NAMES:
        cls = encodings.get_class(name)
        assert encodings.family(cls) == cls.family and cls.family in encodings.FAMILIES, (name, cls.family)
        assert cls.paper and any(ch.isdigit() for ch in cls.paper), name  # authors and a year


def test_the_family_is_what_each_class_declares_and_every_row_has_one():
    rows = {name: family for family, names in FAMILY_ROWS.items() for name in names}
    assert set(rows) == set(NAMES) | {"rope+sink4+sw64", "alibi+sink2", "rope+rand+sink4+sw64"}
    assert {name: encodings.family(encodings.get_class(name)) for name in rows} == rows
    assert set(FAMILY_ROWS) == set(encodings.FAMILIES)  # every family has rows


def test_a_class_without_a_valid_family_is_refused_naming_the_class_and_the_valid_ones():
    from posenc_bench.encodings.nope import NoPE

    class Bare(encodings.Encoding):
        pass

    class Typo(NoPE):
        family = "rotary scalings"

    for cls, value in ((Bare, "''"), (Typo, "'rotary scalings'")):
        with pytest.raises(ConfigError) as e:
            encodings.family(cls)
        message = str(e.value)
        assert cls.__name__ in message and value in message
        assert all(repr(f) in message for f in encodings.FAMILIES)


def test_trained_and_variants_select_rows_by_their_hooks():
    trained = encodings.trained()
    assert trained == [n for n in encodings.available() if encodings.get_class(n).trained_as is None]
    assert {"rope", "alibi", "rope+rand"} <= set(trained) and "rope-linear" not in trained
    assert encodings.variants("rope", family="rotary fix (zero-shot)") == ["rope-rerope", "rope-leaky", "rope-selfextend",
                                                                           "rope-string"]
    assert encodings.variants("rope", finetuned=True) == ["rope-ft", "rope-linear-ft", "rope-ntk-ft", "rope-dynamic-ft",
                                                          "rope-yarn-ft", "rope-llama3-ft"]
    assert encodings.variants("alibi") == []
    with pytest.raises(ConfigError, match="'rotary fixes'.*valid families: 'classic absolute'"):
        encodings.variants("rope", family="rotary fixes")


def test_every_encoding_has_a_summary_and_a_paper_docstring():
    for name in NAMES:
        cls = encodings.get_class(name)
        assert cls.summary
        module_doc = __import__(cls.__module__, fromlist=["_"]).__doc__
        assert module_doc and ("arXiv" in module_doc or "et al." in module_doc), name


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("window", [None, 5])
def test_shapes_and_causality(name, window, tiny_cfg):
    model = DecoderLM(tiny_cfg, name, TRAIN_LEN, window=window, seed=0).eval()
    x = torch.randint(0, 256, (2, TRAIN_LEN))
    with torch.no_grad():
        logits = model(x)
        assert logits.shape == (2, TRAIN_LEN, tiny_cfg.vocab_size)
        assert torch.isfinite(logits).all()
        # changing tokens after position 9 must not change outputs at positions <= 9
        y = x.clone()
        y[:, 10:] = torch.randint(0, 256, (2, TRAIN_LEN - 10))
        assert torch.equal(model(y)[:, :10], logits[:, :10])
        assert not torch.allclose(model(y)[:, 10:], logits[:, 10:])


@pytest.mark.parametrize("name", NAMES)
def test_past_the_train_length(name, tiny_cfg):
    """Every encoding either runs at 4x the train length or raises the named PositionOutOfRange."""
    model = DecoderLM(tiny_cfg, name, TRAIN_LEN, seed=0).eval()
    x = torch.randint(0, 256, (1, 4 * TRAIN_LEN))
    try:
        model.encoding.set_eval_length(4 * TRAIN_LEN)
    except PositionOutOfRange as e:
        assert name in ("learned", "learned+ssmax")  # learned+rand's table has M = 8 x the train length rows
        assert str(TRAIN_LEN) in str(e)
        with pytest.raises(PositionOutOfRange):
            model(x)
        return
    with torch.no_grad():
        logits = model(x)
    assert logits.shape == (1, 4 * TRAIN_LEN, tiny_cfg.vocab_size)
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("name", NAMES)
def test_shared_weights_start_identical_across_encodings(name, tiny_cfg):
    """Encodings differ only in the encoding: every shared parameter is initialised the same."""
    ref = DecoderLM(tiny_cfg, "nope", TRAIN_LEN, seed=3).state_dict()
    other = DecoderLM(tiny_cfg, name, TRAIN_LEN, seed=3).state_dict()
    for key, value in ref.items():
        assert torch.equal(other[key], value), key


@pytest.mark.parametrize("name", NAMES)
def test_encoding_parameters_receive_gradients(name, tiny_cfg):
    model = DecoderLM(tiny_cfg, name, TRAIN_LEN, seed=0)
    x = torch.randint(0, 256, (2, TRAIN_LEN + 1))
    loss = torch.nn.functional.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
    loss.backward()
    # and at positions 0 .. T-1 (what a +rand row's random sample may miss, e.g. fire's threshold L is only
    # reached by queries below it)
    torch.nn.functional.cross_entropy(model.eval()(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten()).backward()
    for pname, p in model.encoding.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"{name}.{pname} gets no gradient"


@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_round_trip_gives_the_same_logits(name, tiny_cfg, tmp_path):
    """Save through the checkpoint format, load into a fresh model of another seed: the same logits (every
    tensor a row depends on is saved with the weights, none rebuilt differently on load)."""
    from posenc_bench.bench import checkpoint

    model = DecoderLM(tiny_cfg, name, TRAIN_LEN, seed=0)
    model.train()  # one training forward: +rand's step counter moves, a -ft row would be in training mode
    model(torch.randint(0, 256, (2, TRAIN_LEN)))
    with torch.no_grad():  # trained-looking weights, not the seed's
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    meta = {"cell_key": "k", "config": {}, "encoding": name, "window": None, "seed": 0, "outcome": {"status": "ok"}}
    checkpoint.save(tmp_path, model, meta)
    fresh = checkpoint.read(tmp_path).load_into(DecoderLM(tiny_cfg, name, TRAIN_LEN, seed=7))
    x = torch.randint(0, 256, (2, TRAIN_LEN))
    model.eval(), fresh.eval()
    with torch.no_grad():
        assert torch.equal(model(x), fresh(x))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))


def test_unknown_option_is_refused():
    with pytest.raises(ConfigError, match="num_buckets"):
        encodings.build("t5", d_model=32, n_heads=4, train_len=8, options={"buckets": 8})


def test_listing_order_does_not_depend_on_import_order():
    import subprocess
    import sys

    code = ("import posenc_bench.encodings.alibi, posenc_bench.encodings.rope, posenc_bench.encodings.nope; "
            "from posenc_bench import encodings; print(','.join(encodings.available()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ",".join(NAMES) == (
        "sinusoidal,learned,rope,rope-partial,xpos,xpos+bca,fope,rnope-swa,rope-linear,rope-ntk,rope-dynamic,"
        "rope-yarn,rope-llama3,rope-ft,rope-linear-ft,rope-ntk-ft,rope-dynamic-ft,rope-yarn-ft,rope-llama3-ft,"
        "rope-rerope,rope-leaky,rope-selfextend,rope-string,t5,alibi,kerple,kerple-power,fire,dape-kerple,dape-alibi,"
        "cope,fox,path,stickbreaking,nope,sinusoidal+rand,learned+rand,rope+rand,rope-partial+rand,xpos+rand,"
        "alibi+rand,kerple+rand,kerple-power+rand,fire+rand,sinusoidal+ssmax,learned+ssmax,rope+ssmax,"
        "rope-partial+ssmax,xpos+ssmax,nope+ssmax")


def test_out_of_range_is_the_rows_own_refusal():
    """What a sweep records as n/a, asked of the row itself: a learned table has no rows past the train
    length, ``+rand`` widens it to its range M, a relative row runs at any length."""
    assert "no position 128 or later" in encodings.out_of_range("learned+ssmax", 128, 512)
    assert "no position 128 or later" in encodings.out_of_range("learned", 128, 512)
    assert encodings.out_of_range("learned", 128, 128) == ""
    assert encodings.out_of_range("learned+rand", 128, 512) == ""
    assert encodings.out_of_range("rope", 128, 512) == encodings.out_of_range("fire", 128, 4096) == ""
    with pytest.raises(UnknownEncodingError):
        encodings.out_of_range("no-such-row", 128, 512)
