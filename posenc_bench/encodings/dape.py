"""DAPE: data-adaptive positional encoding.

Zheng et al., "DAPE: Data-Adaptive Positional Encoding for Length Extrapolation", NeurIPS 2024
(arXiv:2405.14722): a relative bias B (KERPLE, ALiBi, FIRE) is made dependent on the content by a small MLP f
that reads, for each query-key pair, the vector over heads of the attention logits together with the vector
over heads of the bias:

    A_ij = s q_i . k_j + B_ij + f([s q_i . k_j ; B_ij]),   s = 1 / sqrt(D),

per pair (i, j), where [.;.] stacks the two (H,) vectors into one of 2H and f: 2H -> H.

Every default is the authors' code's (chuanyang-Zheng/DAPE, commit bde344a844f2bd1f498b2bac70240dcda41c50c1;
``megatron/model/positional_embeddings.py``: ``ParallelKerpleLog_C`` (lines 893-1002; row ``dape-kerple``)
and ``AliBi_C`` (lines 226-330; row ``dape-alibi``), their ``pos-emb`` values ``kerple_c`` and ``alibi_c``):

- f = Linear(2H, W), LeakyReLU (slope 0.01, torch's default), Linear(W, H), ``mlp2`` there (lines 243-246,
  935-938), W = ``mlp_width`` = 32 (``configs/125M/512/125M_kerple_c.yml`` and ``125M_alibi_c.yml``);
  both layers with torch's default ``nn.Linear`` initialisation (nothing in the code re-initialises them), so
  f is not zero at the start: DAPE differs from its base from the first step;
- the input is the logits first, then the bias (``torch.cat((x, bias), dim=1)``, lines 324 and 995), and the
  result is ``x + bias + mlp2(...)`` (lines 330 and 1002): f is a residual on the biased logits;
- x is the scaled q . k (``ParallelSelfAttention.attention`` in ``megatron/model/transformer.py``: the
  ``baddbmm`` with alpha 1 / norm_factor = 1 / sqrt(D), lines 425 and 626-632; query-key layer scaling off by
  default, ``megatron/neox_arguments/neox_args.py`` line 368), and f runs on the unmasked scores: the causal
  mask is applied after it, in ``scale_mask_softmax`` (line 696). f is pointwise in (i, j), so a hidden
  pair's value never reaches a visible one; here f reads the finite logits and bias and the chunk's mask
  (-inf on hidden pairs) is added after it, so no -inf enters f and nothing is NaN;
- each attention layer builds its own module (``ParallelSelfAttention.__init__``, transformer.py lines
  442-449 and 471-472): its own f and, over KERPLE, its own r1, r2. Here ``layers`` holds one base and one f
  per attention layer (``n_layers``, passed by the model), and ``for_layer(i)`` is the view layer i attends
  with (as CoPE's per-layer tables);
- the base bias is our ``kerple.KerpleLog`` (r1 ~ U(0, 2), r2 ~ U(0, 1) per head, the authors' init) or
  ``alibi.ALiBi`` (the fixed slopes), built per layer, in that layer's order: base, then f.

Deviations, each with its reason:

- KERPLE's r1, r2 stay above 0.01 by our ``kerple.py``'s reparametrisation (0.01 + softplus) instead of the
  authors' in-place clamp each step: the base class is reused as it is, so ``dape-kerple``'s base is the
  ``kerple`` row's kernel and parametrisation (here one per layer, as the authors; the ``kerple`` row shares
  one across layers).
- For keys after the query (hidden), the authors' bias is 0 (``torch.tril``); here it is whatever the base's
  ``bias`` gives there (0 for KERPLE, m (j - i) for ALiBi). Those pairs are masked after f and f is
  pointwise, so no visible logit changes.
- f's first layer is applied as W_x x + (W_b B + b): the same product as the authors' Linear on the
  concatenation, with the bias half computed once per chunk and broadcast over the batch instead of tiled
  (B is the same for every sequence). On the CPU in float32, f runs in C (``dape_kernel``): each pair's
  hidden layer in registers, recomputed in backward instead of held, and the keys a whole query row cannot see
  skipped. Elsewhere (torch ops) evaluation runs f over a few query rows at a time, so its (q, k, W) hidden
  layer stays within the size of one (B, H, q, k) logits tensor (the plan sizes chunks for a few).
- The authors compute in the training precision (fp16); here logits, bias and f's input are float32.
- Attention sinks (``dape-kerple+sink4+sw64``) are refused: on the explicit-logits path the base bias
  towards the sinks would be read at true positions rather than at the queries' cache positions.

DAPE computes each query chunk's whole logits (``has_attention_logits``): the model runs attention
explicitly, chunk by chunk (``model/explicit.py``), so memory stays bounded by the chunk size at any length.
"""

