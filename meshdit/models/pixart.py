"""PixArt-α / Σ (PixArtTransformer2DModel): image self-attention, cross-attention to text."""
from ..parallel.plan import BlockList, PipelinePlan, LOCAL, OUTPUT, Gather, SequencePlan, Split

# Text stays whole on every rank: cross-attention needs no communication, and
# its padding mask applies unchanged.
PLAN = SequencePlan(
    splits=(Split("pos_embed", OUTPUT, -2, "img"),),
    gathers=(Gather("proj_out", -2, "img"),),
    attention={
        "transformer_blocks.*.attn1": ("img",),
        "transformer_blocks.*.attn2": LOCAL,
    },
)

PIPELINE = PipelinePlan(blocks=(BlockList("transformer_blocks", ("hidden_states",), "hidden_states"),))
