"""Tiny random-weight diffusers pipelines built in code (no downloads), for tests and benchmarks.

Each builder seeds torch, so the same call gives the same weights in every process.
Sizes are chosen so that the head count (4) allows Ulysses 4, while token counts
at the test resolutions do not all divide by the degrees.
"""
from __future__ import annotations

import string

import torch

_WORDS = "a an the of on in at to and with red green blue yellow white black cat dog circle square".split()


def clip_tokenizer(max_length: int = 77):
    from transformers import CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for piece in list(string.ascii_lowercase + string.digits + ",.") :
        vocab[piece] = len(vocab)
        vocab[piece + "</w>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=max_length)


def t5_tokenizer():
    from transformers import T5Tokenizer

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    pieces += [("▁" + w, -1.0) for w in _WORDS]
    pieces += [(c, -3.0) for c in string.ascii_lowercase + string.digits + ",."] + [("▁", -2.0)]
    return T5Tokenizer(vocab=pieces)


def clip_text_model(hidden: int = 16, projection: int = 16, with_projection: bool = False):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    cfg = CLIPTextConfig(
        vocab_size=80, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
        num_attention_heads=2, max_position_embeddings=77, projection_dim=projection,
        bos_token_id=0, eos_token_id=1, pad_token_id=1,
    )
    return (CLIPTextModelWithProjection if with_projection else CLIPTextModel)(cfg).eval()


def t5_text_model(d_model: int = 32):
    from transformers import T5Config, T5EncoderModel

    cfg = T5Config(vocab_size=80, d_model=d_model, d_ff=2 * d_model, d_kv=8, num_layers=2, num_heads=4,
                   relative_attention_num_buckets=8)
    return T5EncoderModel(cfg).eval()


def tiny_vae(latent_channels: int = 4, scaling_factor: float = 0.6, shift_factor: float | None = 0.1,
             block_out_channels: tuple[int, ...] = (8, 16)):
    """Downsamples by 2 ** (len(block_out_channels) - 1)."""
    from diffusers import AutoencoderKL

    levels = len(block_out_channels)
    kwargs = dict(
        block_out_channels=block_out_channels, layers_per_block=1, latent_channels=latent_channels,
        norm_num_groups=8, down_block_types=("DownEncoderBlock2D",) * levels,
        up_block_types=("UpDecoderBlock2D",) * levels,
        sample_size=32, scaling_factor=scaling_factor, shift_factor=shift_factor,
    )
    return AutoencoderKL(**kwargs).eval()


def tiny_flux_pipeline(seed: int = 0, heads: int = 4, guidance_embeds: bool = False, double: int = 1,
                       single: int = 1, head_dim: int = 16):
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    torch.manual_seed(seed)
    transformer = FluxTransformer2DModel(
        in_channels=16, num_layers=double, num_single_layers=single, attention_head_dim=head_dim,
        num_attention_heads=heads, joint_attention_dim=32, pooled_projection_dim=16, guidance_embeds=guidance_embeds,
        axes_dims_rope=(head_dim // 4, 3 * head_dim // 8, 3 * head_dim // 8),
    ).eval()
    return FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True), vae=tiny_vae(),
        text_encoder=clip_text_model(), tokenizer=clip_tokenizer(), text_encoder_2=t5_text_model(32),
        tokenizer_2=t5_tokenizer(), transformer=transformer,
    )


def tiny_flux2_pipeline(seed: int = 0, double: int = 1, single: int = 1):
    """Flux2Pipeline without its Mistral text encoder: generate with prompt_embeds."""
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2Pipeline, Flux2Transformer2DModel

    torch.manual_seed(seed)
    transformer = Flux2Transformer2DModel(
        in_channels=16, num_layers=double, num_single_layers=single, attention_head_dim=16, num_attention_heads=4,
        joint_attention_dim=32, timestep_guidance_channels=32, mlp_ratio=2.0, axes_dims_rope=(4, 4, 4, 4),
    ).eval()
    vae = AutoencoderKLFlux2(
        block_out_channels=(8, 16), layers_per_block=1, latent_channels=4, norm_num_groups=8,
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2, sample_size=32,
    ).eval()
    return Flux2Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True), vae=vae,
                         text_encoder=None, tokenizer=None, transformer=transformer)


