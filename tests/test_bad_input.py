"""Bad input is refused before any rank starts: exit status 2, a message naming the flag, in under 0.5 s,
no rank spawned, no earlier output touched, nothing left behind, and neither torch, diffusers, transformers
nor numpy imported (docs/generate.md: a refused command returns in under 0.5 s)."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest
from PIL import Image

import meshdit.distributed.launch
from meshdit.cli import main

# (flags, text the message must contain). The model is the bundled one unless the flags name another.
BAD_INPUTS = {
    "steps-0": (["--steps", "0"], "--steps 0 is out of range"),
    "steps-negative": (["--steps", "-3"], "--steps -3 is out of range"),
    "steps-alias-0": (["--num_inference_steps", "0"], "--steps 0 is out of range"),
    "steps-not-a-number": (["--steps", "x"], "argument --steps"),
    "height-0": (["--height", "0"], "--height 0 is out of range"),
    "height-negative": (["--height", "-256"], "--height -256 is out of range"),
    "height-huge": (["--height", "100000"], "--height 100000 is out of range: it must be in 1..8192"),
    "width-0": (["--width", "0"], "--width 0 is out of range"),
    "width-above-8192": (["--width", "8208"], "--width 8208 is out of range"),
    "height-not-patch-multiple": (["--height", "36"], "height 36 cannot be split into this model's patches"),
    "seed-negative": (["--seed", "-1"], "--seed -1 is out of range"),
    "seed-2**64": (["--seed", str(2**64)], f"--seed {2**64} is out of range"),
    "guidance-inf": (["--guidance-scale", "inf"], "--guidance-scale must be a finite number, got inf"),
    "guidance-minus-inf": (["--guidance-scale=-inf"], "--guidance-scale must be a finite number, got -inf"),
    "guidance-minus-inf-as-typed": (["--guidance-scale", "-inf"], "--guidance-scale must be a finite number, got -inf"),
    "guidance-nan": (["--guidance-scale", "nan"], "--guidance-scale must be a finite number, got nan"),
    "images-per-prompt-0": (["--num-images-per-prompt", "0"], "--num-images-per-prompt 0 is out of range"),
    "images-per-prompt-0-with-dp": (["--num-images-per-prompt", "0", "--data-parallel-degree", "2"],
                                    "--num-images-per-prompt 0 is out of range"),
    "max-sequence-length-0": (["--max-sequence-length", "0"], "--max-sequence-length 0 is out of range"),
    "max-sequence-length-negative": (["--max-sequence-length", "-1"], "--max-sequence-length -1 is out of range"),
    "max-sequence-length-above-t5": (["--max-sequence-length", "513"], "use --max-sequence-length <= 512"),
    "prompt-not-utf8": (["--prompt", "caf\udce9"], "--prompt 'caf\\udce9' is not valid UTF-8"),
    "negative-prompt-not-utf8": (["--negative-prompt", "\udcff"], "--negative-prompt '\\udcff' is not valid UTF-8"),
    "prompt-file-empty": (["--prompt-file", "{tmp}/empty.txt"], "holds no prompt (it is empty or blank)"),
    "prompt-file-blank": (["--prompt-file", "{tmp}/blank.txt"], "holds no prompt (it is empty or blank)"),
    "prompt-file-not-utf8": (["--prompt-file", "{tmp}/latin1.txt"], "not UTF-8 text"),
    "prompt-file-missing": (["--prompt-file", "{tmp}/nope.txt"], "cannot read --prompt-file"),
    "output-under-a-file": (["--output", "{tmp}/earlier.png/x.png"], "is a file, so no folder can be made"),
    "output-is-a-folder": (["--output", "{tmp}/folder.png"], "is a folder; name a file inside it"),
    "output-unwritable": (["--output", "/sys/meshdit-test.png"], "/sys/meshdit-test.png: cannot write in /sys"),
    "output-unknown-extension": (["--output", "{tmp}/x.gif2"], "use a .png, .jpg, .webp or .npy"),
    "model-index-malformed": (["--model", "{tmp}/bad-json"], "model_index.json is not valid JSON"),
    "model-index-no-class": (["--model", "{tmp}/no-class"], "model_index.json names no pipeline"),
    "model-folder-missing": (["--model", "{tmp}/missing/model"], "there is no such folder"),
    "ulysses-0": (["--ulysses-degree", "0"], "--ulysses-degree must be a whole number >= 1"),
    "ring-negative": (["--ring-degree", "-2"], "--ring-degree must be a whole number >= 1"),
    "warmup-0": (["--pipefusion-parallel-degree", "2", "--warmup-steps", "0"], "--warmup-steps must be"),
    "pipeline-patch-0": (["--num-pipeline-patch", "0"], "--num-pipeline-patch must be"),
    "data-parallel-0": (["--data-parallel-degree", "0"], "--data-parallel-degree must be"),
    "vae-overlap-negative": (["--vae-tile-overlap", "-1"], "--vae-tile-overlap must be"),
    "dtype-unknown": (["--dtype", "float8"], "argument --dtype: invalid choice"),
    "flag-typo-suggests-the-flag": (["--num_steps", "4"], "--num_steps: did you mean --steps?"),
    "size-not-wxh": (["--size", "64by64"], "--size '64by64' is not WxH: write width x height"),
    "size-against-height": (["--size", "64x32", "--height", "64"], "--size 64x32 says height 32 but --height 64"),
    "size-not-patch-multiple": (["--size", "64x36"], "height 36 cannot be split into this model's patches"),
    # the layout against the model (its config files alone)
    "cfg-without-guidance": (["--use-cfg-parallel", "--guidance-scale", "1"], "turns classifier-free guidance off"),
    "cfg-on-guidance-distilled-model": (["--model", "{tmp}/flux-dev", "--use-cfg-parallel"],
                                        "this FluxPipeline model is guidance-distilled"),
    "cfg-on-flux2": (["--model", "{tmp}/flux2", "--use-cfg-parallel"], "this Flux2Pipeline model is guidance-distilled"),
    "ulysses-above-heads": (["--ulysses-degree", "8"], "exceeds the model's 4 attention heads"),
    "stages-above-blocks": (["--pipefusion-parallel-degree", "10"], "needs a block per stage, but the model has 9"),
    "data-parallel-above-images": (["--data-parallel-degree", "2"], "needs at least as many images"),
    "patches-above-token-rows": (["--pipefusion-parallel-degree", "2", "--num-pipeline-patch", "17"],
                                 "--num-pipeline-patch 17 exceeds the 16 rows of image tokens"),
    "fewer-tokens-than-sp-ranks": (["--height", "16", "--width", "16", "--ring-degree", "2"],
                                   "fewer than the 2 sequence-parallel ranks"),
    "above-positional-embedding": (["--model", "{tmp}/sd3", "--height", "256", "--width", "256"],
                                   "exceeds this model's positional embedding (8 patches per side)"),
    "pipeline-unsupported": (["--model", "{tmp}/sd15"], "does not support the pipeline 'StableDiffusionPipeline'"),
    "transformer-config-missing": (["--model", "{tmp}/no-transformer"], "transformer/config.json is missing"),
    # the VAE settings, alone and against vae/config.json
    "vae-tile-not-vae-multiple": (["--vae-tile-height", "100"], "must be a multiple of the VAE's upsampling factor 8"),
    "vae-overlap-not-below-tile": (["--vae-tile-width", "64"], "must be smaller than --vae-tile-width (64 px)"),
    "parallel-vae-unknown-class": (["--model", "{tmp}/tiny-vae", "--use-parallel-vae"],
                                   "supports the VAE classes AutoencoderKL"),
    # video models (Wan) and video flags on image models
    "fps-0": (["--fps", "0"], "--fps 0 is out of range"),
    "num-frames-0": (["--num-frames", "0"], "--num-frames 0 is out of range"),
    "num-frames-on-image-model": (["--num-frames", "9"], "--num-frames is for video models, but this FluxPipeline"),
    "image-on-image-model": (["--image", "{tmp}/earlier.png"], "this FluxPipeline makes images from text alone and takes no image: drop --image"),
    "video-frames-not-4k+1": (["--model", "{tmp}/wan", "--num-frames", "10", "--output", "{tmp}/x.mp4"],
                              "--num-frames 10 cannot be encoded by this model's VAE"),
    "video-to-an-image-name": (["--model", "{tmp}/wan"], "this model makes videos; use a .mp4"),
    "video-name-for-an-image-model": (["--output", "{tmp}/x.mp4"], "(.mp4 and .gif are for video models)"),
    "image-given-to-text-to-video": (["--model", "{tmp}/wan", "--image", "{tmp}/frame.png", "--output",
                                      "{tmp}/x.mp4"], "takes no image: drop --image"),
    "video-height-not-patch-multiple": (["--model", "{tmp}/wan", "--height", "40", "--output", "{tmp}/x.mp4"],
                                        "height 40 cannot be split into this model's patches"),
    "video-parallel-and-tiled-vae": (["--model", "{tmp}/wan", "--use-parallel-vae", "--vae-tile-height", "256",
                                      "--vae-tile-width", "256", "--output", "{tmp}/x.mp4"], "not both"),
    "image-to-video-without-image": (["--model", "{tmp}/wan-i2v", "--output", "{tmp}/x.mp4"],
                                     "animates an image: pass its first frame with --image PATH"),
    "image-to-video-image-missing": (["--model", "{tmp}/wan-i2v", "--image", "{tmp}/nope.png", "--output",
                                      "{tmp}/x.mp4"], "nope.png': no such file; pass the path of an image file"),
    "image-to-video-other-text-length": (["--model", "{tmp}/wan-i2v", "--image", "{tmp}/frame.png",
                                          "--max-sequence-length", "100", "--output", "{tmp}/x.mp4"],
                                         "takes exactly 512 text tokens"),
    # an edit model's input image (meshdit/input_image.py): checked from the file before ranks start
    "edit-image-not-an-image": (["--model", "{tmp}/kontext", "--image", "{tmp}/earlier.png"],
                                "--image: not an image file PIL can read"),
    "edit-image-missing": (["--model", "{tmp}/kontext", "--image", "{tmp}/nope.png"], "no such file"),
    "edit-image-too-wide": (["--model", "{tmp}/kontext", "--image", "{tmp}/wide.png"],
                            "--image: the image is 8193x1 pixels; each side must be 16..8192"),
    # images diffusers' edit pipelines fail on (Kontext divides by zero, Qwen-Image-Edit's resize gives a 0 side)
    "edit-image-one-pixel": (["--model", "{tmp}/kontext", "--image", "{tmp}/dot.png"],
                             "--image: the image is 1x1 pixels; each side must be 16..8192: pad or scale it up"),
    "edit-image-one-row": (["--model", "{tmp}/kontext", "--image", "{tmp}/row.png"],
                           "--image: the image is 8192x1 pixels; each side must be 16..8192"),
    "edit-image-too-thin": (["--model", "{tmp}/kontext", "--image", "{tmp}/thin.png"],
                            "its long side 256 times its short one; at most 100:1"),
    # Wan 2.2 TI2V-5B (per-token timesteps, run since issue 45): its VAE's 16 pixels x patch 2 make 32-pixel tokens
    "ti2v-height-not-token-multiple": (["--model", "{tmp}/wan-ti2v", "--height", "48", "--width", "64",
                                        "--output", "{tmp}/x.mp4"], "multiple of 32 (VAE factor 16 x patch 2)"),
    "video-patches-above-token-rows": (["--model", "{tmp}/wan", "--num-frames", "5", "--height", "32", "--width",
                                        "32", "--pipefusion-parallel-degree", "2", "--num-pipeline-patch", "5",
                                        "--output", "{tmp}/x.mp4"],
                                       "--num-pipeline-patch 5 exceeds the 4 rows of image tokens"),
    # LTX: its VAE config leaves the compressions null (diffusers computes 32 px, 8 frames from patch and scaling)
    "ltx-frames-not-8k+1": (["--model", "{tmp}/ltx", "--num-frames", "10", "--output", "{tmp}/x.mp4"],
                            "compresses 8 frames into one after the first: use k * 8 + 1 frames, e.g. "
                            "--num-frames 9 or 17"),
    "ltx-height-not-32-multiple": (["--model", "{tmp}/ltx", "--height", "80", "--output", "{tmp}/x.mp4"],
                                   "height 80 cannot be split into this model's patches: it must be a multiple of 32"),
    "ltx-frames-for-a-temporal-patch": (["--model", "{tmp}/ltx-patch-t2", "--num-frames", "17", "--output",
                                         "{tmp}/x.mp4"], "3 latent frames, which this model's temporal patch of 2 "
                                        "frames cannot cut: use --num-frames 9 or 25"),
    # HunyuanVideo image to video: token_replace transformers (diffusers' tests cover latent_concat only)
    "hunyuanvideo-i2v-token-replace": (["--model", "{tmp}/hunyuanvideo-i2v-token-replace", "--image",
                                        "{tmp}/frame.png", "--output", "{tmp}/x.mp4"],
                                       "sets image_condition_type 'token_replace' (the first frame's tokens"),
    "ltx-image-to-video-without-image": (["--model", "{tmp}/ltx-i2v", "--output", "{tmp}/x.mp4"],
                                         "this LTXImageToVideoPipeline animates an image: pass its first frame"),
    "ltx-condition-without-image": (["--model", "{tmp}/ltx-condition", "--output", "{tmp}/x.mp4"],
                                    "this LTXConditionPipeline animates an image: pass its first frame"),
    "ltx-condition-at-a-later-frame": (["--model", "{tmp}/ltx-condition", "--image", "{tmp}/frame.png",
                                        "--extra", "frame_index=8", "--output", "{tmp}/x.mp4"],
                                       "--extra frame_index: meshdit does not pass 'frame_index' to this "
                                       "LTXConditionPipeline: LTXConditionPipeline runs with one condition, --image "
                                       "at frame 0 with strength 1"),
    "ltx-condition-denoise-strength": (["--model", "{tmp}/ltx-condition", "--image", "{tmp}/frame.png",
                                        "--extra", "denoise_strength=0.5", "--output", "{tmp}/x.mp4"],
                                       "video-to-video from given latents: meshdit takes no --latents"),
    # CogVideoX
    "cogvideox-frames-not-4k+1": (["--model", "{tmp}/cogvideox", "--num-frames", "47", "--output", "{tmp}/x.mp4"],
                                  "use k * 4 + 1 frames or a multiple of 8 (latent frames in pairs), e.g. "
                                  "--num-frames 45 or 49"),
    "cogvideox-width-not-16-multiple": (["--model", "{tmp}/cogvideox", "--width", "712", "--output", "{tmp}/x.mp4"],
                                        "width 712 cannot be split into this model's patches: it must be a "
                                        "multiple of 16 (VAE factor 8 x patch 2); use --width 704 or 720"),
    "cogvideox-1.5-temporal-patch": (["--model", "{tmp}/cogvideox-1.5", "--output", "{tmp}/x.mp4"],
                                     "sets patch_size_t (CogVideoX 1.5's temporal patch"),
    "cogvideox-2b-other-text-length": (["--model", "{tmp}/cogvideox-2b", "--max-sequence-length", "100",
                                        "--output", "{tmp}/x.mp4"], "takes exactly 226 text tokens"),
    "cogvideox-dpm-data-parallel": (["--model", "{tmp}/cogvideox-dpm", "--prompt", "a", "--prompt", "b",
                                     "--data-parallel-degree", "2", "--output", "{tmp}/x{i}.mp4"],
                                    "CogVideoXDPMScheduler draws fresh noise in every step"),
    "cogvideox-i2v-without-image": (["--model", "{tmp}/cogvideox-5b-i2v", "--output", "{tmp}/x.mp4"],
                                    "this CogVideoXImageToVideoPipeline animates an image: pass its first frame"),
    "cogvideox-i2v-learned-other-size": (["--model", "{tmp}/cogvideox-5b-i2v", "--image", "{tmp}/frame.png",
                                          "--height", "480", "--width", "480", "--output", "{tmp}/x.mp4"],
                                         "480x480 is not this model's size: its use_learned_positional_embeddings "
                                         "cover exactly 480x720 (its transformer's sample_height x sample_width "
                                         "latents); use --height 480 --width 720"),
    "cogvideox-i2v-learned-other-text-length": (["--model", "{tmp}/cogvideox-5b-i2v", "--image", "{tmp}/frame.png",
                                                 "--max-sequence-length", "100", "--output", "{tmp}/x.mp4"],
                                                "takes exactly 226 text tokens"),
    "cogvideox-1.5-i2v-temporal-patch": (["--model", "{tmp}/cogvideox-1.5-i2v", "--image", "{tmp}/frame.png",
                                          "--output", "{tmp}/x.mp4"], "sets patch_size_t (CogVideoX 1.5's temporal"),
    # hostile config JSON (config_files.check_fields): a message, never a traceback, a hang or a launch
    "config-layers-1e7": (["--model", "{tmp}/layers-1e7"], "num_layers is 10000000; meshdit takes a whole number in "
                          "0..1000"),
    "config-layers-1e12": (["--model", "{tmp}/layers-1e12"], "num_layers is 1000000000000;"),
    "config-layers-1e400": (["--model", "{tmp}/layers-1e400"], "num_layers is 100000000000000000000000000000... (401 characters)"),
    "config-heads-missing": (["--model", "{tmp}/heads-missing"], "transformer/config.json has no num_attention_heads"),
    "config-heads-text": (["--model", "{tmp}/heads-text"], "num_attention_heads is 'four'; meshdit takes a whole"),
    "config-heads-negative": (["--model", "{tmp}/heads-negative"], "num_attention_heads is -4; meshdit takes"),
    "config-heads-nan": (["--model", "{tmp}/heads-nan"], "num_attention_heads is nan;"),
    "config-vae-levels-text": (["--model", "{tmp}/vae-levels-text"], "vae/config.json: block_out_channels is 'wide'"),
    "config-json-nested-deep": (["--model", "{tmp}/nested-deep"], "nests its JSON deeper than Python's parser goes"),
    # LoRA flags (lora_files.py): meshdit's words, not argparse's "invalid parse_lora_flag value"
    "lora-weight-overflows": (["--lora", "{tmp}/a.safetensors:1e309"], "the weight after ':' must be a finite "
                              "number in -100..100, got '1e309'"),
    "lora-weight-nan": (["--lora", "{tmp}/a.safetensors:nan"], "must be a finite number in -100..100, got 'nan'"),
    "lora-weight-above-bound": (["--lora", "{tmp}/a.safetensors:1e30"], "in -100..100, got '1e30'"),
    "lora-weight-not-a-number": (["--lora", "{tmp}/earlier.png:abc"], "earlier.png:abc': the weight after ':' must "
                                 "be a finite number"),
    "lora-folder-without-adapter": (["--lora", "{tmp}/folder.png"], "a folder without "
                                    "pytorch_lora_weights.safetensors"),
    # FP8 options
    "fp8-comm-k-without-fp8-comm": (["--fp8-comm-k"], "needs --fp8-comm too"),
    "attention-backend-unknown": (["--attention-backend", "fp4"], "argument --attention-backend"),
}

# Model folders of config files only: every check before the ranks start reads nothing else.
_FLUX_TRANSFORMER = {"_class_name": "FluxTransformer2DModel", "num_attention_heads": 4, "attention_head_dim": 32,
                     "num_layers": 1, "num_single_layers": 1, "in_channels": 16, "guidance_embeds": False}
_VAE = {"_class_name": "AutoencoderKL", "block_out_channels": [8, 16, 32, 64],
        "up_block_types": ["UpDecoderBlock2D"] * 4}
_WAN_TRANSFORMER = {"_class_name": "WanTransformer3DModel", "num_attention_heads": 4, "num_layers": 2,
                    "patch_size": [1, 2, 2]}
_WAN_VAE = {"_class_name": "AutoencoderKLWan", "scale_factor_spatial": 8, "scale_factor_temporal": 4}
_LTX_TRANSFORMER = {"_class_name": "LTXVideoTransformer3DModel", "num_attention_heads": 4, "num_layers": 2,
                    "patch_size": 1, "patch_size_t": 1}
_LTX_VAE = {"_class_name": "AutoencoderKLLTXVideo", "patch_size": 4, "patch_size_t": 1,
            "spatio_temporal_scaling": [True, True, True, False], "spatial_compression_ratio": None,
            "temporal_compression_ratio": None}
_COG_TRANSFORMER = {"_class_name": "CogVideoXTransformer3DModel", "num_attention_heads": 4, "num_layers": 2,
                    "patch_size": 2, "patch_size_t": None, "use_rotary_positional_embeddings": True}
_COG_VAE = {"_class_name": "AutoencoderKLCogVideoX", "block_out_channels": [8, 8, 8, 8],
            "temporal_compression_ratio": 4.0}
CONFIG_ONLY_MODELS = {
    "flux-dev": ("FluxPipeline", {**_FLUX_TRANSFORMER, "guidance_embeds": True}, _VAE),
    "flux2": ("Flux2Pipeline", {**_FLUX_TRANSFORMER, "_class_name": "Flux2Transformer2DModel"},
              {**_VAE, "_class_name": "AutoencoderKLFlux2"}),
    "sd3": ("StableDiffusion3Pipeline", {"_class_name": "SD3Transformer2DModel", "num_attention_heads": 4,
                                         "num_layers": 2, "patch_size": 2, "sample_size": 8, "pos_embed_max_size": 8},
            _VAE),
    "sd15": ("StableDiffusionPipeline", {"_class_name": "UNet2DConditionModel"}, _VAE),
    "no-transformer": ("FluxPipeline", None, _VAE),
    "tiny-vae": ("FluxPipeline", _FLUX_TRANSFORMER, {**_VAE, "_class_name": "AutoencoderTiny"}),
    "kontext": ("FluxKontextPipeline", _FLUX_TRANSFORMER, _VAE),
    "wan": ("WanPipeline", _WAN_TRANSFORMER, _WAN_VAE),
    "wan-i2v": ("WanImageToVideoPipeline", {**_WAN_TRANSFORMER, "added_kv_proj_dim": 48}, _WAN_VAE),
    "wan-ti2v": ({"_class_name": "WanPipeline", "expand_timesteps": True}, _WAN_TRANSFORMER,
                 {**_WAN_VAE, "scale_factor_spatial": 16, "z_dim": 48, "patch_size": 2, "is_residual": True}),
    "cogvideox": ("CogVideoXPipeline", _COG_TRANSFORMER, _COG_VAE),
    "cogvideox-2b": ("CogVideoXPipeline", {**_COG_TRANSFORMER, "use_rotary_positional_embeddings": False},
                     _COG_VAE),
    "cogvideox-1.5": ("CogVideoXPipeline", {**_COG_TRANSFORMER, "patch_size_t": 2}, _COG_VAE),
    # CogVideoX-5B I2V: learned positional embeddings for 60 x 90 latents (480 x 720 px) and 226 text tokens
    "cogvideox-5b-i2v": ("CogVideoXImageToVideoPipeline",
                         {**_COG_TRANSFORMER, "in_channels": 32, "use_learned_positional_embeddings": True,
                          "sample_height": 60, "sample_width": 90, "max_text_seq_length": 226}, _COG_VAE),
    "cogvideox-1.5-i2v": ("CogVideoXImageToVideoPipeline",
                          {**_COG_TRANSFORMER, "in_channels": 32, "patch_size_t": 2, "ofs_embed_dim": 512}, _COG_VAE),
    "cogvideox-dpm": ({"_class_name": "CogVideoXPipeline", "scheduler": ["diffusers", "CogVideoXDPMScheduler"]},
                      _COG_TRANSFORMER, _COG_VAE),
    "ltx": ("LTXPipeline", _LTX_TRANSFORMER, _LTX_VAE),
    "hunyuanvideo-i2v-token-replace": (
        "HunyuanVideoImageToVideoPipeline",
        {"_class_name": "HunyuanVideoTransformer3DModel", "num_attention_heads": 4, "num_layers": 1,
         "num_single_layers": 1, "patch_size": 2, "patch_size_t": 1, "image_condition_type": "token_replace"},
        {"_class_name": "AutoencoderKLHunyuanVideo", "spatial_compression_ratio": 8, "temporal_compression_ratio": 4}),
    "ltx-patch-t2": ("LTXPipeline", {**_LTX_TRANSFORMER, "patch_size_t": 2}, _LTX_VAE),
    "ltx-i2v": ("LTXImageToVideoPipeline", _LTX_TRANSFORMER, _LTX_VAE),
    "ltx-condition": ("LTXConditionPipeline", _LTX_TRANSFORMER, _LTX_VAE),
    "layers-1e7": ("FluxPipeline", {**_FLUX_TRANSFORMER, "num_layers": 10 ** 7}, _VAE),
    "layers-1e12": ("FluxPipeline", {**_FLUX_TRANSFORMER, "num_layers": 10 ** 12}, _VAE),
    "layers-1e400": ("FluxPipeline", {**_FLUX_TRANSFORMER, "num_layers": 10 ** 400}, _VAE),
    "heads-missing": ("FluxPipeline", {k: v for k, v in _FLUX_TRANSFORMER.items() if k != "num_attention_heads"},
                      _VAE),
    "heads-text": ("FluxPipeline", {**_FLUX_TRANSFORMER, "num_attention_heads": "four"}, _VAE),
    "heads-negative": ("FluxPipeline", {**_FLUX_TRANSFORMER, "num_attention_heads": -4}, _VAE),
    "heads-nan": ("FluxPipeline", {**_FLUX_TRANSFORMER, "num_attention_heads": float("nan")}, _VAE),
    "vae-levels-text": ("FluxPipeline", _FLUX_TRANSFORMER, {**_VAE, "block_out_channels": "wide"}),
    "nested-deep": ("FluxPipeline", _FLUX_TRANSFORMER, _VAE),  # its transformer config replaced below
}
NESTED_DEEP = '{"a": ' * 100_000 + "1" + "}" * 100_000
"""JSON nested 100,000 deep: Python's parser raises RecursionError."""


