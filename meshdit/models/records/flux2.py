"""FLUX.2: packed latents, guidance-distilled; SwiGLU double- and single-stream blocks, their modulation shared
outside the blocks."""
from ..record import BlockKind, CallArguments, CostModel, Defaults, Guidance, ModelFamily, Modules, Parallel

RECORD = ModelFamily(
    "flux2", "Flux2Transformer2DModel", ("Flux2Pipeline",), packed=True, modules=Modules.of("flux2"),
    defaults=Defaults(steps=50, guidance=4.0, max_sequence_length=512, sample_size=128),
    guidance=Guidance(distilled=True),
    call_arguments=CallArguments(taken=("prompt_embeds",)),
    parallel=Parallel(tensor=True),
    costs=CostModel(BlockKind.SWIGLU_DOUBLE_SINGLE, joint_attention=True,
                    config_keys=("attention_head_dim", "num_layers")))
