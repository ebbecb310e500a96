"""Our checkpoints: written atomically, verified on load, turned into a model by one function for every caller.

A checkpoint is a folder ``<out>/checkpoints/<trained row>-seed<s>`` (a ``-ft`` row has its own) holding

- ``model.safetensors``: the weights (absent for a diverged run: its meta records why);
- ``config.json``: the meta, written last, so it is the "finished" marker: ``cell_key`` (what the weights
  depend on), ``encoding``, ``window``, ``seed``, the run ``config``, ``corpus_fingerprint``, the training
  ``outcome`` (and ``finetune`` for a -ft row), ``weights_sha256``, the hash of the weights file at save, and
  ``tokenizer`` (a BPE's name and fingerprint; absent for bytes).

Each file goes to a temporary name and is renamed into place, so a reader sees a whole file or none; an old
``config.json`` is removed before new weights are written, so a crash in between leaves no meta beside
weights it does not describe. Loading checks the hash (checkpoints written before it was recorded are
checked by safetensors' own parsing) and raises :class:`CheckpointError`: the sweep retrains such a cell
with one warning line; ``eval`` and ``passkey`` stop with one error line.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from posenc_bench import encodings
from posenc_bench.bench.config import RunConfig, config_from_dict, load_run_corpus
from posenc_bench.bench.rows import Row
from posenc_bench.data import Corpus
from posenc_bench.errors import ConfigError, PosencError
from posenc_bench.files import atomic_write, atomic_write_text
from posenc_bench.model.transformer import DecoderLM

WEIGHTS, META = "model.safetensors", "config.json"


class CheckpointError(PosencError):
    """A checkpoint folder that is not whole: unreadable meta, missing or corrupt weights."""


def checkpoint_dir(out: Path | str, row: Row, seed: int) -> Path:
    """Where the model of a trained or fine-tuned row (``Row.model``) at ``seed`` lives in a results folder."""
    return Path(out) / "checkpoints" / f"{row.name}-seed{seed}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def save(path: Path, model: Optional[torch.nn.Module], meta: dict) -> None:
    """Weights (None: a diverged run, meta only), then the meta with the weights' hash, each atomically."""
    from safetensors.torch import save_model

    path.mkdir(parents=True, exist_ok=True)
    (path / META).unlink(missing_ok=True)  # never leave old meta beside new weights
    meta = dict(meta)
    if model is not None:
        atomic_write(path / WEIGHTS, lambda tmp: save_model(model, tmp))  # handles tied weights
        meta["weights_sha256"] = _sha256(path / WEIGHTS)
    else:
        (path / WEIGHTS).unlink(missing_ok=True)
    atomic_write_text(path / META, json.dumps(meta, indent=1) + "\n")


