"""A Hugging Face causal LM for the protocol: loading, identity, RoPE surgery, and a chunked NLL.

``hf:<local folder | hub name | path/to/file.gguf>`` is loaded with ``AutoModelForCausalLM`` /
``AutoTokenizer`` (``trust_remote_code`` only when the user asks for it), in inference mode, SDPA attention.
Its train length is its own (``max_position_embeddings``, or the original length of an already-scaled
model), overridable.

The loss is computed from the last hidden state with the LM head applied to chunks of positions, never a
full (L, vocab) float32 logits tensor; a check at load time compares this path with the model's own logits
and falls back to them if the model post-processes its logits (e.g. soft-capping).
"""

from __future__ import annotations

import contextlib
import copy
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import torch
import torch.nn.functional as F

from posenc_bench.env import precision_dtype
from posenc_bench.errors import ConfigError, PosencError
from posenc_bench.files import file_hash

_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")

# Bytes of one chunk of float32 logits in the loss. Above glibc's largest mmap threshold (32 MiB on 64-bit), so
# that every chunk is mapped and unmapped on its own: below it, freed chunks raise the threshold, later ones
# come from the heap, and the heap grows with the length instead of staying at one chunk.
HEAD_CHUNK_BYTES = 64 << 20


# ---- which model ------------------------------------------------------------------------------------------

@dataclass
class ModelSpec:
    kind: str  # "hf" | "checkpoint"
    ref: str  # what from_pretrained gets (folder or hub name), or the checkpoint folder
    name: str  # short name for row labels
    gguf_file: Optional[str] = None


def resolve_model(spec: str) -> ModelSpec:
    if spec.startswith("hf:"):
        rest = spec[3:]
        path = Path(rest).expanduser()
        if rest.lower().endswith(".gguf"):
            if not path.is_file():
                raise ConfigError(f"--model {spec!r}: no GGUF file at {str(path)!r}")
            return ModelSpec("hf", str(path.resolve().parent), path.stem, gguf_file=path.name)
        if path.is_dir():
            return ModelSpec("hf", str(path), path.resolve().name)
        if rest.startswith((".", "/", "~")) or not _HUB_NAME.match(rest):
            raise ConfigError(f"--model {spec!r}: {rest!r} is not a folder, and not a hub name (org/name)")
        return ModelSpec("hf", rest, rest)
    path = Path(spec).expanduser()
    if (path / "config.json").is_file() and (path / "model.safetensors").is_file():
        return ModelSpec("checkpoint", str(path), path.name)
    raise ConfigError(
        f"--model {spec!r}: expected hf:<local folder | hub name | file.gguf>, or one of our checkpoint folders "
        "holding model.safetensors and config.json (e.g. results/run/checkpoints/rope-seed0)"
    )


# ---- the model --------------------------------------------------------------------------------------------

def load_pretrained(spec: ModelSpec, torch_dtype: torch.dtype, trust_remote_code: bool) -> tuple:
    """(tokenizer, model, attention implementation) from transformers, SDPA where the model supports it."""
    from transformers import AutoModelForCausalLM

    kwargs = _pretrained_kwargs(spec, trust_remote_code)
    tokenizer = load_tokenizer(spec, trust_remote_code)  # a ConfigError of its own where it cannot
    try:
        with _no_bars():
            try:
                model = AutoModelForCausalLM.from_pretrained(spec.ref, dtype=torch_dtype, attn_implementation="sdpa",
                                                             **kwargs)
                return tokenizer, model, "sdpa"
            except ValueError as e:
                if "sdpa" not in str(e).lower():
                    raise
                model = AutoModelForCausalLM.from_pretrained(spec.ref, dtype=torch_dtype, **kwargs)
                return tokenizer, model, model.config._attn_implementation
    except (OSError, ValueError, ImportError, KeyError) as e:
        raise _cannot_load(spec, e, trust_remote_code) from None


def load_tokenizer(spec: ModelSpec, trust_remote_code: bool = False):
    """The model's tokenizer alone, without its weights: all that rebuilding its eval text needs."""
    from transformers import AutoTokenizer

    try:
        with _no_bars():
            return AutoTokenizer.from_pretrained(spec.ref, **_pretrained_kwargs(spec, trust_remote_code))
    except (OSError, ValueError, ImportError, KeyError) as e:
        raise _cannot_load(spec, e, trust_remote_code) from None


@contextlib.contextmanager
def _no_bars() -> Iterator[None]:
    """transformers' progress bars ("Loading weights") off: our own progress is enough."""
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _pretrained_kwargs(spec: ModelSpec, trust_remote_code: bool) -> dict:
    return {"trust_remote_code": trust_remote_code, **({"gguf_file": spec.gguf_file} if spec.gguf_file else {})}


