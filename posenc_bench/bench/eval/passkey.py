"""Passkey retrieval: can the model fetch a number hidden at some depth of a long prompt?

The test of Mohtashami & Jaggi, "Landmark Attention: Random-Access Infinite Context Length for Transformers"
(arXiv:2305.16300), used by the position-interpolation paper (Chen et al. 2023, arXiv:2306.15595, sec. 3.3):
a random 5-digit key sits in repetitive filler text at a chosen depth, and the prompt ends with "What is the
pass key? The pass key is". A trial succeeds when greedy decoding continues with exactly the key: the model's
argmax is the key's next token at every answer position (teacher-forced, which is the same thing, since a
greedy decode that is right so far sees exactly that prefix).

Every prompt, answer included, is exactly ``length`` tokens of the model's own tokenizer, so a trial at length
L exercises positions up to L - 1. Keys and depths come from a generator seeded by (seed, length, depth,
trial): the same prompts for every model with the same tokenizer. Reported: accuracy by length and depth,
and the effective context: the largest length at which accuracy reaches ``threshold`` at every depth.
"""

from __future__ import annotations

import inspect
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Protocol, Sequence

import torch

from posenc_bench.bench.records import measured_passkey, not_measured, passkey_record
from posenc_bench.errors import ConfigError, PosencError, PositionOutOfRange
from posenc_bench.files import atomic_write_json, atomic_write_text

INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
         "I will quiz you about the important information there.\n")
FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " What is the pass key? The pass key is"
DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


class PasskeyLM(Protocol):
    """What a model needs for the test: its tokenizer and next-token logits for one sequence."""

    name: str
    train_len: int
    device: torch.device  # where its numbers are computed (a record's ``device``)

    def encode(self, text: str) -> list[int]: ...

    def prefix(self) -> list[int]: ...  # tokens every prompt starts with (BOS), maybe none

    def set_length(self, length: int) -> None: ...  # raise PositionOutOfRange if it cannot run this long

    def logits(self, ids: torch.Tensor, last: Optional[int] = None) -> torch.Tensor: ...  # (1, L) -> (L or last, V)


@dataclass
class Prompt:
    ids: list[int]  # exactly the requested length
    answer_start: int  # index of the first answer token in ids
    key: str
    depth: float
    needle_at: int  # index of the first needle token