def tiny_sd3_pipeline(seed: int = 0, sd35: bool = True, layers: int = 2):
    """SD3 (sd35=False) or SD3.5-shaped: dual attention layers and RMS qk-norm."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    torch.manual_seed(seed)
    transformer = SD3Transformer2DModel(
        sample_size=16, patch_size=2, in_channels=4, num_layers=layers, attention_head_dim=8, num_attention_heads=4,
        joint_attention_dim=32, caption_projection_dim=32, pooled_projection_dim=32, out_channels=4,
        pos_embed_max_size=32, dual_attention_layers=(0,) if sd35 else (), qk_norm="rms_norm" if sd35 else None,
    ).eval()
    return StableDiffusion3Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=tiny_vae(),
        text_encoder=clip_text_model(with_projection=True), tokenizer=clip_tokenizer(),
        text_encoder_2=clip_text_model(with_projection=True), tokenizer_2=clip_tokenizer(),
        text_encoder_3=t5_text_model(32), tokenizer_3=t5_tokenizer(), transformer=transformer,
    )


def tiny_pixart_pipeline(seed: int = 0, variant: str = "sigma", layers: int = 2):
    from diffusers import (DPMSolverMultistepScheduler, PixArtAlphaPipeline, PixArtSigmaPipeline,
                           PixArtTransformer2DModel)

    torch.manual_seed(seed)
    transformer = PixArtTransformer2DModel(
        sample_size=16, num_layers=layers, patch_size=2, attention_head_dim=8, num_attention_heads=4,
        caption_channels=32, in_channels=4, cross_attention_dim=32, out_channels=8, attention_bias=True,
        activation_fn="gelu-approximate", num_embeds_ada_norm=1000, norm_type="ada_norm_single",
        norm_elementwise_affine=False, norm_eps=1e-6,
    ).eval()
    cls = PixArtSigmaPipeline if variant == "sigma" else PixArtAlphaPipeline
    return cls(tokenizer=t5_tokenizer(), text_encoder=t5_text_model(32), vae=tiny_vae(shift_factor=None),
               transformer=transformer, scheduler=DPMSolverMultistepScheduler())


def bert_tokenizer():
    from transformers import BertTokenizer

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + _WORDS + list(string.ascii_lowercase + string.digits)
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


def umt5_text_model(d_model: int = 32):
    from transformers import UMT5Config, UMT5EncoderModel

    cfg = UMT5Config(vocab_size=80, d_model=d_model, d_ff=2 * d_model, d_kv=8, num_layers=2, num_heads=4,
                     relative_attention_num_buckets=8)
    return UMT5EncoderModel(cfg).eval()


def tiny_wan_vae():
    """AutoencoderKLWan as diffusers' Wan tests build it: spatial factor 8, temporal factor 4."""
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                            temperal_downsample=[False, True, True]).eval()


def tiny_wan_transformer(layers: int = 2, image_to_video: bool = False):
    """image_to_video: 16 noise + 4 mask + 16 image-latent input channels, and (Wan 2.1 I2V) K/V projections
    of CLIP image embeddings in every cross-attention."""
    from diffusers import WanTransformer3DModel

    image = dict(in_channels=36, image_dim=8, added_kv_proj_dim=48) if image_to_video else dict(in_channels=16)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=12, out_channels=16, text_dim=32,
        freq_dim=32, ffn_dim=32, num_layers=layers, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32, **image,
    ).eval()