def _cannot_load(spec: ModelSpec, e: Exception, trust_remote_code: bool) -> ConfigError:
    hint = "" if trust_remote_code or "trust_remote_code" not in str(e) else " (add --trust-remote-code if you trust its code)"
    return ConfigError(f"cannot load model {spec.ref!r}{' file ' + spec.gguf_file if spec.gguf_file else ''}: "
                       f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}{hint}")


def rotary_embeddings(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.nn.Module]]:
    """(parent module, attribute, rotary module) for every rotary embedding the model built from its config."""
    return [(parent, attr, child) for parent in model.modules() for attr, child in parent.named_children()
            if hasattr(child, "inv_freq") and hasattr(child, "rope_type") and hasattr(child, "config")]


class HFModel:
    """A causal LM from transformers, its tokenizer, its RoPE modules, and a chunked NLL."""

    def __init__(self, spec: ModelSpec, *, device: torch.device, precision: str = "fp32",
                 trust_remote_code: bool = False, head_chunk_bytes: int = HEAD_CHUNK_BYTES) -> None:
        torch_dtype = precision_dtype(precision)
        self.spec = spec
        self.device = device
        self.dtype = str(torch_dtype).removeprefix("torch.")  # recorded as before: float32, bfloat16, float16
        self.head_chunk_bytes = head_chunk_bytes
        self.tokenizer, model, self.attention = load_pretrained(spec, torch_dtype, trust_remote_code)
        self.model = model.eval().to(device)
        self.config = self.model.config
        self.rotary = rotary_embeddings(self.model)
        self.chunked = self._check_chunked_head()

    # -- identity ---------------------------------------------------------------------------------------
    def describe(self) -> dict:
        spec, tok = self.spec, self.tokenizer
        if spec.gguf_file:
            revision = {"file_sha256": file_hash([Path(spec.ref) / spec.gguf_file])}
        elif Path(spec.ref).is_dir():
            files = [p for p in Path(spec.ref).iterdir() if p.is_file() and p.suffix in (".safetensors", ".bin", ".json", ".model")]
            revision = {"files_sha256": file_hash(files)}
        else:
            revision = {"hub_commit": getattr(self.config, "_commit_hash", None)}
        return {
            "kind": "hf", "model": spec.name, "ref": spec.ref, "gguf_file": spec.gguf_file, **revision,
            "class": type(self.model).__name__, "model_type": getattr(self.config, "model_type", None),
            "params": sum(p.numel() for p in self.model.parameters()),
            "max_position_embeddings": getattr(self.config, "max_position_embeddings", None),
            "rope_parameters": self.rope_parameters(), "dtype": self.dtype, "attention": self.attention,
            "chunked_head": self.chunked,
            "tokenizer": {"class": type(tok).__name__, "name_or_path": tok.name_or_path, "vocab_size": len(tok),
                          "bos": tok.bos_token, "eos": tok.eos_token},
        }

    def rope_parameters(self) -> Optional[dict]:
        rp = getattr(self.config, "rope_parameters", None)
        return dict(rp) if rp else None

    def rope_problem(self) -> Optional[str]:
        """Why RoPE scalings cannot be applied to this model, or None if they can."""
        rp = self.rope_parameters()
        if not self.rotary or not rp:
            return (f"{type(self.model).__name__} has no rotary position embedding "
                    f"(not a RoPE model); RoPE scalings do not apply")
        if "rope_type" not in rp or not isinstance(rp.get("rope_theta"), (int, float)):
            return f"{type(self.model).__name__} has per-layer rope_parameters {sorted(rp)}; scalings of those are not supported"
        return None

    def own_train_len(self) -> tuple[int, str]:
        """(train length, where it comes from): the pre-scaling length of an already-scaled model."""
        rp = self.rope_parameters() or {}
        if rp.get("rope_type", "default") != "default" and rp.get("original_max_position_embeddings"):
            return int(rp["original_max_position_embeddings"]), "rope_parameters.original_max_position_embeddings"
        if getattr(self.config, "original_max_position_embeddings", None):
            return int(self.config.original_max_position_embeddings), "original_max_position_embeddings"
        mpe = getattr(self.config, "max_position_embeddings", None)
        if not mpe:
            raise ConfigError(f"{type(self.model).__name__}'s config has no max_position_embeddings; give --train-len")
        return int(mpe), "max_position_embeddings"

    def position_limit(self) -> Optional[int]:
        """Longest input a non-RoPE model with an absolute position table can take (None: no such limit)."""
        if self.rotary:
            return None
        mpe = getattr(self.config, "max_position_embeddings", None)
        return int(mpe) if mpe else None

    # -- scaling ----------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def scaled(self, rope_parameters: Optional[dict], max_position_embeddings: int) -> Iterator[None]:
        """Rotary modules rebuilt from a config copy with these rope_parameters; the originals are put back after."""
        if rope_parameters is None:
            yield
            return
        originals = []
        try:
            for parent, attr, module in self.rotary:
                cfg = copy.deepcopy(module.config)
                cfg.rope_parameters = dict(rope_parameters)
                cfg.max_position_embeddings = max_position_embeddings
                try:
                    new = type(module)(config=cfg)
                except TypeError as e:
                    raise PosencError(f"cannot rebuild {type(module).__name__} from a config: {e}") from None
                originals.append((parent, attr, module))
                setattr(parent, attr, new.to(self.device))
            yield
        finally:
            for parent, attr, module in originals:
                setattr(parent, attr, module)

    def scaling_is_identity(self, length: int) -> bool:
        """Inside ``scaled``: do the rotary modules give the unscaled model's cos/sin at this length (same
        inv_freq and attention scale, and no dynamic update below it)? Then its numbers are the unscaled ones."""
        for (parent, attr, original) in self.rotary:
            new = getattr(parent, attr)
            if new is original:
                continue
            if "dynamic" in new.rope_type and length > new.original_max_seq_len:
                return False
            if not torch.equal(new.inv_freq, original.inv_freq) or new.attention_scaling != original.attention_scaling:
                return False
        return True

    def rotary_modules(self) -> list[torch.nn.Module]:
        return [getattr(parent, attr) for parent, attr, _ in self.rotary]

    # -- loss -------------------------------------------------------------------------------------------
    def _head_nll(self, x: torch.Tensor, y: torch.Tensor, **kwargs) -> torch.Tensor:
        hidden = self.model.base_model(input_ids=x, use_cache=False, **kwargs).last_hidden_state  # (b, l, C)
        return head_nll(self.model.get_output_embeddings(), hidden, y.to(hidden.device), self.head_chunk_bytes)

    def _full_nll(self, x: torch.Tensor, y: torch.Tensor, **kwargs) -> torch.Tensor:
        logits = self.model(input_ids=x, use_cache=False, **kwargs).logits.float()  # (b, l, V)
        return F.cross_entropy(logits.flatten(0, 1), y.to(logits.device).flatten(), reduction="none").view(y.shape)

    @torch.inference_mode()
    def _check_chunked_head(self) -> bool:
        """True if last hidden state -> output embeddings reproduces the model's own logits (no post-processing)."""
        head = self.model.get_output_embeddings()
        if head is None or not hasattr(head, "weight"):
            return False
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, min(len(self.tokenizer), head.weight.shape[0]), (1, 8), generator=g).to(self.device)
        try:
            mine = head(self.model.base_model(input_ids=x).last_hidden_state).float()
        except (TypeError, AttributeError):
            return False
        theirs = self.model(input_ids=x).logits.float()
        tol = 1e-4 if self.dtype == "float32" else 2e-2
        return mine.shape == theirs.shape and torch.allclose(mine, theirs, rtol=tol, atol=tol)

    def nll(self, x: torch.Tensor, y: torch.Tensor, **kwargs) -> torch.Tensor:
        """(b, l) NLL of targets y given inputs x, positions from 0 (no KV cache: it would hold every layer's
        keys and values, 1.5 GB at 32k tokens for SmolLM2-135M); ``kwargs`` reach the attention functions."""
        return self._head_nll(x, y, **kwargs) if self.chunked else self._full_nll(x, y, **kwargs)


def head_nll(head: torch.nn.Module, hidden: torch.Tensor, y: torch.Tensor, chunk_bytes: int = HEAD_CHUNK_BYTES
             ) -> torch.Tensor:
    """(b, l) NLL of targets y (b, l) from the last hidden state (b, l, C) through the LM head, a chunk of
    positions at a time: at most ``chunk_bytes`` of float32 logits (b, chunk, V) are alive at once, so memory
    stays one chunk whatever the length (see HEAD_CHUNK_BYTES)."""
    b, l, _ = hidden.shape
    chunk = max(1, chunk_bytes // (4 * b * head.weight.shape[0]))
    out = []
    for s in range(0, l, chunk):
        logits = head(hidden[:, s : s + chunk]).float()  # (b, chunk, V)
        out.append(F.cross_entropy(logits.flatten(0, 1), y[:, s : s + chunk].flatten(), reduction="none").view(b, -1))
    return torch.cat(out, dim=1)