@pytest.fixture
def workdir(tmp_path):
    """Files the bad inputs refer to, and an earlier output that must survive."""
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "blank.txt").write_text("\n   \n\t\n")
    (tmp_path / "latin1.txt").write_bytes("un caf\u00e9 rouge\n".encode("latin-1"))
    (tmp_path / "earlier.png").write_bytes(b"an earlier output")
    Image.new("RGB", (80, 48)).save(tmp_path / "frame.png")  # an input image the checks accept
    (tmp_path / "folder.png").mkdir()
    Image.new("RGB", (8193, 1)).save(tmp_path / "wide.png")  # a side above input_image.MAX_IMAGE_SIDE
    Image.new("RGB", (1, 1)).save(tmp_path / "dot.png")  # below MIN_IMAGE_SIDE
    Image.new("RGB", (8192, 1)).save(tmp_path / "row.png")
    Image.new("RGB", (16, 4096)).save(tmp_path / "thin.png")  # beyond MAX_IMAGE_ASPECT
    for name, index in (("bad-json", '{"_class_name": "FluxPipeline",'), ("no-class", '{"a": 1}')):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model_index.json").write_text(index)
    for name, (pipeline, transformer, vae) in CONFIG_ONLY_MODELS.items():
        index = pipeline if isinstance(pipeline, dict) else {"_class_name": pipeline}  # a dict: the whole index
        for part, config in (("", index), ("transformer", transformer), ("vae", vae)):
            if config is not None:
                (tmp_path / name / part).mkdir(parents=True, exist_ok=True)
                (tmp_path / name / part / ("config.json" if part else "model_index.json")).write_text(json.dumps(config))
    (tmp_path / "nested-deep" / "transformer" / "config.json").write_text(NESTED_DEEP)
    return tmp_path


