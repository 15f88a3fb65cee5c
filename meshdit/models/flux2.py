"""FLUX.2 (Flux2Transformer2DModel): like FLUX.1, with batched [B, S, 4] position ids."""
from ..parallel.plan import Gather, SequencePlan, Split

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
