"""HunyuanVideo: every exact layout equals one process, on tests/models/test_video.py's token grid (45 tokens: no degree
divides them) and layouts; degree 1 is diffusers' own (tests/models/test_diffusers_guard.py).

The prompt joins the video tokens in every attention with its padding masked (plan.MaskedTail): "a red cat"
keeps 4 of the 6 text tokens (3 words + the end token), so the masked path runs; two prompts of different
kept lengths in one batch attend one by one. Image-to-video: its own tests below."""
import pytest

from meshdit.config import GenerateRequest, ParallelConfig
from meshdit.errors import ConfigError
from tests.models import video_jobs
from tests.models.test_video import LAYOUTS, check, reference, world

PROMPT = ["a red cat"]
TWO = ["a red cat", "a blue dog on a square"]  # 4 and 6 (all) text tokens kept
SP = {name: degrees for name, degrees in LAYOUTS.items() if "cfg_degree" not in degrees}
CFG = {name: degrees for name, degrees in LAYOUTS.items() if "cfg_degree" in degrees}


@pytest.mark.parametrize("layout", list(SP))
def test_sequence_parallel_equals_one_process(run_ranks, layout):
    degrees = SP[layout]
    check(run_ranks(world(degrees), video_jobs.generate, "hunyuanvideo", degrees, PROMPT),
          reference("hunyuanvideo", PROMPT))


@pytest.mark.parametrize("layout", list(CFG))
def test_true_cfg_parallel_equals_one_process(run_ranks, layout):
    """A transformer without guidance_embeds runs true CFG (negative prompt ""): its branches over the cfg axis."""
    degrees = CFG[layout]
    check(run_ranks(world(degrees), video_jobs.generate, "hunyuanvideo-cfg", degrees, PROMPT),
          reference("hunyuanvideo-cfg", PROMPT))


def test_parallel_vae_decode_in_the_engine_equals_one_process(run_ranks):
    """--use-parallel-vae: AutoencoderKLHunyuanVideo decodes the latents in row bands over the 2 ranks."""
    degrees = dict(ulysses_degree=2)
    check(run_ranks(2, video_jobs.generate, "hunyuanvideo", degrees, PROMPT, vae=dict(parallel=True)),
          reference("hunyuanvideo", PROMPT))


def test_prompts_of_different_text_lengths_under_ulysses_equal_one_process(run_ranks):
    degrees = dict(ulysses_degree=2)
    check(run_ranks(2, video_jobs.generate, "hunyuanvideo", degrees, TWO), reference("hunyuanvideo", TWO))


def test_data_parallel_equals_one_process(run_ranks):
    prompts = ["a red cat", "a blue dog", "two green circles"]  # 3 videos over 2 groups
    check(run_ranks(2, video_jobs.generate, "hunyuanvideo", dict(data_parallel_degree=2), prompts),
          reference("hunyuanvideo", prompts))


@pytest.mark.parametrize("patches,prompts", [(2, PROMPT), (3, TWO)], ids=["2patches", "3patches-two-prompts"])
def test_pipefusion_with_full_warmup_equals_one_process(run_ranks, patches, prompts):
    """Dual-stream then single-stream blocks cut into 2 stages; each prompt keeps its own stale text K/V."""
    degrees = dict(pipefusion_parallel_degree=2, warmup_steps=2, num_pipeline_patch=patches)
    results = run_ranks(2, video_jobs.generate, "hunyuanvideo-4blocks", degrees, prompts, fresh=True)
    check(results, reference("hunyuanvideo-4blocks", prompts))


def test_pipefusion_hybrid_with_ring_equals_one_process(run_ranks):
    degrees = dict(pipefusion_parallel_degree=2, ring_degree=2, warmup_steps=2)
    results = run_ranks(4, video_jobs.generate, "hunyuanvideo-4blocks", degrees, PROMPT, fresh=True)
    check(results, reference("hunyuanvideo-4blocks", PROMPT))


# image-to-video (HunyuanVideoImageToVideoPipeline, latent_concat): LLaVA's 288 image tokens, all kept, lead the
# prompt stream every rank holds whole; the image's latents join the channels, split with the video tokens. The
# first 4 decoded frames are dropped, as the pipeline does. Text length 16: the prompt and the template's assistant
# header fit ("a red cat": 288 + 6 of 300 prompt tokens kept, the rest masked).
I2V = dict(extra={"max_sequence_length": 16})
I2V_CFG = dict(I2V, guidance_scale=3.0)  # true CFG: the negative prompt "" with a black image
I2V_FRAMES = video_jobs.FRAMES - 4
I2V_LAYOUTS = {
    "u2": (dict(ulysses_degree=2), I2V),
    "r2": (dict(ring_degree=2), I2V),
    "r2u2": (dict(ring_degree=2, ulysses_degree=2), I2V_CFG),
    "cfg2": (dict(cfg_degree=2), I2V_CFG),
    "dp2": (dict(data_parallel_degree=2), I2V),
    "pf2": (dict(pipefusion_parallel_degree=2, warmup_steps=2, num_pipeline_patch=2), I2V_CFG),
}
_I2V_REFERENCE: dict = {}


