"""PaTH: no position signal but a data-dependent Householder-like transformation per head and token, accumulated
between a key and the query that reads it (Yang, Shen, Wen, Tan, Mishra, Ren, Panda & Kim, "PaTH Attention:
Position Encoding via Accumulating Householder Transformations", arXiv:2505.16381, 2025).

Each token t gets per head h a matrix H_t = I - beta_t w_t w_t^T from the attention layer's input x_t, and query
i weighs key j <= i by

    softmax_j( q_i^T H_i H_{i-1} ... H_{j+1} k_j * scale ),    scale = 1 / sqrt(D),

the product empty (I) at j = i: the relation between a query and a key is the transformations of the tokens
after the key up to the query, learned from the content (RoPE is the special case of fixed rotations). As the
authors' code has it (fla-org/flash-linear-attention at commit bc3b101dcb713ddc5bd8924b66754eb68b5ccf89):

- ``fla/layers/path_attn.py``, ``PaTHAttention.__init__`` and ``forward`` (lines 31-125), at the defaults of
  ``fla/models/path_attn/configuration_path_attention.py`` (``use_low_rank_w=True``, ``use_w_shortconv=True``,
  ``use_forget_gate=False``; the layer's ``use_qk_norm=False``, ``conv_size=3``, ``conv_bias=False``):
  w = l2_norm(silu(causal depthwise conv_3(W_up W_down x))) per head, W_down (32, C) and W_up (C, 32) without
  biases (lines 63-66: the low-rank ``w_proj``, rank 32 whatever C), the ``ShortConvolution`` of kernel 3 with
  silu and no bias (line 81; ``fla/modules/conv/short_conv.py``: causal, ``weight[:, -1]`` on the current token,
  as ``tests/modules/test_conv.py``'s ``causal_conv1d_ref_torch`` writes it), ``l2_norm`` x / sqrt(|x|^2 + 1e-6)
  (line 124; ``fla/modules/l2norm.py``, eps 1e-6); beta = 2 sigmoid(b . x + c) per head (lines 83 and 111:
  "allowing negative eigenvalues", so H_t ranges from I (beta 0) through a projection (beta 1) to a reflection
  (beta 2)); no RoPE, no forget gate ("PaTH", not "PaTH-FoX").
- ``fla/ops/path_attn/naive.py``, ``naive_path_attn`` (lines 13-97): the logits, their product order and range.
  Within a chunk the diagonal is q_i . k_i (line 73: the strictly lower ``Twbk`` leaves it alone), keys are
  carried to their chunk's end through the H after them (line 75), queries back through whole chunks (line 87),
  scale 1 / sqrt(D) (``fla/ops/path_attn/parallel.py``, ``parallel_path_attn``: ``k.shape[-1] ** -0.5``). The
  layer's decoding branch (lines 149-157, ``rank_one_update``) says the same one key at a time: every cached key
  becomes H_t k when token t arrives, so key j meets query i as H_i ... H_{j+1} k_j.
- Initialisation: ``fla/models/path_attn/modeling_path_attention.py``, ``_init_weights`` (lines 181-197): every
  Linear's and Conv1d's weight N(0, initializer_range = 0.02), every bias 0, so beta starts near 2 sigmoid(0) = 1.

Here: each layer has its own W_down, W_up, conv, b, c (``for_layer``), parameters of shape (n_layers, ...) drawn
from the encoding's own seed stream as every encoding's are; the layer's view for a forward
(``for_tokens``) holds w (B, H, T, D) and beta (B, H, T) of its hidden states (and, made once per forward for
every query chunk, each block's transforms and carried keys below), and its ``attention_logits``
computes each query chunk's logits exactly (``householder_logits``), as the authors' naive reference does: the
tokens in blocks of ``BLOCK`` (their chunk of 64); each block's H's in the UT form (``block_transforms``: one
triangular solve per block), which gives the pairs inside a block, keys carried to their block's end and queries
back to its start as matrix products; the block's product (D x D, per block, not per pair) carrying the queries
back across whole blocks. O(T^2 D (1 + D / BLOCK) + T BLOCK D) per head and T / BLOCK Python steps per chunk,
never a product per pair. A sink row
(``path+sink<S>+sw<W>``) applies the H of every token between a sink and the query, as the authors' cache
would (each cached key updated by every arriving token). The authors' Triton kernels are a faster route to the
same values on a GPU.

Deviations: the projections, conv, norm and logits run in float32 (float64 in a float64 model) where the
authors' layer runs them in bf16 with w and beta in float32; the positions a chunk reads are its token indices,
so a row that re-indexes positions (``+rand``) cannot wrap it (``batched_positions`` stays False). Nothing else:
no option changes the authors' defaults.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn

from posenc_bench.encodings.base import INIT_STD, TokenReading
from posenc_bench.encodings.registry import register

# The rank of the authors' low-rank w projection (``PaTHAttention``: nn.Linear(hidden_size, 32)), whatever C.
W_RANK = 32
# The kernel of the authors' short convolution on w (``conv_size=3``).
CONV_SIZE = 3
# The eps inside the authors' l2 norm of w (``fla/modules/l2norm.py``): w / sqrt(|w|^2 + eps).
L2_EPS = 1e-6
# Tokens per block of ``householder_logits`` (the authors' ``chunk_size``): Python steps per chunk ~ T / BLOCK.
BLOCK = 64


@register("path")
class PaTHAttention(TokenReading):
    """Per-layer Householder parameters: w's projections W_down (n_layers, 32, C) and W_up (n_layers, C, 32), its
    short convolution (n_layers, C, 3), beta's weight (n_layers, H, C) and bias (n_layers, H); the model asks each
    layer's view (``for_layer``, then ``for_tokens``) for that layer's transformations."""

    summary = "PaTH: data-dependent Householder transformations accumulated between key and query (no positions)"
    family = "contextual"
    paper = "Yang et al. 2025 (arXiv:2505.16381)"
    newer = True
    def __init__(self, *, d_model: int, n_heads: int, train_len: int, n_layers: int = 1) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len)
        self.n_layers = n_layers
        self.w_down = nn.Parameter(torch.randn(n_layers, W_RANK, d_model) * INIT_STD)  # (L, 32, C)
        self.w_up = nn.Parameter(torch.randn(n_layers, d_model, W_RANK) * INIT_STD)  # (L, C, 32)
        self.w_conv = nn.Parameter(torch.randn(n_layers, d_model, CONV_SIZE) * INIT_STD)  # (L, C, 3): oldest first
        self.beta_weight = nn.Parameter(torch.randn(n_layers, n_heads, d_model) * INIT_STD)  # (L, H, C)
        self.beta_bias = nn.Parameter(torch.zeros(n_layers, n_heads))  # (L, H): beta starts near 1

    def householder(self, x: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(w (B, H, T, D), beta (B, H, T)) of hidden states x (B, T, C) at attention layer ``layer``, in float32
        (float64 for float64 x): H_t = I - beta_t w_t w_t^T per head."""
        dtype = torch.promote_types(x.dtype, torch.float32)
        B, T, C = x.shape
        x = x.to(dtype)
        w = x @ self.w_down[layer].to(dtype).T @ self.w_up[layer].to(dtype).T  # (B, T, C)
        # causal depthwise conv over the tokens: (B, T, C) -> (B, C, T), padded left, cut to the first T outputs
        w = F.conv1d(w.transpose(1, 2), self.w_conv[layer].to(dtype)[:, None], padding=CONV_SIZE - 1, groups=C)
        w = F.silu(w[..., :T]).transpose(1, 2).reshape(B, T, self.n_heads, self.head_dim)  # (B, T, H, D)
        w = w * torch.rsqrt((w * w).sum(-1, keepdim=True) + L2_EPS)
        beta = 2 * torch.sigmoid(x @ self.beta_weight[layer].to(dtype).T + self.beta_bias[layer].to(dtype))  # (B, T, H)
        return w.transpose(1, 2), beta.transpose(1, 2)  # (B, H, T, D), (B, H, T)

    def read(self, x: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """w, beta and the forward's cache of block transforms and carried keys (``householder_logits``: made once
        per forward, not once per query chunk)."""
        return (*self.householder(x, layer), {})

    def logits_of(self, state: tuple[torch.Tensor, torch.Tensor, dict], q: torch.Tensor, k: torch.Tensor,
                  q_pos: torch.Tensor, k_pos: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
        if q_pos.dim() != 1 or k_pos.dim() != 1:
            raise ValueError(f"PaTH reads token indices: positions must be (q,) and (k,), got {tuple(q_pos.shape)} "
                             f"and {tuple(k_pos.shape)} (per-sequence positions, e.g. +rand, cannot wrap it)")
        w, beta, products = state
        return householder_logits(q, k, w, beta, q_pos, k_pos, BLOCK, products).float() * scale + mask


class Blocks(NamedTuple):
    """Each block's transformations in the UT form (``block_transforms``), every field (B, H, n, ...) by block."""

    w: torch.Tensor  # (B, H, n, L, D)
    wb: torch.Tensor  # W_b = diag(beta) W: (B, H, n, L, D)
    u: torch.Tensor  # U = (I + strictly_lower(W_b W^T))^{-1}: (B, H, n, L, L)
    uwb: torch.Tensor  # U W_b: (B, H, n, L, D)
    shift: torch.Tensor  # W^T U W_b, so that H_{a+L-1} ... H_a = I - shift: (B, H, n, D, D)

    def sub(self, blocks: slice) -> "Blocks":
        """The transformations of the blocks ``blocks`` (a slice of the block axis)."""
        return Blocks(*(t[:, :, blocks] for t in self))


def block_transforms(w: torch.Tensor, beta: torch.Tensor) -> Blocks:
    """Each block's transformations in the UT form of the authors' ``naive_path_attn`` (Joffrain, Low,
    Quintana-Orti, van de Geijn & Van Zee 2006, "Accumulating Householder transformations, revisited"), from the
    blocks' w (B, H, n, L, D) and beta (B, H, n, L), with W_b = diag(beta) W per block:

        U = (I + strictly_lower(W_b W^T))^{-1}   (B, H, n, L, L), unit lower triangular,
        H_{a+L-1} ... H_a = I - W^T U W_b        (B, H, n, D, D) as ``shift`` = W^T U W_b,

    with U W_b: what carrying keys to the block's end, queries back to its start and queries across whole
    blocks read (``_carry``, ``householder_logits``), made once per forward."""
    L = w.shape[-2]
    strict = torch.ones(L, L, dtype=torch.bool, device=w.device).tril(-1)
    eye = torch.eye(L, dtype=w.dtype, device=w.device)
    wb = w * beta[..., None]  # (B, H, n, L, D)
    u = torch.linalg.solve_triangular(eye + (wb @ w.transpose(-1, -2)) * strict, eye.expand(*w.shape[:-1], L),
                                      upper=False, unitriangular=True)  # (B, H, n, L, L)
    uwb = u @ wb  # (B, H, n, L, D)
    return Blocks(w, wb, u, uwb, w.transpose(-1, -2) @ uwb)


def _key_terms(keys: torch.Tensor, blocks: Blocks) -> torch.Tensor:
    """U strictly_lower(W_b K^T) (B, H, n, L, L) of keys (B, H, n, L, D) in their blocks: row r, column j holds
    what H_r ... (the transformations after key j in its block) take off along w_r."""
    L = keys.shape[-2]
    strict = torch.ones(L, L, dtype=torch.bool, device=keys.device).tril(-1)
    return blocks.u @ ((blocks.wb @ keys.transpose(-1, -2)) * strict)


def _carry(keys: torch.Tensor, blocks: Blocks, terms: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Each key carried to its block's end, H_{end} ... H_{j+1} k_j = k_j - W^T (column j of ``_key_terms``):
    keys (B, H, n, L, D) by their blocks' ``block_transforms``; ``terms``: their ``_key_terms``, where made."""
    terms = _key_terms(keys, blocks) if terms is None else terms
    return keys - terms.transpose(-1, -2) @ blocks.w


def _blocks_of(w: torch.Tensor, beta: torch.Tensor, start: int, n: int, block: int, dtype: torch.dtype
               ) -> Blocks:
    """``block_transforms`` of the n blocks from token ``start`` of w (B, H, T, D) and beta (B, H, T), the tokens
    past T padded with H = I (beta 0)."""
    B, H, T, D = w.shape
    end = min(start + n * block, T)
    w_b = F.pad(w[:, :, start:end].to(dtype), (0, 0, 0, start + n * block - end)).view(B, H, n, block, D)
    beta_b = F.pad(beta[:, :, start:end].to(dtype), (0, start + n * block - end)).view(B, H, n, block)
    return block_transforms(w_b, beta_b)


def householder_logits(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, beta: torch.Tensor,
                       q_pos: torch.Tensor, k_pos: torch.Tensor, block: int = BLOCK,
                       cache: Optional[dict] = None) -> torch.Tensor:
    """Logits q_i^T H_i ... H_{j+1} k_j (B, H, q, k), unscaled, of one query chunk: q (B, H, q, D) at token
    indices q_pos (q,) (consecutive), k (B, H, k, D) at token indices k_pos (k,) (ascending, below the chunk's
    end), from w (B, H, T, D) and beta (B, H, T) of the whole window. Entries of keys after their query are
    finite and meaningless (the mask hides them). ``cache``: the forward's (``read``), where the whole window's
    ``block_transforms`` and each whole block's carried keys are made once for all its query chunks, given in
    query order (else each chunk makes its range's: work growing with T per chunk, and the chunks' count with
    T^2 at a fixed mask budget)."""
    B, H, _, D = q.shape
    L, T = block, w.shape[2]
    first = int(k_pos.min()) // L * L  # the first token of the first key's block
    qe = int(q_pos[-1]) + 1
    nb = -(-(qe - first) // L)  # blocks in [first, first + nb L) (the last may run past qe)
    bq0 = (int(q_pos[0]) - first) // L  # the chunk's first query block
    nq = nb - bq0
    span = nb * L
    dtype = torch.promote_types(q.dtype, w.dtype)
    g0 = first // L  # the range's first block, counted from token 0
    # each block's transforms, of whole blocks (a query only reads rows up to its own, so the chunk's end cuts
    # nothing): the window's, made once per forward, or the range's
    if cache is None:
        blocks = _blocks_of(w, beta, first, nb, L, dtype)
    else:
        if ("blocks", L, dtype) not in cache:
            cache["blocks", L, dtype] = _blocks_of(w, beta, 0, -(-T // L), L, dtype)
        blocks = cache["blocks", L, dtype].sub(slice(g0, g0 + nb))
    # keys and queries placed at their tokens in the range, zero elsewhere: (B, H, nb, L, D)
    keys = q.new_zeros(B, H, span, D, dtype=dtype).index_copy(2, k_pos - first, k.to(dtype)).view(B, H, nb, L, D)
    queries = q.new_zeros(B, H, span, D, dtype=dtype).index_copy(2, q_pos - first, q.to(dtype))
    queries = queries.view(B, H, nb, L, D)[:, :, bq0:]  # (B, H, nq, L, D)
    # key j -> H_{end} ... H_{j+1} k_j, its block's end: (B, H, nb - 1, L, D), the blocks before the last query
    # block (the only ones read: each whole, with the same keys in every later chunk, or fewer of them)
    # valid for chunks in query order: a later chunk sees the same keys of a whole block, or fewer (a window)
    start, done, last = (cache or {}).get(("carried", L, dtype), (g0, keys[:, :, :0], -1))
    if start > g0 or start + done.shape[2] < g0 or int(q_pos[0]) <= last:  # start afresh
        start, done = g0, keys[:, :, :0]
    have = min(start + done.shape[2] - g0, nb - 1)  # this range's blocks already carried
    # ``_key_terms`` once for the blocks to carry now and the query blocks, which overlap in one chunk of every
    # query (training): (B, H, nb - lo, L, L)
    lo = min(have, bq0)
    terms = _key_terms(keys[:, :, lo:], blocks.sub(slice(lo, None)))
    if have < nb - 1:
        new = _carry(keys[:, :, have:nb - 1], blocks.sub(slice(have, nb - 1)), terms[:, :, have - lo:nb - 1 - lo])
        done = torch.cat([done, new], dim=2)
    if cache is not None:
        cache["carried", L, dtype] = (start, done, qe - 1)
    carried = done[:, :, g0 - start:g0 - start + nb - 1]
    # within each query block (the authors' ``A_local``): q_i^T k_j - (q_i^T W^T, up to row i) U strictly_lower
    # (W_b K^T); and each query back at its block's start a, H_i ... H_a q_i as a row: q_i - (q_i^T W^T) U W_b
    in_q = blocks.sub(slice(bq0, None))
    qw = (queries @ in_q.w.transpose(-1, -2)).tril()  # (B, H, nq, L, L)
    local = (queries @ keys[:, :, bq0:].transpose(-1, -2)).tril()
    parts = [local - qw @ terms[:, :, bq0 - lo:]]  # (B, H, nq, L, L)
    u = queries - qw @ in_q.uwb
    rows = q_pos - first - bq0 * L  # the chunk's queries among the query blocks' nq L rows
    if nq == 1:  # a chunk inside one block (eval's chunks of a few rows): only its rows go on across blocks
        parts[0], u = parts[0][:, :, :, rows], u[:, :, :, rows]  # (B, H, 1, q, L), (B, H, 1, q, D)
        rows = torch.arange(len(rows), device=q.device)
    # across blocks: key block d back, u moves through that block's H's: u (I - shift)
    shift = blocks.shift
    qblocks = torch.arange(nq, device=q.device) + bq0
    for d in range(1, bq0 + nq):
        kb = (qblocks - d).clamp(min=0)  # the key block d before each query block (clamped: never gathered)
        parts.append(u @ carried[:, :, kb].transpose(-1, -2))  # (B, H, nq, rows, L)
        u = u - u @ shift[:, :, kb]
    logits = torch.stack(parts, dim=-2).flatten(-2)  # (B, H, nq, rows, nd * L): query block, row, distance, offset
    # each key's column: distance = query block - key block, clamped to 0 for a later block (a hidden pair)
    rel = k_pos - first  # (k,)
    dist = (qblocks[:, None] - torch.div(rel, L, rounding_mode="floor")[None, :]).clamp(min=0)  # (nq, k)
    index = (dist * L + rel % L)[None, None, :, None, :].expand(B, H, nq, u.shape[3], -1)  # (B, H, nq, rows, k)
    logits = logits.gather(-1, index).flatten(2, 3)  # (B, H, nq rows, k)
    return logits[:, :, rows]
