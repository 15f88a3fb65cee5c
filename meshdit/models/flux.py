"""FLUX.1 (FluxTransformer2DModel): joint text+image attention, RoPE ids given as inputs."""
from ..parallel.plan import BlockList, PipelinePlan, Gather, SequencePlan, Split

# Text and image tokens are both sharded; ids are sharded like their tokens, so
# the RoPE table the model builds from cat(txt_ids, img_ids) matches the local
# tokens. Every attention (double and single blocks) sees [txt, img].
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

PIPELINE = PipelinePlan(blocks=(
    BlockList("transformer_blocks", ("hidden_states", "encoder_hidden_states"),
              ("encoder_hidden_states", "hidden_states")),
    BlockList("single_transformer_blocks", ("hidden_states", "encoder_hidden_states"),
              ("encoder_hidden_states", "hidden_states")),
))
