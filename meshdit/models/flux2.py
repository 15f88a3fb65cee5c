"""FLUX.2 (Flux2Transformer2DModel): like FLUX.1, with batched [B, S, 4] position ids."""
from ..parallel.plan import BlockList, PipelinePlan, Gather, SequencePlan, Split

PLAN = SequencePlan(
    splits=(
        Split("", "hidden_states", -2, "img"),
        Split("", "encoder_hidden_states", -2, "txt"),
        Split("", "img_ids", -2, "img"),
        Split("", "txt_ids", -2, "txt"),
    ),
    gathers=(Gather("proj_out", -2, "img"),),
    attention={"*": ("txt", "img")},
)

# Between the lists the model concatenates [txt, img] into one stream for the single blocks.
PIPELINE = PipelinePlan(blocks=(
    BlockList("transformer_blocks", ("hidden_states", "encoder_hidden_states"),
              ("encoder_hidden_states", "hidden_states")),
    BlockList("single_transformer_blocks", ("hidden_states",), "hidden_states"),
))
