"""Z-Image's tiny pipeline (ZImagePipeline): diffusers' own test configuration (tests/pipelines/z_image/
test_z_image.py: dim 32, 2 layers, 1 refiner layer, cap_feat_dim 16, a Qwen3 text encoder of hidden size 16, an
AutoencoderKL with 16 latent channels and SD3's scaling / shift) with 4 heads instead of 2 (Ulysses 4; rotary axes
(4, 2, 2) for the head size 8), the pad tokens set to ones as diffusers' test sets them (torch.empty otherwise), and a
word-level tokenizer with a chat template built in code instead of the Hub's tiny Qwen2 tokenizer.
"""
from __future__ import annotations

import torch

from . import GUARD_PROMPT, GUARD_TEXT, GuardCase, TinyTests
from .parts import WORDS, tiny_vae

SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")
VOCAB = {**{t: i for i, t in enumerate(SPECIAL)}, "<unk>": len(SPECIAL), "\n": len(SPECIAL) + 1,
         "user": len(SPECIAL) + 2, "assistant": len(SPECIAL) + 3,
         **{w: len(SPECIAL) + 4 + i for i, w in enumerate(WORDS)}}
# Qwen3's template reduced to what the pipeline asks of it: one user turn, the generation prompt
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def qwen3_tokenizer():
    from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(VOCAB, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\n"), "isolated"), pre_tokenizers.Split(Regex(r" "), "removed"),
        pre_tokenizers.Split(Regex(r"[^\w\n]"), "isolated")])
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIAL])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<|endoftext|>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def qwen3_model(seed: int = 0):
    """diffusers' test config (Qwen3, hidden 16, 2 layers), its vocabulary the tiny tokenizer's."""
    from transformers import Qwen3Config, Qwen3Model

    torch.manual_seed(seed)
    config = Qwen3Config(hidden_size=16, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, head_dim=8, vocab_size=len(VOCAB), max_position_embeddings=512)
    return Qwen3Model(config).eval()


def tiny_zimage_pipeline(seed: int = 0, layers: int = 2):
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel

    torch.manual_seed(seed)
    transformer = ZImageTransformer2DModel(
        all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=32, n_layers=layers, n_refiner_layers=1,
        n_heads=4, n_kv_heads=4, norm_eps=1e-5, qk_norm=True, cap_feat_dim=16, rope_theta=256.0, t_scale=1000.0,
        axes_dims=[4, 2, 2], axes_lens=[256, 32, 32]).eval()
    with torch.no_grad():  # torch.empty in the model: every process must hold the same pad tokens
        transformer.x_pad_token.fill_(1.0)
        transformer.cap_pad_token.fill_(1.0)
    torch.manual_seed(seed)
    vae = tiny_vae(latent_channels=16, scaling_factor=0.3611, shift_factor=0.1159)
    return ZImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=qwen3_model(seed),
                          tokenizer=qwen3_tokenizer(), transformer=transformer)


BUILDERS = {
    "zimage": tiny_zimage_pipeline,
    "zimage-4blocks": lambda seed=0: tiny_zimage_pipeline(seed, layers=4),
}
# guidance 3 as diffusers' test runs it: two branches (cond + 3 (cond - uncond)); a 2x VAE and patch 2: 4-pixel tokens
TESTS = TinyTests(main="zimage", four_blocks="zimage-4blocks", guidance=3.0)
GUARD_CASES = {  # the first is also the pipe-native case (tests/pipe_native/cases.py): both branches in one call
    "zimage-cfg": GuardCase("zimage", dict(prompt=GUARD_PROMPT, negative_prompt="", guidance_scale=3.0,
                                           max_sequence_length=GUARD_TEXT), 3.0),
    "zimage-turbo": GuardCase("zimage", dict(prompt=GUARD_PROMPT, guidance_scale=0.0,
                                             max_sequence_length=GUARD_TEXT), 0.0),
}


def diffusers_test_inputs(config, d) -> dict:
    """diffusers' test_models_transformer_z_image.py: latents [C, 1, 16, 16] per sample (8 x 8 tokens: 64, a multiple
    of 32), caption features of 16 tokens; here the second sample's caption is 40 tokens (padded to 64 against 32:
    the key mask) and its grid 8 x 7 tokens (56, padded to 64: uneven shards)."""
    lengths = (16, 40)[:d.batch] if d.batch > 1 else (16,)
    return dict(x=[d.randn(config.in_channels, 1, 16, 14) for _ in range(d.batch)],
                cap_feats=[d.randn(lengths[i % len(lengths)], config.cap_feat_dim) for i in range(d.batch)],
                t=torch.rand(d.batch, generator=d.generator))
