"""HunyuanVideo's tiny pipelines (guidance-distilled, or true CFG)."""
from __future__ import annotations

import torch

from . import GUARD_PROMPT, GUARD_TEXT, GuardCase, TinyTests
from .parts import WORDS, clip_text_model, clip_tokenizer


def llama_tokenizer():
    """Word-level, built in code: HunyuanVideo's prompt template comes to exactly the 95 tokens before the
    prompt that the pipeline crops (its crop_start, counted with Llama's tokenizer), so prompts survive the
    crop whole and short ones leave padding (masked) within max_sequence_length."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True)
                                  for t in ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "\n")])
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


BUILDERS = {
    "hunyuanvideo": tiny_hunyuanvideo_pipeline,
    "hunyuanvideo-cfg": lambda seed=0: tiny_hunyuanvideo_pipeline(seed, guidance_embeds=False),
    "hunyuanvideo-4blocks": lambda seed=0: tiny_hunyuanvideo_pipeline(seed, double=2, single=2),
}
# tests/models/test_hunyuanvideo.py: its masked prompt under every exact layout
TESTS = TinyTests(main="hunyuanvideo", four_blocks="hunyuanvideo-4blocks", layouts=())
_VIDEO = dict(prompt=GUARD_PROMPT, num_frames=5, max_sequence_length=GUARD_TEXT)
_TEMPLATE = {"template": "{}", "crop_start": 0}
GUARD_CASES = {
    # the prompt (8 of 16 text tokens kept, the rest masked) joins every attention; distilled (embedded
    # guidance), or without guidance_embeds true CFG with a negative prompt
    "hunyuanvideo": GuardCase("hunyuanvideo", dict(_VIDEO, guidance_scale=6.0), 6.0),
    # the prompt_template of diffusers' own HunyuanVideo tests (meshdit: --extra prompt_template=...)
    "hunyuanvideo-prompt-template": GuardCase("hunyuanvideo", dict(_VIDEO, guidance_scale=6.0,
                                                                   prompt_template=_TEMPLATE), 6.0,
                                              {"prompt_template": _TEMPLATE}),
    "hunyuanvideo-true-cfg": GuardCase("hunyuanvideo-cfg", dict(_VIDEO, negative_prompt="", true_cfg_scale=3.0), 3.0),
}
