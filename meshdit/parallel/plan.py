"""Declarative per-model plans: what to split, what to gather, what each attention sees.

A plan names modules by their path inside the transformer ("" is the
transformer itself) and never touches model code: shared hooks apply it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

OUTPUT = "<output>"
"""Split.arg value meaning: split the module's output, not an input."""

LOCAL = "local"
"""Attention value meaning: no communication (e.g. cross-attention to replicated text)."""


@dataclass(frozen=True)
class Split:
    """Shard a tensor along the sequence across the SP ranks, as token stream `stream`.

    A tuple or list input (e.g. rotary embeddings as (cos, sin)) has each of its tensors sharded alike."""

    module: str
    """The module's path; a glob ("layers.*": the list's items, not deeper) hooks every module it matches, for an
    input the model's forward passes whole to every block (Z-Image's rotary freqs and token masks)."""
    arg: str  # forward argument name, or OUTPUT
    dim: int  # sequence dim (negative counts from the end, so batched and unbatched ids both work)
    stream: str  # e.g. "img", "txt": attention layers name the streams their sequence holds
    table: bool = False
    """A per-token table the model broadcasts (rotary embeddings): of size 1 on `dim`, its one row serves every
    token, so each rank and PipeFusion patch keeps it whole (HunyuanDiT's rotary grid of 1 x 1). A stream's own
    tokens are never a table: one text token is still split, as the stream it is."""
    expected_dims: int | None = None
    """Split only a tensor of this many dims and pass any other whole (diffusers' ContextParallelInput.expected_dims):
    Wan's timestep is [B, S], one per token, under Wan 2.2 TI2V's expand_timesteps, and [B] (no tokens) otherwise."""
    item: int | None = None
    """Of a tuple or list input or output: split only this item, the others stay whole (Qwen-Image's rope returns
    (image freqs, text freqs) and its text is held whole). None: every item alike."""
    rows: bool = False
    """`dim` holds the token rows of a [..., rows, columns] latent grid (one token per latent pixel: patch size 1),
    split into bands of whole rows, so grid-shaped work inside the model (SANA's 3x3 conv, with a RowHalo) sees a
    band and the model reads its height from the band. The stream's lengths are then kept in rows (its tokens:
    `token_lens`); a PipeFusion patch window (in tokens) is converted to rows."""
    band_tokens: bool = False
    """`dim` holds the tokens (rows x columns, flattened) of a `rows` stream split before it in the plan: cut into
    this rank's band's tokens (the stream's `token_lens`), recording no lengths (SANA's ControlNet residuals
    [B, h * w, D] beside its row bands)."""


@dataclass(frozen=True)
class MaskedTail:
    """Attention value: the module's q/k/v are `streams` (split over the SP ranks) followed by `tail`, a stream
    every SP rank holds whole, whose padding the module's boolean key mask hides (HunyuanVideo: the prompt after
    the video tokens, its padding masked). Sequence parallelism drops the masked tail tokens (they weigh exactly
    0), deals the kept ones out over the SP ranks for the attention and gathers their outputs back, so the tail
    stays whole on every rank; masked positions come back as zeros, which is exact wherever nothing reads them
    but masked keys (the mask hides them from every query)."""

    streams: tuple[str, ...]
    tail: str
    leading: bool = False
    """The whole stream comes first in q/k/v ([tail, streams]: Qwen-Image's [text, image]); the attention reorders
    the tokens to [streams, tail] (keys in any order give the same attention) and the output back."""