def _snapshot(folder):
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in folder.rglob("*")}


@pytest.mark.parametrize("flags,message", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_input_is_refused_before_ranks_start(flags, message, workdir, monkeypatch, capsys):
    def no_ranks(*args, **kwargs):
        raise AssertionError("ranks were started for a bad input")

    monkeypatch.setattr(meshdit.distributed.launch, "launch", no_ranks)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = ["generate", "--output", str(workdir / "out.png")] + [f.replace("{tmp}", str(workdir)) for f in flags]
    before = _snapshot(workdir)
    start = time.perf_counter()
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse's own refusals (not a number, unknown choice)
        status = exc.code
    seconds = time.perf_counter() - start
    err = capsys.readouterr().err
    assert status == 2, err
    assert message in err, err
    assert seconds < 0.5
    assert _snapshot(workdir) == before  # no earlier output touched, nothing written or left behind


def test_table_is_broad_enough():
    assert len(BAD_INPUTS) >= 25


# Refusals outside the generate table: serve's, and a torchrun world of the wrong size.
_TORCHRUN_WORLD_OF_3 = {"TORCHELASTIC_RUN_ID": "x", "RANK": "0", "WORLD_SIZE": "3", "LOCAL_RANK": "0"}
OTHER_REFUSALS = {
    "serve-max-queue-0": (["serve", "--max-queue", "0"], {}, "--max-queue must be >= 1"),
    "serve-ulysses-above-heads": (["serve", "--ulysses-degree", "8"], {}, "exceeds the model's 4 attention heads"),
    "serve-cfg-on-guidance-distilled-model": (["serve", "--model", "{tmp}/flux-dev", "--use-cfg-parallel"], {},
                                              "is guidance-distilled"),
    "serve-port-taken": (["serve", "--port", "{port}"], {}, "choose another --port"),
    "torchrun-world-of-the-wrong-size": (["generate", "--ulysses-degree", "2", "--output", "{tmp}/x.png"],
                                         _TORCHRUN_WORLD_OF_3, "torchrun started 3 ranks"),
    "serve-torchrun-world-of-the-wrong-size": (["serve", "--ulysses-degree", "2", "--port", "0"],
                                               _TORCHRUN_WORLD_OF_3, "torchrun started 3 ranks"),
}

# Runs each refusal in turn in one fresh interpreter; after each: its exit status and the heavy modules loaded.
_REFUSE_ALL = """
import contextlib, io, json, os, sys
from meshdit.cli import main
results = {}
for name, argv, env, message in json.loads(sys.argv[1]):
    saved, err = dict(os.environ), io.StringIO()
    os.environ.update(env)
    try:
        with contextlib.redirect_stderr(err):
            status = main(argv)
    except SystemExit as exc:
        status = exc.code
    finally:
        os.environ.clear()
        os.environ.update(saved)
    heavy = [m for m in ("torch", "diffusers", "transformers", "numpy") if m in sys.modules]
    results[name] = [status if message in err.getvalue() else err.getvalue(), heavy]
print(json.dumps(results))
"""


def test_refusals_come_before_the_heavy_imports(workdir):
    """Every refusal (the table above, serve's, torchrun's) happens without importing torch, diffusers,
    transformers or numpy: that is what keeps it under half a second."""
    cases = [(name, ["generate", "--output", str(workdir / "out.png")] + flags, {}, message)
             for name, (flags, message) in BAD_INPUTS.items()]
    cases += [(name, argv, env, message) for name, (argv, env, message) in OTHER_REFUSALS.items()]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        fill = {"{tmp}": str(workdir), "{port}": str(taken.getsockname()[1])}
        for _, argv, _, _ in cases:
            for i, arg in enumerate(argv):
                for key, value in fill.items():
                    argv[i] = argv[i].replace(key, value)
        proc = subprocess.run([sys.executable, "-c", _REFUSE_ALL, json.dumps(cases)], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.splitlines()[-1])
    assert {name: status for name, (status, _) in results.items() if status != 2} == {}  # else: stderr
    first_heavy = next((name for name, (_, heavy) in results.items() if heavy), None)
    assert first_heavy is None, f"{first_heavy} imported {results[first_heavy][1]}"


def test_non_utf8_prompt_bytes_from_the_shell_are_refused(tmp_path):
    """The real console path: argv bytes that are not UTF-8 end in one `meshdit: error:` line, no traceback."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable.encode(), b"-m", b"meshdit", b"generate", b"--prompt", b"caf\xe9",
                           b"--output", str(tmp_path / "x.png").encode()], capture_output=True, timeout=60, env=env)
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == 2, err
    assert "is not valid UTF-8" in err and "Traceback" not in err and "rank" not in err
    assert list(tmp_path.iterdir()) == []

