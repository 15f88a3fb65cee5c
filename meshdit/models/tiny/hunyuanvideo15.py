"""HunyuanVideo 1.5's tiny pipelines (CFG through its guider; image-to-video)."""
from __future__ import annotations

import torch

from . import GUARD_SIZE, GuardCase, TinyTests
from .parts import WORDS, sample_image


def qwen_tokenizer():
    """Word-level, built in code: its chat template puts exactly the 108 tokens HunyuanVideo 1.5's pipeline crops
    (prompt_template_encode_start_idx) before the prompt, so prompts survive the crop whole and leave padding."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens([AddedToken("<|im_start|>", normalized=False, special=True)])
    template = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ '<|im_start|> ' * 108 }}"
                "{% else %}{{ m['content'] }}{% endif %}{% endfor %}")
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", unk_token="<unk>",
                                   chat_template=template)


def qwen_text_model(hidden: int = 32):
    from transformers import Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel

    cfg = Qwen2_5_VLTextConfig(vocab_size=32, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=3,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                               rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]}, pad_token_id=0,
                               bos_token_id=None, eos_token_id=None)
    return Qwen2_5_VLTextModel(cfg).eval()


def byt5_text_model(d_model: int = 32):
    from transformers import T5Config, T5EncoderModel

    cfg = T5Config(vocab_size=384, d_model=d_model, d_ff=2 * d_model, d_kv=8, num_layers=1, num_heads=4,
                   relative_attention_num_buckets=8)  # ByT5's 256 bytes + 3 special tokens + 125 extra ids
    return T5EncoderModel(cfg).eval()


def tiny_hunyuanvideo15_pipeline(seed: int = 0, layers: int = 2, guidance_scale: float = 4.0,
                                 image_to_video: bool = False):
    """HunyuanVideo 1.5 text-to-video: Qwen2.5-VL text (1000 tokens) + ByT5 glyph text (256, for quoted text) +
    729 image tokens (all masked for text-to-video) after the video tokens; true CFG through its guider. Its VAE
    compresses 16 x 16 pixels and 4 frames (+1) as the real one does; with patch 1 tokens are 16 pixels wide.

    image_to_video: HunyuanVideo15ImageToVideoPipeline, with a tiny SigLIP vision encoder (32-pixel crops in 8-pixel
    patches: 16 image tokens, kept) and target_size 64, whose size buckets hold the tests' 48 x 80 and the guard's
    64 x 48 (the pipeline renders at the bucket of the image's aspect ratio)."""
    from diffusers import (AutoencoderKLHunyuanVideo15, ClassifierFreeGuidance, FlowMatchEulerDiscreteScheduler,
                           HunyuanVideo15ImageToVideoPipeline, HunyuanVideo15Pipeline,
                           HunyuanVideo15Transformer3DModel)
    from transformers import ByT5Tokenizer

    torch.manual_seed(seed)
    task = dict(task_type="i2v", target_size=64) if image_to_video else dict(task_type="t2v")
    transformer = HunyuanVideo15Transformer3DModel(
        in_channels=9, out_channels=4, num_attention_heads=4, attention_head_dim=8, num_layers=layers,
        num_refiner_layers=1, mlp_ratio=2.0, patch_size=1, patch_size_t=1, text_embed_dim=32, text_embed_2_dim=32,
        image_embed_dim=16, rope_axes_dim=(2, 2, 4), **task).eval()
    vae = AutoencoderKLHunyuanVideo15(latent_channels=4, block_out_channels=(8, 8, 8, 8, 8), layers_per_block=1,
                                      spatial_compression_ratio=16, temporal_compression_ratio=4).eval()
    parts = dict(text_encoder=qwen_text_model(32), tokenizer=qwen_tokenizer(), transformer=transformer, vae=vae,
                 scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0), text_encoder_2=byt5_text_model(32),
                 tokenizer_2=ByT5Tokenizer(), guider=ClassifierFreeGuidance(guidance_scale=guidance_scale))
    if not image_to_video:
        return HunyuanVideo15Pipeline(**parts)
    from transformers import SiglipImageProcessor, SiglipVisionConfig, SiglipVisionModel

    encoder = SiglipVisionModel(SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                                   num_attention_heads=2, image_size=32, patch_size=8)).eval()
    return HunyuanVideo15ImageToVideoPipeline(**parts, image_encoder=encoder, feature_extractor=SiglipImageProcessor(
        size={"height": 32, "width": 32}))


BUILDERS = {
    "hunyuanvideo15": tiny_hunyuanvideo15_pipeline,
    "hunyuanvideo15-nocfg": lambda seed=0: tiny_hunyuanvideo15_pipeline(seed, guidance_scale=1.0),
    "hunyuanvideo15-4blocks": lambda seed=0: tiny_hunyuanvideo15_pipeline(seed, layers=4),
    "hunyuanvideo15-i2v": lambda seed=0: tiny_hunyuanvideo15_pipeline(seed, image_to_video=True),
    "hunyuanvideo15-i2v-4blocks": lambda seed=0: tiny_hunyuanvideo15_pipeline(seed, layers=4, image_to_video=True),
}
# tests/models/test_hunyuanvideo15.py: its query x key mask under every exact layout
TESTS = TinyTests(main="hunyuanvideo15", four_blocks="hunyuanvideo15-4blocks", layouts=())
PROMPT15 = 'a red cat saying "hi"'  # quoted text: ByT5 encodes it too
GUARD_CASES = {
    # 1000 Qwen + 256 ByT5 (the quoted glyph text) + 729 image tokens, padding masked; CFG through the pipeline's
    # guider, whose scale (4.0) meshdit takes as its default (None); scale 1: one branch
    "hunyuanvideo15": GuardCase("hunyuanvideo15", dict(prompt=PROMPT15, num_frames=5), None),
    "hunyuanvideo15-no-cfg": GuardCase("hunyuanvideo15-nocfg", dict(prompt=PROMPT15, num_frames=5), None),
    # image-to-video: SigLIP's 16 image tokens (kept) lead the text, the first frame's latents and mask join the
    # channels; the pipeline takes no size but the bucket of the image's aspect ratio, here GUARD_SIZE's 64 x 48
    "hunyuanvideo15-i2v": GuardCase("hunyuanvideo15-i2v", dict(
        prompt=PROMPT15, num_frames=5, image=sample_image(GUARD_SIZE["height"], GUARD_SIZE["width"])), None),
}


def diffusers_test_inputs(config, d) -> dict:
    """diffusers' test_models_transformer_hunyuan_1_5.py: 1 frame of 8 x 8, 6 + 4 text tokens, 3 image tokens."""
    b = d.batch
    return dict(hidden_states=d.randn(b, config.in_channels, 1, 8, 8), timestep=d.ones(),
                encoder_hidden_states=d.randn(b, 6, config.text_embed_dim),
                encoder_hidden_states_2=d.randn(b, 4, config.text_embed_2_dim),
                encoder_attention_mask=torch.ones(b, 6), encoder_attention_mask_2=torch.ones(b, 4),
                image_embeds=torch.zeros(b, 3, config.image_embed_dim))
