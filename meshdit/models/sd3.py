"""SD3 / SD3.5 (SD3Transformer2DModel): joint attention, plus image-only attn2 in dual-attention blocks."""
from ..parallel.plan import BlockList, PipelinePlan, OUTPUT, Gather, SequencePlan, Split

# The latent is patchified inside forward, so tokens are sharded at the outputs
# of the patch embedding (which adds the positional embedding) and the text
# projection, and gathered before the model unpatchifies.
PLAN = SequencePlan(
    splits=(
        Split("pos_embed", OUTPUT, -2, "img"),
        Split("context_embedder", OUTPUT, -2, "txt"),
    ),
    gathers=(Gather("proj_out", -2, "img"),),
    attention={
        "transformer_blocks.*.attn2": ("img",),
        "transformer_blocks.*.attn": ("img", "txt"),
    },
)

PIPELINE = PipelinePlan(blocks=(
    BlockList("transformer_blocks", ("hidden_states", "encoder_hidden_states"),
              ("encoder_hidden_states", "hidden_states")),
))
