"""HunyuanVideo's tiny pipelines (guidance-distilled, or true CFG; image-to-video)."""
from __future__ import annotations

import torch

from . import GUARD_PROMPT, GUARD_SIZE, GUARD_TEXT, GuardCase, TinyTests
from .parts import WORDS, clip_text_model, clip_tokenizer, sample_image


def llama_tokenizer(image_token: bool = False):
    """Word-level, built in code: HunyuanVideo's prompt template comes to exactly the 95 tokens before the
    prompt that the pipeline crops (its crop_start, counted with Llama's tokenizer), so prompts survive the
    crop whole and short ones leave padding (masked) within max_sequence_length. image_token: LLaVA's "<image>"
    too (the image-to-video template puts it at position 5, as the pipeline's image_emb_start says; its template
    comes to 104 tokens before the prompt, one more than its crop_start, so one template token stays)."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True)
                                  for t in ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "\n")
                                  + ("<image>",) * image_token])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", unk_token="<unk>")


def llama_text_model(hidden: int = 32):
    from transformers import LlamaConfig, LlamaModel

    cfg = LlamaConfig(vocab_size=32, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, pad_token_id=0)
    return LlamaModel(cfg).eval()


def tiny_hunyuanvideo_pipeline(seed: int = 0, double: int = 1, single: int = 1, guidance_embeds: bool = True):
    """HunyuanVideo text-to-video: guidance-distilled like the released model (guidance_embeds=False: true
    CFG with a negative prompt). Its VAE compresses 8 x 8 pixels and 4 frames (+1 for the first) as the real
    one does, so with patch 2 tokens are 16 pixels wide, as Wan's; the text is Llama (hidden states) + CLIP
    (pooled)."""
    from diffusers import (AutoencoderKLHunyuanVideo, FlowMatchEulerDiscreteScheduler, HunyuanVideoPipeline,
                           HunyuanVideoTransformer3DModel)

    torch.manual_seed(seed)
    transformer = HunyuanVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=4, attention_head_dim=8, num_layers=double,
        num_single_layers=single, num_refiner_layers=1, mlp_ratio=2.0, patch_size=2, patch_size_t=1,
        guidance_embeds=guidance_embeds, text_embed_dim=32, pooled_projection_dim=16, rope_axes_dim=(2, 2, 4),
    ).eval()
    vae = AutoencoderKLHunyuanVideo(
        block_out_channels=(8, 8, 8, 8), latent_channels=4, layers_per_block=1, norm_num_groups=4,
        temporal_compression_ratio=4, spatial_compression_ratio=8,
        down_block_types=("HunyuanVideoDownBlock3D",) * 4, up_block_types=("HunyuanVideoUpBlock3D",) * 4).eval()
    return HunyuanVideoPipeline(
        text_encoder=llama_text_model(32), tokenizer=llama_tokenizer(), transformer=transformer, vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), text_encoder_2=clip_text_model(),
        tokenizer_2=clip_tokenizer())


def llava_text_model(tokenizer, hidden: int = 32):
    """LLaVA: llama_text_model's Llama and a tiny CLIP vision tower whose 336-pixel crops in 14-pixel patches give the
    576 image features of the pipeline's default prompt template (image_emb_len), as LLaVA-Llama-3's do."""
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration

    vision = CLIPVisionConfig(hidden_size=8, intermediate_size=16, projection_dim=8, num_attention_heads=2,
                              num_hidden_layers=2, image_size=336, patch_size=14)
    config = LlavaConfig(vision_config=vision, text_config=llama_text_model(hidden).config,
                         image_token_index=tokenizer.convert_tokens_to_ids("<image>"), pad_token_id=0)
    return LlavaForConditionalGeneration(config).eval()


def tiny_hunyuanvideo_i2v_pipeline(seed: int = 0, double: int = 1, single: int = 1):
    """HunyuanVideo image-to-video as diffusers' test builds it (image_condition_type "latent_concat", no
    guidance_embeds: true CFG with a negative prompt and a black image), at tiny_hunyuanvideo_pipeline's sizes:
    4 noise + 4 image-latent + 1 mask input channels; the text encoder is LLaVA (it sees the image: 576 / 2 image
    tokens before the prompt's)."""
    from diffusers import (FlowMatchEulerDiscreteScheduler, HunyuanVideoImageToVideoPipeline,
                           HunyuanVideoTransformer3DModel)
    from transformers import CLIPImageProcessor

    torch.manual_seed(seed)
    transformer = HunyuanVideoTransformer3DModel(
        in_channels=2 * 4 + 1, out_channels=4, num_attention_heads=4, attention_head_dim=8, num_layers=double,
        num_single_layers=single, num_refiner_layers=1, mlp_ratio=2.0, patch_size=2, patch_size_t=1,
        guidance_embeds=False, text_embed_dim=32, pooled_projection_dim=16, rope_axes_dim=(2, 2, 4),
        image_condition_type="latent_concat",
    ).eval()
    vae = tiny_hunyuanvideo_pipeline(seed).vae
    tokenizer = llama_tokenizer(image_token=True)
    return HunyuanVideoImageToVideoPipeline(
        text_encoder=llava_text_model(tokenizer, 32), tokenizer=tokenizer, transformer=transformer, vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), text_encoder_2=clip_text_model(),
        tokenizer_2=clip_tokenizer(), image_processor=CLIPImageProcessor(crop_size=336, size=336))