@dataclass(frozen=True)
class TokenMask:
    """Attention value: the module's q/k/v are `streams` (each split over the SP ranks, in this order) and its SDPA
    mask is one token mask applied to queries and keys alike, `m_i * m_j` over the streams' whole tokens in this
    order ([B, 1, N, N], N every stream's whole length: the model builds it from an unsplit [B, N] mask). Chroma's
    mask is a float 0/1 one, which SDPA adds to the scores (diffusers 0.42: a pair of kept tokens scores +1, any
    other pair +0; padding is down-weighted, not hidden). Sequence parallelism folds that bias into q and k: one
    extra channel per head, m_i / scale on the queries and m_j on the keys (values 0), so the plain unmasked
    attention (USP, or PipeFusion's stale K/V, which keep that channel with the keys) scores exactly
    q.k * scale + m_i * m_j. A boolean mask is refused there."""

    streams: tuple[str, ...]


@dataclass(frozen=True)
class KeyMask:
    """Attention value: the module's q/k/v are `streams` (each split over the SP ranks), and its SDPA mask, where it
    passes one, is a boolean key mask [B or 1, 1, 1, N] over the streams' whole tokens (Z-Image: a batch whose
    samples' sequences differ in length pads the shorter ones and masks that padding). Unmasked calls take the
    plain sequence-parallel attention; a masked one gathers K/V over the SP ranks and attends this rank's queries
    under the whole mask (one process's computation row for row; its traffic is ring attention's, not overlapped)."""

    streams: tuple[str, ...]


@dataclass(frozen=True)
class NotSdpa:
    """Attention value: the module computes attention without torch's SDPA, so the SDPA router never sees it,
    and `exchange` makes it sequence-parallel instead. The case in view is linear attention (SANA): its output
    phi(Q) (phi(K)^T V) / (phi(Q) phi(K)^T 1) needs from the other SP ranks only the K.V summary
    phi(K)^T V [B, H, D, D] and the key sum phi(K)^T 1 [B, H, D], summed over tokens, so what travels is an
    all-reduce of a fixed-size summary, not the K/V sequence.

    `exchange(module, state, path, streams) -> hook handles` is called by the sequence hooks for every attention
    module the glob matches (`state`: the hooks' sequence state, with the SP group, the streams' per-rank lengths and,
    under PipeFusion, the patch window, whose stale summary the exchange must then keep or refuse). The seam
    guard expects such a module NOT to call torch's SDPA (the run stops naming it: that call would attend over
    this rank's shard only) but to pass through its exchange: whatever the exchange installs calls
    `attention.router.note_exchanged()` while the module runs, else the guard stops the run naming the module.
    SANA's linear attention uses it (attention/linear.py)."""

    streams: tuple[str, ...]
    exchange: Callable


@dataclass(frozen=True)
class RowHalo:
    """A module (glob) over a rows-split stream's grid [B, C, rows, W] whose output row i reads input rows
    i - `rows` .. i + `rows` (zeros beyond the image: a conv's padding) and is otherwise per pixel (SANA's Mix-FFN:
    1x1 conv, depthwise 3x3 conv, 1x1 conv). The sequence hooks give each rank's band its neighbours' `rows` rows
    before the module (comm.exchange_with_neighbours over the SP group) and trim them off its output, so every
    band equals its rows of the whole image. Under PipeFusion the rows beyond a patch are the module's input as
    last computed (kept per layer and branch, like stale K/V): exact with full warmup."""

    module: str
    stream: str
    rows: int = 1


@dataclass(frozen=True)
class Gather:
    """Reassemble a module's output (sharded as `stream`) on every SP rank."""

    module: str  # "" gathers the transformer's own output (its first tensor where it returns a tuple)
    dim: int
    stream: str


@dataclass(frozen=True)
class SequencePlan:
    splits: tuple[Split, ...]
    gathers: tuple[Gather, ...]
    attention: dict[str, tuple[str, ...] | str | MaskedTail | TokenMask | KeyMask | NotSdpa] = field(
        default_factory=dict)
    """Glob over attention module paths -> the streams their q/k/v sequence
    concatenates (any order), LOCAL, a MaskedTail, a TokenMask, or NotSdpa. First match wins; every attention module
    in the transformer must match one glob. Every module given streams, a MaskedTail or a TokenMask must call torch's
    SDPA whenever it runs (the router checks it on every forward); one that attends another way is NotSdpa."""
    halos: tuple[RowHalo, ...] = ()


