"""Qwen-Image text-to-image and editing: true CFG (--guidance-scale is true_cfg_scale) with a negative prompt (""
by default); the edit pipeline's input image joins the text encoder's input and the image stream's tokens.
Double-stream blocks only."""
from ..record import (BlockKind, CostModel, Defaults, Guidance, ImageInput, ModelFamily, Modules, Parallel, Refusals,
                      TextLength)

RECORD = ModelFamily(
    "qwenimage", "QwenImageTransformer2DModel", ("QwenImagePipeline", "QwenImageEditPipeline"), packed=True,
    modules=Modules.of("qwenimage"),
    defaults=Defaults(steps=50, guidance=4.0, max_sequence_length=512, sample_size=128),
    text=TextLength(limit=1024),
    guidance=Guidance(argument="true_cfg_scale", true_cfg_needs_negative_prompt=True),
    images=ImageInput(edit_pipelines=("QwenImageEditPipeline",),
                      tokens_after_grid_pipelines=("QwenImageEditPipeline",)),
    refusals=Refusals(transformer_config={
        "zero_cond_t": "Qwen-Image-Edit-2511's per-token modulation index, which the plan does not split",
        "use_layer3d_rope": "Qwen-Image-Layered's layered rotary embeddings",
        "guidance_embeds": "a guidance-distilled Qwen-Image, which no released model is"}),
    parallel=Parallel(tensor=True),
    costs=CostModel(BlockKind.DOUBLE_SINGLE, joint_attention=True))