def tiny_wan_pipeline(seed: int = 0, layers: int = 2, two_experts: bool = False):
    """Wan 2.1 text-to-video, or (two_experts) Wan 2.2's pair: transformer for t >= 0.9 x 1000, transformer_2
    below (2 steps: t = 1000, then 47: one step each). Tokens are 16 pixels wide (VAE 8 x patch 2) and 4
    frames deep (+1 for the first frame)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    torch.manual_seed(seed)
    transformer = tiny_wan_transformer(layers)
    transformer_2 = tiny_wan_transformer(layers) if two_experts else None
    return WanPipeline(tokenizer=t5_tokenizer(), text_encoder=umt5_text_model(32), vae=tiny_wan_vae(),
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), transformer=transformer,
                       transformer_2=transformer_2, boundary_ratio=0.9 if two_experts else None)


def tiny_wan_i2v_pipeline(seed: int = 0, layers: int = 2):
    """Wan 2.1 image-to-video: a tiny CLIP vision encoder (32 px crops) gives the image embeddings. Its
    cross-attention takes the text at exactly 512 tokens (diffusers' WanAttnProcessor cuts there)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanImageToVideoPipeline
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    torch.manual_seed(seed)
    transformer = tiny_wan_transformer(layers, image_to_video=True)
    encoder = CLIPVisionModel(CLIPVisionConfig(hidden_size=8, projection_dim=8, num_hidden_layers=2,
                                               num_attention_heads=2, image_size=32, intermediate_size=16,
                                               patch_size=8)).eval()
    return WanImageToVideoPipeline(
        tokenizer=t5_tokenizer(), text_encoder=umt5_text_model(32), vae=tiny_wan_vae(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), image_processor=CLIPImageProcessor(crop_size=32, size=32),
        image_encoder=encoder, transformer=transformer)


def tiny_ltx_pipeline(seed: int = 0, layers: int = 2):
    """LTX-Video text-to-video. Its VAE packs 8 x 8 pixels and upsamples space and time twice: tokens 32 pixels
    wide (LTXPipeline asks for multiples of 32) and 4 frames deep (+1 for the first frame); its decoder is
    timestep-conditioned (LTX 0.9.1+), so decoding draws the pipeline's decode noise and takes `temb`."""
    from diffusers import AutoencoderKLLTXVideo, FlowMatchEulerDiscreteScheduler, LTXPipeline, LTXVideoTransformer3DModel

    torch.manual_seed(seed)
    transformer = LTXVideoTransformer3DModel(
        in_channels=8, out_channels=8, patch_size=1, patch_size_t=1, num_attention_heads=4, attention_head_dim=8,
        cross_attention_dim=32, num_layers=layers, caption_channels=32).eval()
    vae = AutoencoderKLLTXVideo(
        latent_channels=8, block_out_channels=(8, 8, 8, 8), decoder_block_out_channels=(8, 8, 8, 8),
        layers_per_block=(1, 1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1, 1),
        spatio_temporal_scaling=(True, True, False, False), decoder_spatio_temporal_scaling=(True, True, False, False),
        timestep_conditioning=True, patch_size=8, patch_size_t=1).eval()
    return LTXPipeline(scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True), vae=vae,
                       text_encoder=t5_text_model(32), tokenizer=t5_tokenizer(), transformer=transformer)


def tiny_cogvideox_pipeline(seed: int = 0, layers: int = 2, rotary: bool = True, stochastic: bool = False):
    """CogVideoX 1.0 text-to-video: rotary (5B-shaped) or, rotary False, the 2B's sin-cos positional table
    (which covers exactly max_text_seq_length = 226 text tokens). Tokens are 16 pixels wide (VAE 8 x patch 2)
    and 4 frames deep (+1 for the first frame). stochastic: CogVideoX-5B's DPM scheduler, which draws noise in
    every step; else the 2B's DDIM (eta 0: no noise)."""
    from diffusers import (AutoencoderKLCogVideoX, CogVideoXDDIMScheduler, CogVideoXDPMScheduler, CogVideoXPipeline,
                           CogVideoXTransformer3DModel)

    torch.manual_seed(seed)
    transformer = CogVideoXTransformer3DModel(
        num_attention_heads=4, attention_head_dim=16, in_channels=4, out_channels=4, time_embed_dim=32,
        text_embed_dim=32, num_layers=layers, sample_width=10, sample_height=6, sample_frames=9, patch_size=2,
        temporal_compression_ratio=4, max_text_seq_length=226, use_rotary_positional_embeddings=rotary).eval()
    vae = AutoencoderKLCogVideoX(
        block_out_channels=(8, 8, 8, 8), latent_channels=4, layers_per_block=1, norm_num_groups=4,
        temporal_compression_ratio=4, down_block_types=("CogVideoXDownBlock3D",) * 4,
        up_block_types=("CogVideoXUpBlock3D",) * 4).eval()
    with torch.no_grad():  # random weights put the decoder's raw output near +-20, which postprocessing clamps
        for p in vae.decoder.conv_out.parameters():  # to [0, 1]: scaled down, the video is mostly unclamped
            p.mul_(0.05)
    # CogVideoX-2B's schedule; the 5B's DPM differs in its SNR shift (1.0 for 3.0)
    schedule = dict(beta_end=0.012, beta_schedule="scaled_linear", beta_start=0.00085, clip_sample=False,
                    prediction_type="v_prediction", rescale_betas_zero_snr=True, set_alpha_to_one=True,
                    snr_shift_scale=1.0 if stochastic else 3.0, steps_offset=0, timestep_spacing="trailing")
    scheduler = (CogVideoXDPMScheduler if stochastic else CogVideoXDDIMScheduler)(**schedule)
    return CogVideoXPipeline(tokenizer=t5_tokenizer(), text_encoder=t5_text_model(32), vae=vae,
                             transformer=transformer, scheduler=scheduler)
