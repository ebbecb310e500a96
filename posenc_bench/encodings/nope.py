"""NoPE: no positional signal at all, the ablation.

Kazemnejad et al., "The Impact of Positional Encoding on Length Generalization in Transformers",
NeurIPS 2023 (arXiv:2305.19466). A causal decoder can still infer position from the causal mask alone.
"""

from posenc_bench.encodings.base import Encoding
from posenc_bench.encodings.registry import register


@register("nope")
class NoPE(Encoding):
    summary = "no position signal (causal mask only); Kazemnejad et al. 2023"
    family = "none"
    paper = "Kazemnejad et al., NeurIPS 2023 (arXiv:2305.19466)"