BUILDERS = {
    "hunyuanvideo": tiny_hunyuanvideo_pipeline,
    "hunyuanvideo-cfg": lambda seed=0: tiny_hunyuanvideo_pipeline(seed, guidance_embeds=False),
    "hunyuanvideo-4blocks": lambda seed=0: tiny_hunyuanvideo_pipeline(seed, double=2, single=2),
    "hunyuanvideo-i2v": tiny_hunyuanvideo_i2v_pipeline,
    "hunyuanvideo-i2v-4blocks": lambda seed=0: tiny_hunyuanvideo_i2v_pipeline(seed, double=2, single=2),
}
# tests/models/test_hunyuanvideo.py: its masked prompt under every exact layout
TESTS = TinyTests(main="hunyuanvideo", four_blocks="hunyuanvideo-4blocks", layouts=())
_VIDEO = dict(prompt=GUARD_PROMPT, num_frames=5, max_sequence_length=GUARD_TEXT)
_TEMPLATE = {"template": "{}", "crop_start": 0}
_I2V = dict(prompt=GUARD_PROMPT, num_frames=9, max_sequence_length=GUARD_TEXT,
            image=sample_image(GUARD_SIZE["height"], GUARD_SIZE["width"]))
GUARD_CASES = {
    # the prompt (8 of 16 text tokens kept, the rest masked) joins every attention; distilled (embedded
    # guidance), or without guidance_embeds true CFG with a negative prompt
    "hunyuanvideo": GuardCase("hunyuanvideo", dict(_VIDEO, guidance_scale=6.0), 6.0),
    # the prompt_template of diffusers' own HunyuanVideo tests (meshdit: --extra prompt_template=...)
    "hunyuanvideo-prompt-template": GuardCase("hunyuanvideo", dict(_VIDEO, guidance_scale=6.0,
                                                                   prompt_template=_TEMPLATE), 6.0,
                                              {"prompt_template": _TEMPLATE}),
    "hunyuanvideo-true-cfg": GuardCase("hunyuanvideo-cfg", dict(_VIDEO, negative_prompt="", true_cfg_scale=3.0), 3.0),
    # image-to-video: LLaVA's 288 image tokens (kept) before the prompt's, the image's latents in the channels, the
    # first 4 decoded frames dropped; one branch at the pipeline's default guidance (1.0), or true CFG (the
    # negative prompt with a black image). max_sequence_length 16: the prompt and the template's assistant header
    # fit (shorter, the pipeline crops other tokens)
    "hunyuanvideo-i2v": GuardCase("hunyuanvideo-i2v", dict(_I2V), None),
    "hunyuanvideo-i2v-true-cfg": GuardCase("hunyuanvideo-i2v", dict(_I2V, negative_prompt="", true_cfg_scale=3.0),
                                           3.0),
}


def diffusers_test_inputs(config, d) -> dict:
    """diffusers' test_models_transformer_hunyuan_video.py: 1 frame of 16 x 16, 12 text tokens."""
    b = d.batch
    inputs = dict(hidden_states=d.randn(b, config.in_channels, 1, 16, 16), timestep=d.steps().float(),
                  encoder_hidden_states=d.randn(b, 12, config.text_embed_dim),
                  pooled_projections=d.randn(b, config.pooled_projection_dim), encoder_attention_mask=torch.ones(b, 12))
    if config.guidance_embeds:
        inputs["guidance"] = d.steps().float()
    return inputs