@dataclass(frozen=True)
class BlockList:
    """A transformer block list PipeFusion splits into stages, and how activations flow through it."""

    path: str  # the ModuleList, e.g. "transformer_blocks"
    carry: tuple[str, ...]  # block inputs that carry the activations from block to block
    returns: tuple[str, ...] | str  # what a block returns, named by carry inputs: a tuple, or one tensor
    long_skips: Callable[[int], tuple[tuple[int, int], ...]] | None = None
    """Skip connections the model's forward keeps between blocks of this list (HunyuanDiT's U-Net-like
    skips): given the list's length, (source, target) pairs meaning "block source's output also feeds
    block target". PipeFusion sends such an output to the stage that holds the target."""


@dataclass(frozen=True)
class StagePlan:
    """Block lists in execution order; their concatenation is cut into contiguous stages."""

    blocks: tuple[BlockList, ...]


COLUMN = "column"
"""TensorPlan style: the Linear's output features are split over the tp ranks (Q/K/V, MLP-in)."""

ROW = "row"
"""TensorPlan style: the Linear's input features are split over the tp ranks and its output all-reduced (attention
out, MLP-out); its bias is added once, after the all-reduce."""


GATHERED = "gathered"
"""TensorPlan style: the Linear's output features are split over the tp ranks and all-gathered after it, for a
per-sample projection whose whole output every rank needs (adaLN modulation [B, 6D]: a few kilobytes per block,
against the megabytes of a row-parallel all-reduce of [B, S, D]), so its weight is not held whole on every rank."""


ACROSS_HEADS = "across-heads"
"""TensorPlan style of an RMSNorm over a COLUMN-split feature dimension (Wan's Q/K norm over all heads,
`rms_norm_across_heads`): its weight is split like the Linear before it, and the sum of squares is all-reduced over
the tp ranks ([B, S, 1] per call), so every rank normalises by the whole vector's mean square."""


@dataclass(frozen=True)
class Packed:
    """TensorPlan style of a fused Linear whose split dimension concatenates several projections (FLUX.1's single
    block `proj_out` reads cat(attention, MLP)): `blocks` are their proportions (e.g. (1, 4)); each block is split
    on its own, as the Linear that made it was. None: the Linear's own `_tp_packed_col_blocks` /
    `_tp_packed_row_blocks` (where diffusers' models store them)."""

    style: str  # COLUMN or ROW
    blocks: tuple[int, ...] | None = None


@dataclass(frozen=True)
class TensorPlan:
    """Tensor parallelism: glob over Linear paths inside the stage plan's block lists -> COLUMN, ROW, GATHERED or
    Packed (and RMSNorm paths -> ACROSS_HEADS).

    Attention heads split over the tp ranks by whole heads (uneven where they must be: a rank may hold one head
    more); a column split of a Linear inside an attention module keeps whole heads, and any width divisible by the
    head count is split in the same proportion, so a ROW Linear reads exactly the features its producers made.
    Every attention module holding a COLUMN Linear attends over its local heads. Families whose transformer
    carries diffusers' `_tp_plan` need none: parallel/tensor.py reads that."""

    styles: dict[str, str | Packed] = field(default_factory=dict)
    gathered: tuple[str, ...] = ()
    """Globs of GATHERED Linears added to a plan read from the model's `_tp_plan` (which leaves the modulation
    whole on every rank)."""


@dataclass(frozen=True)
class ModelPlan:
    """Everything `parallelize` needs to know about a transformer: its sequence plan and its stage plan, and,
    for a family whose transformer carries no `_tp_plan`, its tensor plan (None: the model's own, if any)."""

    sequence: SequencePlan
    stages: StagePlan
    tensor: TensorPlan | None = None