@dataclass
class Checkpoint:
    path: Path
    meta: dict

    @property
    def row(self) -> Row:
        """The trained (or fine-tuned) row whose model this is."""
        return Row(self.meta["encoding"], self.meta["window"])

    @property
    def finished_ok(self) -> bool:
        return self.meta["outcome"]["status"] == "ok"

    @property
    def config(self) -> RunConfig:
        return config_from_dict(self.meta["config"])

    def corpus(self, cfg: Optional[RunConfig] = None) -> Corpus:
        """The corpus of this checkpoint's config (or ``cfg``), read with the tokenizer it was trained with: a BPE
        from the results folder the checkpoint is in (else trained again from the same split), refused when
        it is not the checkpoint's own (its fingerprint in the meta)."""
        cfg = cfg or self.config
        corpus = load_run_corpus(cfg, self.path.parent.parent, save=False)
        own = (self.meta.get("tokenizer") or {}).get("fingerprint")
        if own != corpus.tokenizer.fingerprint:
            raise CheckpointError(f"checkpoint {str(self.path)!r} was trained with tokenizer {own or 'bytes'}; its "
                                  f"config's {cfg.data.tokenizer} is {corpus.tokenizer.fingerprint or 'bytes'} here")
        return corpus

    def load_into(self, model: DecoderLM) -> DecoderLM:
        """``model`` with these weights (strict: every tensor must fit), verified against the recorded hash."""
        from safetensors import SafetensorError
        from safetensors.torch import load_model

        weights = self.path / WEIGHTS
        if not weights.is_file():
            raise CheckpointError(f"checkpoint {str(self.path)!r} has no {WEIGHTS}")
        expected = self.meta.get("weights_sha256")
        if expected is not None and _sha256(weights) != expected:
            raise CheckpointError(f"checkpoint {str(self.path)!r}: {WEIGHTS} does not match the hash recorded when "
                                  "it was saved (truncated or overwritten)")
        try:
            load_model(model, str(weights))
        except (SafetensorError, RuntimeError, OSError) as e:
            raise CheckpointError(f"checkpoint {str(self.path)!r}: {WEIGHTS} cannot be read "
                                  f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
        if self.meta.get("finetune"):  # a -ft row's checkpoint: its scaling is fixed at the fine-tune length
            model.encoding.set_train_length(self.meta["finetune"]["len"])
        return model


def read(path: Path | str) -> Checkpoint:
    """The checkpoint at ``path``; CheckpointError if its meta is missing or unreadable."""
    path = Path(path)
    try:
        meta = json.loads((path / META).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{str(path)!r} is not a posenc-bench checkpoint folder ({type(e).__name__}: {e})") from None
    missing = [k for k in ("cell_key", "config", "encoding", "window", "seed", "outcome") if not isinstance(meta, dict) or k not in meta]
    if missing:
        raise CheckpointError(f"{str(path)!r} is not a posenc-bench checkpoint folder: its {META} has no "
                              f"{', '.join(missing)}")
    return Checkpoint(path, meta)


def find(path: Path, key: str) -> Optional[Checkpoint]:
    """The finished checkpoint at ``path`` if it was made with ``key`` (None: absent, unfinished or another
    key, so the caller trains). Raises CheckpointError when a finished one is damaged."""
    if not (path / META).is_file():
        return None
    ckpt = read(path)
    if ckpt.meta.get("cell_key") != key:
        return None
    if ckpt.finished_ok and not (path / WEIGHTS).is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} has no {WEIGHTS}")
    return ckpt


def build_model(cfg: RunConfig, row: Row, seed: int) -> DecoderLM:
    """A fresh model of this run for ``row``: the one constructor call of the package."""
    return DecoderLM(cfg.model, row.encoding, cfg.train.train_len, window=row.window, seed=seed,
                     max_mask_bytes=cfg.max_mask_bytes)


def load_model(path: Path | str, encoding: Optional[str] = None, device: str | torch.device = "cpu"
               ) -> tuple[DecoderLM, Checkpoint]:
    """Our checkpoint -> (model in eval mode on ``device``, checkpoint), with its own encoding or an eval-only
    variant of its trained encoding (``encoding``, e.g. rope-yarn on the rope checkpoint)."""
    ckpt = read(path)
    row = evaluated_row(ckpt, encoding)
    if not ckpt.finished_ok:
        raise CheckpointError(f"checkpoint {str(ckpt.path)!r} holds no weights: its training "
                              f"{ckpt.meta['outcome'].get('reason') or 'did not finish'}")
    model = ckpt.load_into(build_model(ckpt.config, row, ckpt.meta["seed"]))
    return model.to(device).eval(), ckpt


def evaluated_row(ckpt: Checkpoint, encoding: Optional[str] = None) -> Row:
    """The row ``load_model`` evaluates: the checkpoint's own, or the eval-only ``encoding`` (a row name, e.g.
    rope-yarn) on the window it was trained with; ConfigError when that row does not evaluate this model."""
    trained = ckpt.row
    row = trained if encoding is None else Row(Row.parse(encoding).encoding, trained.window)
    if row.model != trained:
        if row.finetuned and row.trained == trained:
            raise ConfigError(f"encoding {row.encoding!r} is fine-tuned: give its own checkpoint "
                              f"(checkpoints/{row.name}-seed<s>), not the {trained.name!r} one")
        raise ConfigError(f"encoding {row.encoding!r} does not evaluate the trained {trained.encoding!r} model; "
                          f"variants of it: {', '.join(encodings.variants(trained.encoding)) or '(none)'}")
    return row


def cell_key_of(path: Path | str) -> Optional[str]:
    """The cell key a checkpoint folder was made with (None: no readable meta)."""
    try:
        return json.loads((Path(path) / META).read_text()).get("cell_key")
    except (OSError, json.JSONDecodeError, AttributeError):
        return None


def encoding_state(path: Path | str) -> dict[str, torch.Tensor]:
    """The trained encoding's own parameters from a checkpoint (for drawing a learned bias), verified."""
    from safetensors.torch import load_file

    try:
        meta = json.loads((Path(path) / META).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{str(path)!r} is not a posenc-bench checkpoint folder ({type(e).__name__})") from None
    weights = Path(path) / WEIGHTS
    expected = meta.get("weights_sha256")
    if not weights.is_file() or (expected is not None and _sha256(weights) != expected):
        raise CheckpointError(f"checkpoint {str(path)!r}: {WEIGHTS} is missing or does not match its recorded hash")
    state = load_file(str(weights))
    return {k.removeprefix("encoding."): v for k, v in state.items() if k.startswith("encoding.")}