def llama_tokenizer():
    """Word-level, built in code: HunyuanVideo's prompt template comes to exactly the 95 tokens before the
    prompt that the pipeline crops (its crop_start, counted with Llama's tokenizer), so prompts survive the
    crop whole and short ones leave padding (masked) within max_sequence_length."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1, **{w: i + 2 for i, w in enumerate(_WORDS)}}
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


def qwen_tokenizer():
    """Word-level, built in code: its chat template puts exactly the 108 tokens HunyuanVideo 1.5's pipeline crops
    (prompt_template_encode_start_idx) before the prompt, so prompts survive the crop whole and leave padding."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1, **{w: i + 2 for i, w in enumerate(_WORDS)}}
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


def tiny_hunyuanvideo15_pipeline(seed: int = 0, layers: int = 2, guidance_scale: float = 4.0):
    """HunyuanVideo 1.5 text-to-video: Qwen2.5-VL text (1000 tokens) + ByT5 glyph text (256, for quoted text) +
    729 image tokens (all masked for text-to-video) after the video tokens; true CFG through its guider. Its VAE
    compresses 16 x 16 pixels and 4 frames (+1) as the real one does; with patch 1 tokens are 16 pixels wide."""
    from diffusers import (AutoencoderKLHunyuanVideo15, ClassifierFreeGuidance, FlowMatchEulerDiscreteScheduler,
                           HunyuanVideo15Pipeline, HunyuanVideo15Transformer3DModel)
    from transformers import ByT5Tokenizer

    torch.manual_seed(seed)
    transformer = HunyuanVideo15Transformer3DModel(
        in_channels=9, out_channels=4, num_attention_heads=4, attention_head_dim=8, num_layers=layers,
        num_refiner_layers=1, mlp_ratio=2.0, patch_size=1, patch_size_t=1, text_embed_dim=32, text_embed_2_dim=32,
        image_embed_dim=16, rope_axes_dim=(2, 2, 4), task_type="t2v").eval()
    vae = AutoencoderKLHunyuanVideo15(latent_channels=4, block_out_channels=(8, 8, 8, 8, 8), layers_per_block=1,
                                      spatial_compression_ratio=16, temporal_compression_ratio=4).eval()
    return HunyuanVideo15Pipeline(
        text_encoder=qwen_text_model(32), tokenizer=qwen_tokenizer(), transformer=transformer, vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0), text_encoder_2=byt5_text_model(32),
        tokenizer_2=ByT5Tokenizer(), guider=ClassifierFreeGuidance(guidance_scale=guidance_scale))


def sample_image(height: int = 48, width: int = 80):
    """A deterministic RGB picture for image-to-video tests (PIL)."""
    from PIL import Image

    y, x = torch.meshgrid(torch.linspace(0, 1, height), torch.linspace(0, 1, width), indexing="ij")
    rgb = torch.stack([x, y, (x * y).sqrt()], dim=-1)  # [H, W, 3]
    return Image.fromarray((rgb * 255).round().to(torch.uint8).numpy())


TEST_SCALE = {"hunyuandit": 4, "hunyuandit-4blocks": 4, "wan": 4, "wan-4blocks": 4, "wan22": 4,
              "hunyuanvideo": 4, "hunyuanvideo-cfg": 4, "hunyuanvideo-4blocks": 4}