def i2v_reference(name, prompts, fields):
    key = (name, tuple(prompts), repr(fields))
    if key not in _I2V_REFERENCE:
        _I2V_REFERENCE[key] = video_jobs.generate(name, {}, prompts, fresh=True, fields=fields)
    return _I2V_REFERENCE[key]


@pytest.mark.parametrize("layout", list(I2V_LAYOUTS))
def test_image_to_video_equals_one_process(run_ranks, layout):
    degrees, fields = I2V_LAYOUTS[layout]
    pipefusion = "pipefusion_parallel_degree" in degrees
    name = "hunyuanvideo-i2v-4blocks" if pipefusion else "hunyuanvideo-i2v"
    prompts = ["a red cat", "a blue dog", "two green circles"] if "data_parallel_degree" in degrees else PROMPT
    results = run_ranks(world(degrees), video_jobs.generate, name, degrees, prompts, fresh=pipefusion, fields=fields)
    check(results, i2v_reference(name, prompts, fields), frames=I2V_FRAMES)


def test_image_to_video_parallel_vae_decode_equals_one_process(run_ranks):
    degrees = dict(ulysses_degree=2)
    results = run_ranks(2, video_jobs.generate, "hunyuanvideo-i2v", degrees, PROMPT, vae=dict(parallel=True),
                        fields=I2V)
    check(results, i2v_reference("hunyuanvideo-i2v", PROMPT, I2V), frames=I2V_FRAMES)


