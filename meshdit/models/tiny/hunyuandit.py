"""HunyuanDiT's tiny pipelines."""
from __future__ import annotations

import string

import torch

from . import GUARD_PROMPT, GuardCase, TinyTests
from .parts import WORDS, t5_text_model, t5_tokenizer, tiny_vae


def bert_tokenizer():
    from transformers import BertTokenizer

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + list(string.ascii_lowercase + string.digits)
    return BertTokenizer(vocab={piece: i for i, piece in enumerate(vocab)}, model_max_length=77)


def bert_text_model(hidden: int = 32):
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=80, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=2 * hidden, max_position_embeddings=80)
    return BertModel(cfg, add_pooling_layer=False).eval()


def tiny_hunyuandit_pipeline(seed: int = 0, layers: int = 2, stochastic: bool = True, vae_levels: int = 4):
    """With four blocks, block 3 takes block 0's output as a long skip (two blocks have none). Its VAE
    downsamples by 8 (the pipeline's rotary grid assumes 8) and its text lengths are the pipeline's fixed
    77 (BERT) + 256 (T5). stochastic: HunyuanDiT's own DDPM scheduler, which draws noise in every step;
    else DDIM (eta 0), the same arithmetic without that noise. vae_levels=2 (downsampling by 2, as in
    diffusers' own HunyuanDiT tests: by 1) makes sizes under 32 px give a rotary table of one row, which the
    model broadcasts over every token."""
    from diffusers import DDIMScheduler, DDPMScheduler, HunyuanDiT2DModel, HunyuanDiTPipeline

    torch.manual_seed(seed)
    transformer = HunyuanDiT2DModel(
        num_attention_heads=4, attention_head_dim=8, in_channels=4, patch_size=2, sample_size=16, hidden_size=32,
        num_layers=layers, mlp_ratio=2.0, cross_attention_dim=32, cross_attention_dim_t5=32,
        pooled_projection_dim=16, text_len=77, text_len_t5=256,
    ).eval()
    schedule = dict(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.03, clip_sample=False,
                    prediction_type="v_prediction", steps_offset=1, timestep_spacing="leading")
    scheduler = DDPMScheduler(**schedule) if stochastic else DDIMScheduler(**schedule, set_alpha_to_one=False)
    return HunyuanDiTPipeline(
        vae=tiny_vae(shift_factor=None, block_out_channels=(8, 16, 16, 16)[:vae_levels]),
        text_encoder=bert_text_model(32),
        tokenizer=bert_tokenizer(), transformer=transformer, scheduler=scheduler, safety_checker=None,
        feature_extractor=None, requires_safety_checker=False, text_encoder_2=t5_text_model(32),
        tokenizer_2=t5_tokenizer(),
    )


BUILDERS = {
    "hunyuandit": tiny_hunyuandit_pipeline,
    # DDIM: after PipeFusion's warmup each patch steps alone, and DDPM would draw other noise for it
    "hunyuandit-4blocks": lambda seed=0: tiny_hunyuandit_pipeline(seed, layers=4, stochastic=False),
    # 4-pixel tokens: under 32 px its rotary table has one row (broadcast over the tokens)
    "hunyuandit-vae2-4blocks": lambda seed=0: tiny_hunyuandit_pipeline(seed, layers=4, stochastic=False,
                                                                       vae_levels=2),
}
# its DDPM draws noise in every step: data parallelism is refused, so only the CFG cases; tokens 16 px wide
TESTS = TinyTests(main="hunyuandit", four_blocks="hunyuandit-4blocks", layouts=("cfg2", "cfg2-u2"), token_scale=4,
                  unscaled=("hunyuandit-vae2-4blocks",), tensor_parallel_share=0.75)
GUARD_CASES = {
    "hunyuandit": GuardCase("hunyuandit", dict(prompt=GUARD_PROMPT, guidance_scale=5.0, use_resolution_binning=False),
                            5.0),
}


def diffusers_test_inputs(config, d) -> dict:
    """diffusers' test_models_transformer_hunyuan_dit.py: an 8 x 8 latent, a 1 x 1 rotary grid; the text lengths
    are the model's (diffusers' test model is built with text_len = text_len_t5 = 4, its input's lengths)."""
    b, head, clip, t5 = d.batch, config.attention_head_dim, config.text_len, config.text_len_t5
    return dict(hidden_states=d.randn(b, config.in_channels, 8, 8),
                encoder_hidden_states=d.randn(b, clip, config.cross_attention_dim),
                text_embedding_mask=torch.ones(b, clip),
                encoder_hidden_states_t5=d.randn(b, t5, config.cross_attention_dim_t5),
                text_embedding_mask_t5=torch.ones(b, t5), timestep=d.steps().float(),
                image_meta_size=torch.tensor([[1024, 1024, 16, 16, 0, 0]] * b, dtype=torch.float32),
                style=torch.zeros(b, dtype=torch.long), image_rotary_emb=[torch.ones(1, head), torch.zeros(1, head)])