"""Tests write sizes for 4-pixel tokens (VAE 2 x patch 2); a pipeline with larger tokens multiplies them
(HunyuanDiT: VAE 8 x patch 2), so every family sees the same token grids."""


def scaled_size(name: str, height: int, width: int) -> tuple[int, int]:
    scale = TEST_SCALE.get(name, 1)
    return height * scale, width * scale


BUILDERS = {
    "flux": tiny_flux_pipeline,
    "flux2": tiny_flux2_pipeline,
    "sd3": lambda seed=0: tiny_sd3_pipeline(seed, sd35=False),
    "sd35": tiny_sd3_pipeline,
    "pixart-sigma": tiny_pixart_pipeline,
    "pixart-alpha": lambda seed=0: tiny_pixart_pipeline(seed, "alpha"),
    "hunyuandit": tiny_hunyuandit_pipeline,
    "wan": tiny_wan_pipeline,
    "wan22": lambda seed=0: tiny_wan_pipeline(seed, two_experts=True),
    "wan-i2v": tiny_wan_i2v_pipeline,
    "ltx": tiny_ltx_pipeline,
    "cogvideox": tiny_cogvideox_pipeline,
    "cogvideox-sincos": lambda seed=0: tiny_cogvideox_pipeline(seed, rotary=False),
    "cogvideox-dpm": lambda seed=0: tiny_cogvideox_pipeline(seed, stochastic=True),
    "hunyuanvideo": tiny_hunyuanvideo_pipeline,
    "hunyuanvideo-cfg": lambda seed=0: tiny_hunyuanvideo_pipeline(seed, guidance_embeds=False),
    "hunyuanvideo15": tiny_hunyuanvideo15_pipeline,
    "hunyuanvideo15-nocfg": lambda seed=0: tiny_hunyuanvideo15_pipeline(seed, guidance_scale=1.0),
    # four blocks, for four pipeline stages
    "flux-4blocks": lambda seed=0: tiny_flux_pipeline(seed, double=2, single=2),
    "flux2-4blocks": lambda seed=0: tiny_flux2_pipeline(seed, double=2, single=2),
    "sd35-4blocks": lambda seed=0: tiny_sd3_pipeline(seed, layers=4),
    "sd3-4blocks": lambda seed=0: tiny_sd3_pipeline(seed, sd35=False, layers=4),
    "pixart-sigma-4blocks": lambda seed=0: tiny_pixart_pipeline(seed, layers=4),
    # DDIM: after PipeFusion's warmup each patch steps alone, and DDPM would draw other noise for it
    "hunyuandit-4blocks": lambda seed=0: tiny_hunyuandit_pipeline(seed, layers=4, stochastic=False),
    # 4-pixel tokens: under 32 px its rotary table has one row (broadcast over the tokens)
    "hunyuandit-vae2-4blocks": lambda seed=0: tiny_hunyuandit_pipeline(seed, layers=4, stochastic=False,
                                                                       vae_levels=2),
    "wan-4blocks": lambda seed=0: tiny_wan_pipeline(seed, layers=4),
    "wan-i2v-4blocks": lambda seed=0: tiny_wan_i2v_pipeline(seed, layers=4),
    "ltx-4blocks": lambda seed=0: tiny_ltx_pipeline(seed, layers=4),
    "cogvideox-4blocks": lambda seed=0: tiny_cogvideox_pipeline(seed, layers=4),
    "cogvideox-dpm-4blocks": lambda seed=0: tiny_cogvideox_pipeline(seed, layers=4, stochastic=True),
    "hunyuanvideo-4blocks": lambda seed=0: tiny_hunyuanvideo_pipeline(seed, double=2, single=2),
    "hunyuanvideo15-4blocks": lambda seed=0: tiny_hunyuanvideo15_pipeline(seed, layers=4),
    # hidden 256 (4 heads x 64): Linear layers wide enough that FP8 scales and biases are a small overhead
    "flux-wide": lambda seed=0: tiny_flux_pipeline(seed, head_dim=64),
}


def tiny_pipeline(name: str, seed: int = 0):
    """A tiny pipeline by family name (see BUILDERS)."""
    return BUILDERS[name](seed=seed)