def build_prompt(lm: PasskeyLM, length: int, depth: float, key: str) -> Prompt:
    """INTRO + filler (depth share) + NEEDLE + filler (the rest) + QUESTION + " <key>", ``length`` tokens."""
    head = lm.prefix() + lm.encode(INTRO)
    needle = lm.encode(NEEDLE.format(key=key))
    tail = lm.encode(QUESTION)
    answer = lm.encode(" " + key)
    room = length - len(head) - len(needle) - len(tail) - len(answer)
    if room < 0:
        raise ConfigError(f"passkey length {length} is too short: the prompt without filler is "
                          f"{length - room} tokens for this tokenizer")
    one = lm.encode(FILLER)
    filler = (one * (room // max(1, len(one)) + 2))[:room]
    before = round(depth * room)
    ids = head + filler[:before] + needle + filler[before:] + tail + answer
    assert len(ids) == length
    return Prompt(ids, length - len(answer), key, depth, len(head) + before)


def _key(rng: random.Random) -> str:
    return str(rng.randint(10000, 99999))


@torch.inference_mode()
def run_trial(lm: PasskeyLM, prompt: Prompt) -> bool:
    ids = torch.tensor(prompt.ids[:-1])[None]  # the last answer token is only a target
    logits = lm.logits(ids)  # (L - 1, V)
    predicted = logits[prompt.answer_start - 1 :].argmax(-1).tolist()
    return predicted == prompt.ids[prompt.answer_start :]


def passkey_sweep(lm: PasskeyLM, lengths: Sequence[int], depths: Sequence[float] = DEFAULT_DEPTHS, *,
                  trials: int = 5, seed: int = 0, threshold: float = 1.0,
                  log: Callable[[str], None] = print) -> dict:
    """Accuracy for every (length, depth); the effective context; records in the results style."""
    for d in depths:
        if not 0 <= d <= 1:
            raise ConfigError(f"passkey depth {d} is outside [0, 1] (0: right after the intro, 1: right before "
                              "the question)")
    if trials < 1:
        raise ConfigError(f"--trials must be >= 1, got {trials}")
    records = []
    for L in lengths:
        try:
            lm.set_length(L)
        except PositionOutOfRange as e:
            records += [not_measured(passkey_record(L, lm.train_len, d), "n/a", str(e)) for d in depths]
            log(f"  {lm.name} L={L}: n/a ({e})")
            continue
        for d in depths:
            rng = random.Random(f"{seed}:{L}:{d}")
            keys = [_key(rng) for _ in range(trials)]
            correct = sum(run_trial(lm, build_prompt(lm, L, d, key)) for key in keys)
            records.append(measured_passkey(passkey_record(L, lm.train_len, d), keys, correct))
        row = ", ".join(f"{r['depth']:g}: {r['correct']}/{r['trials']}" for r in records if r["length"] == L)
        log(f"  {lm.name} L={L}: {row}")
    return {"model": lm.name, "train_len": lm.train_len, "threshold": threshold, "seed": seed,
            "effective_context": effective_context(records, threshold), "records": records}


def effective_context(records: list[dict], threshold: float = 1.0) -> Optional[int]:
    """The largest length whose accuracy is at least ``threshold`` at every depth (None if no length is)."""
    good = [L for L in sorted({r["length"] for r in records})
            if all(r["status"] == "ok" and r["accuracy"] >= threshold for r in records if r["length"] == L)]
    return max(good) if good else None


def markdown(result: dict) -> str:
    from tabulate import tabulate

    recs = result["records"]
    lengths = sorted({r["length"] for r in recs})
    depths = sorted({r["depth"] for r in recs})
    T = result["train_len"]
    rows = []
    for d in depths:
        row = [f"{d:g}"]
        for L in lengths:
            r = next(r for r in recs if r["length"] == L and r["depth"] == d)
            row.append("n/a" if r["status"] != "ok" else f"{r['correct']}/{r['trials']}")
        rows.append(row)
    headers = ["depth"] + [f"{L / T:g}x ({L})" for L in lengths]
    eff = result["effective_context"]
    return (f"Passkey retrieval, {result['model']} (train length {T}): trials correct by depth and length\n\n"
            + tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True,
                       colalign=("left",) + ("right",) * len(lengths))
            + f"\n\nEffective context (accuracy >= {result['threshold']:g} at every depth): "
            + (f"{eff} tokens ({eff / T:g}x)" if eff else "none of the lengths tried") + "\n")


def write(result: dict, out: Path | str, meta: dict, *, stem: str = "passkey",
          render: Callable[[dict], str] = markdown) -> tuple[Path, Path]:
    """``<stem>.json`` (meta and result) and ``<stem>.md`` (``render(result)``) in ``out``, each atomically."""
    out = Path(out)
    js, md = out / f"{stem}.json", out / f"{stem}.md"
    atomic_write_json(js, {**meta, **result})
    atomic_write_text(md, render(result))
    return js, md


def load_lm(model: str, *, encoding: Optional[str] = None, rope_scaling: Optional[str] = None, device: str = "auto",
            trust_remote_code: bool = False, train_len: Optional[int] = None) -> PasskeyLM:
    """``hf:<...>`` -> a Hugging Face model with its tokenizer; else one of our checkpoint folders."""
    if model.startswith("hf:"):
        if encoding is not None:
            raise ConfigError("--encoding names one of our encodings; for a Hugging Face model use --rope-scaling")
        return HFPasskeyLM(model, rope_scaling=rope_scaling, device=device, trust_remote_code=trust_remote_code,
                           train_len=train_len)
    if rope_scaling is not None:
        raise ConfigError(f"--rope-scaling applies to Hugging Face models; for a checkpoint use --encoding "
                          f"(e.g. rope-{rope_scaling})")
    if train_len is not None:
        raise ConfigError("--train-len applies to Hugging Face models; a checkpoint knows its train length")
    return CheckpointLM(model, encoding, device)


class HFPasskeyLM:
    """A Hugging Face causal LM and its own tokenizer (``posenc_bench.hf.model``); an optional zero-shot row as
    `eval` runs it: a RoPE scaling with factor = prompt length / train length through transformers'
    rope_parameters (``hf/rope.py``), or a fix (ntk, ReRoPE, Self-Extend, sinks) through our attention
    (``hf/attention.py``). Where the row allows it (``can_cache``), a prompt's shared head runs once
    (``prefill``) and each continuation reads its KV cache (``extend``): the multi-needle test's one prefill."""

    def __init__(self, model: str, *, rope_scaling: Optional[str], device: str, trust_remote_code: bool,
                 train_len: Optional[int]) -> None:
        import contextlib

        from posenc_bench.hf.model import HFModel, resolve_model
        from posenc_bench.env import resolve_device

        spec = resolve_model(model)
        self.hf = HFModel(spec, device=resolve_device(device), trust_remote_code=trust_remote_code)
        self.train_len = train_len or self.hf.own_train_len()[0]
        self.scaling = rope_scaling
        if rope_scaling is not None and self.hf.rope_problem():
            raise ConfigError(self.hf.rope_problem())
        self.base_name = f"hf:{spec.name}"
        self.name = self.base_name + (f"+{rope_scaling}" if rope_scaling else "")
        self.device = self.hf.device
        self._stack = contextlib.ExitStack()
        self._posenc = None  # a fix's attention (hf/attention.Rerouted) at the length set, or None
        self._cache, self._held = None, 0  # the prefilled KV cache and how many tokens it holds
        self.checkpoint_meta = {"model": self.hf.describe(), "rope_scaling": rope_scaling, "train_len": self.train_len}

    def with_scaling(self, scaling: Optional[str]) -> "HFPasskeyLM":
        """The same model (its weights loaded once) as the row of another scaling. Rows share the weights:
        ``release`` one before setting another's length."""
        import contextlib
        import copy

        if scaling is not None and self.hf.rope_problem():
            raise ConfigError(self.hf.rope_problem())
        other = copy.copy(self)
        other.scaling, other.name = scaling, self.base_name + (f"+{scaling}" if scaling else "")
        other._stack, other._posenc, other._cache, other._held = contextlib.ExitStack(), None, None, 0
        other.checkpoint_meta = {**self.checkpoint_meta, "rope_scaling": scaling}
        return other

    def release(self) -> None:
        """Put the model back as loaded (unscaled, its own attention) and drop the KV cache."""
        self._stack.close()
        self._posenc, self._cache, self._held = None, None, 0

    def encode(self, text: str) -> list[int]:
        return self.hf.tokenizer(text, add_special_tokens=False)["input_ids"]

    def prefix(self) -> list[int]:
        """The special tokens the tokenizer puts before a text (BOS where it adds one), none of those after it."""
        tok = self.hf.tokenizer
        plain = tok("a", add_special_tokens=False)["input_ids"]
        full = tok("a", add_special_tokens=True)["input_ids"]
        starts = [i for i in range(len(full) - len(plain) + 1) if full[i : i + len(plain)] == plain]
        return full[: starts[0]] if starts else []

    def set_length(self, length: int) -> None:
        from posenc_bench.hf.rope import SCALINGS, scaled_max_positions, scaling_parameters

        limit = self.hf.position_limit()
        if limit is not None and length > limit:
            raise PositionOutOfRange(f"absolute position table of {limit} positions: no position {limit} or later")
        self.release()
        if self.scaling is not None and self.scaling not in SCALINGS:  # a fix: our attention, as eval runs it
            from posenc_bench.bench.eval.pretrained import fix_encoding
            from posenc_bench.hf import attention

            encoding = fix_encoding(self.hf, self.scaling, self.train_len, length)
            self._stack.enter_context(attention.rerouted(self.hf.model, self.hf.rotary))
            self._posenc = attention.Rerouted(encoding)
        elif self.scaling is not None:
            factor = max(1.0, length / self.train_len)
            params = scaling_parameters(self.hf.rope_parameters(), self.scaling, factor, self.train_len)
            self._stack.enter_context(self.hf.scaled(params, scaled_max_positions(self.scaling, factor, self.train_len)))

    def _attention(self) -> dict:
        """The forward's keyword for a fix's attention (``posenc=``), none for the model's own."""
        return {"posenc": self._posenc} if self._posenc is not None else {}

    @torch.inference_mode()
    def logits(self, ids: torch.Tensor, last: Optional[int] = None) -> torch.Tensor:
        """(1, L) -> (L, V), or the logits of the ``last`` positions only (at 32k tokens all of them would be
        6 GB for SmolLM2's 49k-token vocabulary); no KV cache is kept."""
        extra = self._attention()
        if last:
            extra["logits_to_keep"] = last
        return self.hf.model(input_ids=ids.to(self.hf.device), use_cache=False, **extra).logits[0].float()

    def can_cache(self) -> bool:
        """Whether ``extend`` after ``prefill`` computes what one forward over both would. Not for a
        length-dependent scaling (dynamic NTK recomputes its frequencies from the longest position of each
        forward, so the cached keys would have been rotated at other frequencies than a full forward's). A fix
        through our attention caches its keys unrotated and scores the continuation's queries against all of
        them (``hf.attention.posenc_attention``)."""
        from posenc_bench.hf.rope import length_dependent

        return not (self._posenc is None and self.scaling is not None and length_dependent(self.scaling))

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor) -> None:
        """Run ``ids`` (1, H) once and keep every layer's keys and values for ``extend``."""
        extra = self._attention()
        out = self.hf.model(input_ids=ids.to(self.hf.device), use_cache=True, logits_to_keep=1, **extra)
        self._cache, self._held = out["cache" if "cache" in out else "past_key_values"], ids.shape[1]

    @torch.inference_mode()
    def extend(self, ids: torch.Tensor) -> torch.Tensor:
        """(1, q) continuing the prefilled tokens (positions H .. H + q - 1) -> (q, V); the cache is cropped back
        to the prefill after, so that no continuation sees another."""
        if self._cache is None:
            raise ConfigError("extend() needs prefill() first (at the length set)")
        name = "cache" if "cache" in inspect.signature(self.hf.model.forward).parameters else "past_key_values"
        # the cache argument is `cache` from transformers 5.2x on, `past_key_values` before
        extra = self._attention()
        out = self.hf.model(input_ids=ids.to(self.hf.device), use_cache=True, **{name: self._cache}, **extra)
        self._cache.crop(-ids.shape[1])
        if self._cache.get_seq_length() != self._held:
            raise PosencError(f"{type(self._cache).__name__} did not crop back to the prefill's {self._held} tokens")
        return out.logits[0].float()


