"""Qwen-Image's tiny pipelines: text-to-image (QwenImagePipeline) and editing (QwenImageEditPipeline).

diffusers' own test configs (tests/pipelines/qwenimage/test_qwenimage*.py) with 4 heads instead of 3 (Ulysses 4),
a VAE compressing 8 x 8 pixels as the real one does (the edit pipeline resizes its input to about 1024 x 1024
pixels, which a 4x VAE would make 16384 reference tokens), and a word-level tokenizer and Qwen2-VL processor
built in code instead of the Hub's tiny ones.
"""
from __future__ import annotations

import torch

from . import GUARD_PROMPT, GUARD_TEXT, GuardCase, TinyTests
from .parts import WORDS, sample_image

SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
           "<|video_pad|>")
VOCAB = {**{token: i for i, token in enumerate(SPECIAL)}, "<unk>": len(SPECIAL), "\n": len(SPECIAL) + 1,
         **{w: len(SPECIAL) + 2 + i for i, w in enumerate(WORDS)}}


def qwen_tokenizer():
    """Word-level, newlines as tokens of their own: the text-to-image template then puts exactly the 34 tokens the
    pipeline crops (prompt_template_encode_start_idx) before the prompt."""
    from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(VOCAB, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([  # newlines isolated, spaces dropped, punctuation alone
        pre_tokenizers.Split(Regex(r"\n"), "isolated"), pre_tokenizers.Split(Regex(r" "), "removed"),
        pre_tokenizers.Split(Regex(r"[^\w\n]"), "isolated")])
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIAL])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<|endoftext|>", unk_token="<unk>")


def qwen_vl_model(seed: int = 0):
    """diffusers' test config (Qwen2.5-VL, hidden 16), its vocabulary and vision tokens those of qwen_tokenizer."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(seed)
    config = Qwen2_5_VLConfig(
        text_config={"hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
                     "num_key_value_heads": 2, "vocab_size": len(VOCAB), "rope_theta": 1000000.0,
                     "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"}},
        vision_config={"depth": 2, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2, "out_hidden_size": 16},
        hidden_size=16, vocab_size=len(VOCAB), vision_start_token_id=VOCAB["<|vision_start|>"],
        vision_end_token_id=VOCAB["<|vision_end|>"], image_token_id=VOCAB["<|image_pad|>"],
        video_token_id=VOCAB["<|video_pad|>"])
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def qwen_vl_processor():
    """Qwen2-VL's processor with the tiny tokenizer; at most 56 x 56 pixels (4 merged image tokens) per image.

    Without a video processor (transformers 5's needs torchvision; the edit pipeline never uses it): see
    models/qwen_vl_processor.py, which also saves it and loads it back."""
    from transformers import Qwen2VLImageProcessor

    from ..qwen_vl_processor import image_only_processor

    return image_only_processor(Qwen2VLImageProcessor(min_pixels=28 * 28, max_pixels=56 * 56), qwen_tokenizer())


def tiny_qwenimage_pipeline(seed: int = 0, layers: int = 2, edit: bool = False, heads: int = 4):
    from diffusers import (AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageEditPipeline,
                           QwenImagePipeline, QwenImageTransformer2DModel)

    torch.manual_seed(seed)
    transformer = QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=layers, attention_head_dim=16,
        num_attention_heads=heads, joint_attention_dim=16, guidance_embeds=False, axes_dims_rope=(8, 4, 4)).eval()
    torch.manual_seed(seed)
    vae = AutoencoderKLQwenImage(base_dim=4, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                                 temperal_downsample=[False, True, True], latents_mean=[0.1, -0.2, 0.0, 0.3],
                                 latents_std=[1.2, 0.8, 1.0, 1.5]).eval()
    parts = dict(scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True), vae=vae,
                 text_encoder=qwen_vl_model(seed), tokenizer=qwen_tokenizer(), transformer=transformer)
    if edit:
        return QwenImageEditPipeline(processor=qwen_vl_processor(), **parts)
    return QwenImagePipeline(**parts)


BUILDERS = {
    "qwenimage": tiny_qwenimage_pipeline,
    "qwenimage-4blocks": lambda seed=0: tiny_qwenimage_pipeline(seed, layers=4),
    "qwenimage-edit": lambda seed=0: tiny_qwenimage_pipeline(seed, edit=True),
}
# guidance 3 with the default negative prompt "": true CFG, two branches; tokens 16 pixels wide (VAE 8 x patch 2)
TESTS = TinyTests(main="qwenimage", four_blocks="qwenimage-4blocks", variants=("qwenimage-edit",),
                  edit="qwenimage-edit", guidance=3.0, token_scale=4)
GUARD_CASES = {
    "qwenimage": GuardCase("qwenimage", dict(prompt=GUARD_PROMPT, max_sequence_length=GUARD_TEXT), 1.0),
    "qwenimage-true-cfg": GuardCase("qwenimage", dict(prompt=GUARD_PROMPT, negative_prompt="", true_cfg_scale=3.0,
                                                      max_sequence_length=GUARD_TEXT), 3.0),
    "qwenimage-edit": GuardCase("qwenimage-edit", dict(prompt=GUARD_PROMPT, image=sample_image(),
                                                       max_sequence_length=GUARD_TEXT), 1.0),
    "qwenimage-edit-true-cfg": GuardCase("qwenimage-edit", dict(
        prompt=GUARD_PROMPT, image=sample_image(), negative_prompt="", true_cfg_scale=2.5,
        max_sequence_length=GUARD_TEXT), 2.5),
}
# diffusers' _cp_plan splits the text too; meshdit holds it whole (a leading MaskedTail: its padding mask needs the
# whole prompt), with its rotary freqs, and refuses zero_cond_t (the modulation index)
CP_PLAN_NOT_SPLIT = {
    ("transformer_blocks.0", "encoder_hidden_states"): "the text stays whole on every rank",
    ("transformer_blocks.*", "encoder_hidden_states_mask"): "the text's mask, whole with the text",
    ("transformer_blocks.*", "modulate_index"): "zero_cond_t only, which meshdit refuses",
    ("pos_embed", 1): "the text's rotary freqs, whole with the text",
}
PLAN_NOT_IN_CP_PLAN = {("", "controlnet_block_samples"): "a ControlNet's per-block residuals, split with the image"}


def diffusers_test_inputs(config, d) -> dict:
    """diffusers' test_models_transformer_qwenimage.py: 4 x 4 image tokens, 8 text tokens."""
    b = d.batch
    return dict(hidden_states=d.randn(b, 16, config.in_channels),
                encoder_hidden_states=d.randn(b, 8, config.joint_attention_dim),
                encoder_hidden_states_mask=torch.ones(b, 8, dtype=torch.long), timestep=d.ones(),
                img_shapes=[(1, 4, 4)] * b)
