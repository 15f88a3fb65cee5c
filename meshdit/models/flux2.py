"""FLUX.2 (Flux2Transformer2DModel): like FLUX.1, with batched [B, S, 4] position ids."""
from ..parallel.plan import BlockList, PipelinePlan
from .flux import PLAN  # noqa: F401 - the same streams; dims count from the end, so batched ids split alike

# Between the lists the model concatenates [txt, img] into one stream for the single blocks.
PIPELINE = PipelinePlan(blocks=(
    BlockList("transformer_blocks", ("hidden_states", "encoder_hidden_states"),
              ("encoder_hidden_states", "hidden_states")),
    BlockList("single_transformer_blocks", ("hidden_states",), "hidden_states"),
))