# ---- our own checkpoints ------------------------------------------------------------------------------------


class CheckpointLM:
    """A checkpoint written by `posenc-bench run` (its tokenizer's tokens, BOS first: bytes, or the BPE of its
    results folder), with its trained encoding or an eval-only variant of it (e.g. rope-yarn on the rope
    checkpoint)."""

    def __init__(self, path: Path | str, encoding: Optional[str] = None, device: str = "auto") -> None:
        from posenc_bench.bench import checkpoint
        from posenc_bench.env import resolve_device
        from posenc_bench.tokenizer import ByteTokenizer

        self.device, self.path = resolve_device(device), path
        self.model, ckpt = checkpoint.load_model(path, encoding, self.device)
        row = checkpoint.evaluated_row(ckpt, encoding)  # rope+sink4 on the rope+sw64 model: rope+sw64+sink4
        self.name = f"{row.name} ({ckpt.path})"
        self.row = row  # the row evaluated: its zero-shot variants are row.variant(scaling)
        self.train_len = ckpt.config.train.train_len
        self.tokenizer = ByteTokenizer() if ckpt.config.data.tokenizer == "bytes" else ckpt.corpus().tokenizer
        self.bos = self.tokenizer.bos
        self.checkpoint_meta = {"path": str(ckpt.path), "cell_key": ckpt.meta.get("cell_key"), "encoding": row.encoding}

    def with_scaling(self, scaling: Optional[str]) -> "CheckpointLM":
        """The zero-shot row ``scaling`` of the trained model (rope: yarn -> rope-yarn), loaded from its checkpoint."""
        return CheckpointLM(self.path, None if scaling is None else self.row.trained.variant(scaling).encoding,
                            str(self.device))

    def release(self) -> None:  # each row is a model of its own
        pass

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode_documents([text.encode("utf-8")])[0].tolist()

    def prefix(self) -> list[int]:
        return [self.bos]

    def set_length(self, length: int) -> None:
        self.model.encoding.set_eval_length(length)

    def logits(self, ids: torch.Tensor, last: Optional[int] = None) -> torch.Tensor:
        return self.model(ids.to(self.device))[0, -(last or ids.shape[1]):].float()