from __future__ import annotations

from typing import ClassVar, Optional

import torch
import torch.nn.functional as F
from torch import nn

from posenc_bench.encodings import dape_kernel
from posenc_bench.encodings.alibi import ALiBi
from posenc_bench.encodings.base import Encoding, LayerOf
from posenc_bench.encodings.kerple import KerpleLog
from posenc_bench.encodings.registry import register

MLP_WIDTH = 32  # the authors' mlp_width (configs/125M/512/125M_kerple_c.yml, 125M_alibi_c.yml)
NEGATIVE_SLOPE = 0.01  # nn.LeakyReLU()'s default, as the authors build it


class DAPEMLP(nn.Module):
    """f: Linear(2H, width), LeakyReLU, Linear(width, H), applied to every (query, key) pair's stacked vector
    [logits over heads; bias over heads]. ``fc``'s first H input columns read the logits, the last H the bias
    (the authors' order). Both layers keep torch's default initialisation, as the authors' ``mlp2``."""

    def __init__(self, n_heads: int, width: int) -> None:
        super().__init__()
        self.n_heads, self.width = n_heads, width
        self.fc = nn.Linear(2 * n_heads, width)
        self.proj = nn.Linear(width, n_heads)

    def forward(self, logits: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """f([logits; bias]) (B, H, q, k) from logits (B, H, q, k) and bias (1 or B, H, q, k), on torch ops."""
        H = self.n_heads
        x = logits.permute(0, 2, 3, 1)  # (B, H, q, k) -> (B, q, k, H)
        b = bias.permute(0, 2, 3, 1)  # (1 or B, H, q, k) -> (1 or B, q, k, H)
        # W [x; b] + c = W_x x + (W_b b + c): the bias half once per chunk, broadcast over the batch
        pre = F.linear(x, self.fc.weight[:, :H]) + F.linear(b, self.fc.weight[:, H:], self.fc.bias)  # (B, q, k, W)
        hidden = F.leaky_relu(pre, NEGATIVE_SLOPE)
        return F.linear(hidden, self.proj.weight, self.proj.bias).permute(0, 3, 1, 2)  # (B, q, k, H) -> (B, H, q, k)

    def kernel_args(self, logits: torch.Tensor, bias: torch.Tensor) -> Optional[tuple[torch.Tensor, ...]]:
        """The weights as ``dape_kernel.PairMLP`` takes them (fc's weight and bias, proj's), or None where its C
        kernels do not take these tensors (not float32 on the CPU, or no compiler): then ``forward`` runs."""
        weights = (self.fc.weight, self.fc.bias, self.proj.weight, self.proj.bias)
        return weights if dape_kernel.usable(logits, bias, *weights) else None


class DAPEBlock(nn.Module):
    """One attention layer's DAPE: its base bias (an Encoding with ``bias``) and its f."""

    def __init__(self, base: Encoding, n_heads: int, width: int) -> None:
        super().__init__()
        self.base = base
        self.mlp = DAPEMLP(n_heads, width)

    def logits(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, mask: torch.Tensor,
               scale: float) -> torch.Tensor:
        """One chunk's pre-softmax logits (B, H, q, k): s q . k + B + f([s q . k; B]), then the mask (0 or
        -inf) added after f, as the authors mask after it."""
        content = (q.float() @ k.float().transpose(-1, -2)).mul_(scale)  # (B, H, q, k); a fresh tensor
        bias = self.base.bias(q_pos, k_pos).float()  # (1, H, q, k)
        weights = self.mlp.kernel_args(content, bias)
        if weights is not None:  # the C kernels: no hidden layer in memory, keys hidden from a whole row skipped
            f = dape_kernel.PairMLP.apply(content, bias, dape_kernel.row_limits(mask), *weights, NEGATIVE_SLOPE)
            return torch.add(content, bias).add_(f).add_(mask)
        if torch.is_grad_enabled():
            return content + bias + self.mlp(content, bias) + mask
        out = content + bias  # (B, H, q, k)
        # f's hidden layer is (B, rows, k, W): a few rows at a time keep it within one (B, H, q, k) tensor
        step = max(1, content.shape[2] * content.shape[1] // self.mlp.width)
        for r in range(0, content.shape[2], step):
            out[:, :, r:r + step] += self.mlp(content[:, :, r:r + step], bias[:, :, r:r + step])
        return out.add_(mask)


class _DAPE(Encoding):
    """DAPE over the base bias ``base_class``: per attention layer a base and an f, each layer's logits
    s q . k + B + f([s q . k; B]) with the mask added after f.

    Zheng et al., NeurIPS 2024 (arXiv:2405.14722); as the authors' code, chuanyang-Zheng/DAPE at commit
    bde344a844f2bd1f498b2bac70240dcda41c50c1, ``megatron/model/positional_embeddings.py``:
    ``ParallelKerpleLog_C.forward`` (lines 962-1002) and ``AliBi_C.forward`` (lines 280-330), f built in their
    ``__init__`` (lines 935-938, 243-246), applied in ``megatron/model/transformer.py``
    ``ParallelSelfAttention.attention`` before ``scale_mask_softmax`` (lines 657-667, 696). Defaults (mlp_width
    32, LeakyReLU, torch's default init, one module per layer) and deviations (KERPLE's reparametrised r1, r2;
    float32; f's first layer split; the base's values on hidden pairs; no attention sinks): the module
    docstring."""

    family = "relative bias"
    newer = True
    paper = "Zheng et al., NeurIPS 2024 (arXiv:2405.14722)"
    has_attention_logits = True
    no_sinks = ("on the explicit-logits path its base bias towards the sinks would be read at true positions, "
                "not cache positions")
    base_class: ClassVar[type[Encoding]]

    def __init__(self, *, d_model: int, n_heads: int, train_len: int, mlp_width: int = MLP_WIDTH,
                 n_layers: int = 1) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len)
        if isinstance(mlp_width, bool) or not isinstance(mlp_width, int) or mlp_width < 1:
            raise ValueError(f"DAPE option mlp_width must be an integer >= 1 (the authors': {MLP_WIDTH}), "
                             f"got {mlp_width!r}")
        if n_layers < 1:
            raise ValueError(f"DAPE needs n_layers >= 1 (one f per attention layer), got {n_layers}")
        self.mlp_width, self.n_layers = mlp_width, n_layers
        self.layers = nn.ModuleList(
            DAPEBlock(self.base_class(d_model=d_model, n_heads=n_heads, train_len=train_len), n_heads, mlp_width)
            for _ in range(n_layers))

    def block(self, layer: int) -> DAPEBlock:
        """Attention layer ``layer``'s base and f."""
        if not 0 <= layer < self.n_layers:
            raise IndexError(f"DAPE has {self.n_layers} layer(s) (n_layers={self.n_layers}); layer {layer} has none: "
                             f"build it with the model's n_layers (valid layers: 0 .. {self.n_layers - 1})")
        return self.layers[layer]

    def for_layer(self, layer: int) -> "DAPELayer":
        self.block(layer)  # refuse a layer without its f here, not mid-forward
        return DAPELayer(self, layer)

    def attention_logits(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
                         mask: torch.Tensor, scale: float) -> torch.Tensor:
        """With layer 0's base and f (the model asks each layer's view, ``for_layer``, for its own)."""
        return self.block(0).logits(q, k, q_pos, k_pos, mask, scale)


class DAPELayer(LayerOf):
    """DAPE as attention layer ``layer`` sees it (``_DAPE.for_layer``): that layer's base and f."""

    def attention_logits(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
                         mask: torch.Tensor, scale: float) -> torch.Tensor:
        return self.encoding.block(self.layer).logits(q, k, q_pos, k_pos, mask, scale)


@register("dape-kerple")
class DAPEKerple(_DAPE):
    summary = ("KERPLE's log bias plus an MLP of each pair's logits and bias over heads (DAPE over KERPLE); "
               "Zheng et al. 2024")
    base_class = KerpleLog


@register("dape-alibi")
class DAPEALiBi(_DAPE):
    summary = ("ALiBi's bias plus an MLP of each pair's logits and bias over heads (DAPE over ALiBi); "
               "Zheng et al. 2024")
    base_class = ALiBi