def test_image_to_video_command_with_lean_loading_equals_one_process(tiny_folder, tmp_path):
    """`meshdit generate --image` on 2 ranks (ulysses 2, memory-efficient loading) writes one process's video: every
    rank VAE-encodes the image while preparing, so every rank loads the VAE (not only the decoding one)."""
    import subprocess
    import sys

    import numpy as np

    from meshdit.testing.tiny_models import sample_image

    sample_image(video_jobs.HEIGHT, video_jobs.WIDTH).save(tmp_path / "first.png")
    common = [sys.executable, "-m", "meshdit", "generate", "--model", tiny_folder("hunyuanvideo-i2v"), "--image",
              str(tmp_path / "first.png"), "--prompt", "a red cat", "--height", str(video_jobs.HEIGHT), "--width",
              str(video_jobs.WIDTH), "--num-frames", str(video_jobs.FRAMES), "--steps", "2", "--max-sequence-length",
              "16"]
    for name, layout in (("one", []), ("two", ["--ulysses-degree", "2"])):
        proc = subprocess.run(common + layout + ["--output", str(tmp_path / f"{name}.npy")], capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    one, two = np.load(tmp_path / "one.npy"), np.load(tmp_path / "two.npy")
    assert one.shape[-4:] == (I2V_FRAMES, video_jobs.HEIGHT, video_jobs.WIDTH, 3)
    assert np.abs(two - one).max() <= 1e-5 * np.abs(one).max()


def test_image_to_video_refusals_from_the_config_files(tiny_folder, tmp_path):
    """Its default guidance is the pipeline's 1.0 (one branch: CFG parallel refused); it needs --image; a
    token_replace transformer is refused, naming the setting."""
    import json
    import shutil

    from meshdit.models.info import ModelInfo
    from meshdit.testing.tiny_models import sample_image

    info = ModelInfo.from_pretrained(tiny_folder("hunyuanvideo-i2v"))
    good = dict(prompt="a cat", height=video_jobs.HEIGHT, width=video_jobs.WIDTH, num_frames=video_jobs.FRAMES,
                image=sample_image())
    assert info.request_defaults().guidance_scale == 1.0
    info.check_request(ParallelConfig(cfg_degree=2), GenerateRequest(**good, guidance_scale=3.0))
    with pytest.raises(ConfigError, match="guidance scale 1.0 turns classifier-free guidance off"):
        info.check_request(ParallelConfig(cfg_degree=2), GenerateRequest(**good))
    with pytest.raises(ConfigError, match="animates an image: pass its first frame with --image PATH"):
        info.check_request(ParallelConfig(), GenerateRequest(**{**good, "image": None}))
    token_replace = tmp_path / "token-replace"
    shutil.copytree(tiny_folder("hunyuanvideo-i2v"), token_replace, ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((token_replace / "transformer" / "config.json").read_text())
    (token_replace / "transformer" / "config.json").write_text(json.dumps({**config,
                                                                          "image_condition_type": "token_replace"}))
    with pytest.raises(ConfigError, match="sets image_condition_type 'token_replace' \\(the first frame's tokens "
                                          ".*use a model without image_condition_type 'token_replace'"):
        ModelInfo.from_pretrained(str(token_replace)).check_request(ParallelConfig(), GenerateRequest(**good))


@pytest.mark.parametrize("size,message", [
    (dict(num_frames=8), r"compresses 4 frames into one after the first: use k \* 4 \+ 1 frames, e\.g\. "
                         r"--num-frames 5 or 9"),
    (dict(height=40), "height 40 cannot be split into this model's patches: it must be a multiple of 16"),
    (dict(width=88), "width 88 cannot be split into this model's patches: it must be a multiple of 16"),
], ids=["frames", "height", "width"])
def test_bad_video_sizes_are_refused_from_the_config_files(tiny_folder, size, message):
    """Read from model_index.json, transformer/ and vae/ configs alone (what the CLI checks before ranks start)."""
    from meshdit.models.info import ModelInfo

    info = ModelInfo.from_pretrained(tiny_folder("hunyuanvideo"))
    request = dict(prompt="a cat", height=video_jobs.HEIGHT, width=video_jobs.WIDTH, num_frames=video_jobs.FRAMES)
    info.check_request(ParallelConfig(ulysses_degree=2), GenerateRequest(**request))  # the good sizes pass
    with pytest.raises(ConfigError, match=message):
        info.check_request(ParallelConfig(ulysses_degree=2), GenerateRequest(**{**request, **size}))


def test_guidance_distilled_model_refuses_cfg_parallel(tiny_folder):
    from meshdit.models.info import ModelInfo

    info = ModelInfo.from_pretrained(tiny_folder("hunyuanvideo"))
    with pytest.raises(ConfigError, match="use-cfg-parallel"):
        info.check_request(ParallelConfig(cfg_degree=2), GenerateRequest(
            prompt="a cat", height=video_jobs.HEIGHT, width=video_jobs.WIDTH, num_frames=video_jobs.FRAMES))


def _tail_attention(head: int):
    from meshdit.attention.usp import SequenceGroups
    from meshdit.parallel.plan import MaskedTail
    from meshdit.parallel.sequence import _MaskedTailAttention, _SequenceState

    state = _SequenceState(SequenceGroups(None, 1, None, 1), None, 0, 1, stream_lens={"img": [head]})
    return _MaskedTailAttention(state, MaskedTail(("img",), "txt"), "transformer_blocks.0.attn")


def test_masked_tail_attention_equals_masked_sdpa_on_the_kept_tokens():
    """One process: dropping the masked tail tokens gives masked SDPA's output on every kept token; the masked
    positions come back 0."""
    import torch

    q, k, v = torch.randn(3, 2, 4, 7, 8).unbind(0)  # [B=2, H=4, 3 video + 4 text tokens, D=8]
    mask = torch.tensor([[True] * 5 + [False] * 2, [True] * 7])[:, None, None]  # [2, 1, 1, 7]: 2 and 4 kept
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out = _tail_attention(3)(q, k, v, mask)
    assert torch.allclose(out[0, :, :5], expected[0, :, :5], atol=1e-6) and not out[0, :, 5:].any()
    assert torch.allclose(out[1], expected[1], atol=1e-6)


def test_masked_tail_takes_only_a_boolean_key_mask_keeping_a_prefix_of_the_tail():
    import torch

    attention = _tail_attention(3)
    mask = torch.tensor([[True] * 5 + [False] * 2])[:, None, None]
    assert attention._kept(mask, 1, 3, 4) == [2]
    gap = mask.clone()
    gap[..., 4], gap[..., 5] = False, True  # a masked text token before a kept one
    masked_video = mask.clone()
    masked_video[..., 0] = False
    for bad in (gap, masked_video):
        with pytest.raises(NotImplementedError, match="prefix"):
            attention._kept(bad, 1, 3, 4)
    with pytest.raises(NotImplementedError, match="boolean key mask"):
        attention._kept(mask.float(), 1, 3, 4)
