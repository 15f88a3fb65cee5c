"""HunyuanVideo 1.5: every exact layout equals one process, on tests/models/test_video.py's token grid (45 video tokens: no
degree divides them); degree 1 is diffusers' own (tests/models/test_diffusers_guard.py).

The prompt has quoted text, so both text encoders keep tokens: 12 ByT5 (the glyph text) + 7 Qwen of the 1985 text
tokens after the video tokens; the rest (padding, and the 729 image tokens of text-to-video) is masked query x key
in every attention (plan.MaskedTail drops it). CFG runs through the pipeline's guider (its scale 4.0 the default)."""
import pytest

from meshdit.config import GenerateRequest, ParallelConfig
from meshdit.errors import ConfigError
from tests.models import video_jobs
from tests.models.test_video import LAYOUTS, PIPEFUSION, check, reference, world

PROMPT = ['a red cat saying "hi"']
DP_PROMPTS = ['a red cat saying "hi"', "a blue dog", "two green circles"]  # 3 videos over 2 groups
LAYOUTS15 = {**LAYOUTS, "dp2": dict(data_parallel_degree=2), "pf2": dict(PIPEFUSION, num_pipeline_patch=2)}


def _layout_equals_one_process(run_ranks, build: str, degrees: dict) -> None:
    pipefusion = "pipefusion_parallel_degree" in degrees
    name = f"{build}-4blocks" if pipefusion else build
    prompts = DP_PROMPTS if "data_parallel_degree" in degrees else PROMPT
    check(run_ranks(world(degrees), video_jobs.generate, name, degrees, prompts, fresh=pipefusion),
          reference(name, prompts))


@pytest.mark.parametrize("layout", list(LAYOUTS15))
def test_every_layout_equals_one_process(run_ranks, layout):
    _layout_equals_one_process(run_ranks, "hunyuanvideo15", LAYOUTS15[layout])


def test_prompts_of_different_text_lengths_under_ulysses_equal_one_process(run_ranks):
    """19 and 3 text tokens kept (the second has no quoted text: no ByT5 tokens): the videos attend one by one."""
    prompts = DP_PROMPTS[:2]
    check(run_ranks(2, video_jobs.generate, "hunyuanvideo15", dict(ulysses_degree=2), prompts),
          reference("hunyuanvideo15", prompts))


def test_parallel_vae_decode_in_the_engine_equals_one_process(run_ranks):
    """--use-parallel-vae: AutoencoderKLHunyuanVideo15 decodes the latents in row bands over the 2 ranks."""
    degrees = dict(ulysses_degree=2)
    check(run_ranks(2, video_jobs.generate, "hunyuanvideo15", degrees, PROMPT, vae=dict(parallel=True)),
          reference("hunyuanvideo15", PROMPT))


# image-to-video (HunyuanVideo15ImageToVideoPipeline): SigLIP's 16 image tokens, all kept, lead the text tail every
# rank holds whole; the first frame's latents and mask join the channels, split with the video tokens
I2V_LAYOUTS = dict(LAYOUTS15)
I2V_LAYOUTS.pop("cfg2-u2")  # (cfg 2 and ulysses 2 apart suffice: the image adds no stream of its own)


@pytest.mark.parametrize("layout", list(I2V_LAYOUTS))
def test_image_to_video_equals_one_process(run_ranks, layout):
    _layout_equals_one_process(run_ranks, "hunyuanvideo15-i2v", I2V_LAYOUTS[layout])


def test_image_to_video_parallel_vae_decode_equals_one_process(run_ranks):
    check(run_ranks(2, video_jobs.generate, "hunyuanvideo15-i2v", dict(ulysses_degree=2), PROMPT,
                    vae=dict(parallel=True)), reference("hunyuanvideo15-i2v", PROMPT))


def test_image_to_video_needs_an_image_and_text_to_video_takes_none():
    from meshdit.models.info import ModelInfo
    from meshdit.testing.tiny_models import sample_image, tiny_pipeline

    i2v = ModelInfo.from_pipeline(tiny_pipeline("hunyuanvideo15-i2v"))
    i2v.check_request(ParallelConfig(cfg_degree=2), GenerateRequest(**GOOD, image=sample_image()))
    with pytest.raises(ConfigError, match="HunyuanVideo15ImageToVideoPipeline animates an image: pass its first "
                                          "frame with --image PATH"):
        i2v.check_request(ParallelConfig(), GenerateRequest(**GOOD))
    with pytest.raises(ConfigError, match="HunyuanVideo15Pipeline makes videos from text alone and takes no image"):
        ModelInfo.from_pipeline(tiny_pipeline("hunyuanvideo15")).check_request(
            ParallelConfig(), GenerateRequest(**GOOD, image=sample_image()))


GOOD = dict(prompt="a cat", height=video_jobs.HEIGHT, width=video_jobs.WIDTH, num_frames=video_jobs.FRAMES)


@pytest.mark.parametrize("change,message", [
    (dict(num_frames=8), r"compresses 4 frames into one after the first: use k \* 4 \+ 1 frames, e\.g\. "
                         r"--num-frames 5 or 9"),
    (dict(height=40), "height 40 cannot be split into this model's patches: it must be a multiple of 16"),
    (dict(width=88), "width 88 cannot be split into this model's patches: it must be a multiple of 16"),
    (dict(extra={"max_sequence_length": 256}), "takes exactly 1000 text tokens.*not 256: drop --max-sequence-length"),
], ids=["frames", "height", "width", "text-length"])
def test_bad_requests_are_refused_from_the_config_files(tiny_folder, change, message):
    """Read from model_index.json, transformer/, vae/ and guider/ configs alone (what the CLI checks before ranks
    start); the guider's scale is the default guidance."""
    from meshdit.models.info import ModelInfo

    info = ModelInfo.from_pretrained(tiny_folder("hunyuanvideo15"))
    assert info.request_defaults().guidance_scale == 4.0 and info.default_size == (480, 848)
    info.check_request(ParallelConfig(cfg_degree=2), GenerateRequest(**GOOD))  # the good sizes pass
    with pytest.raises(ConfigError, match=message):
        info.check_request(ParallelConfig(ulysses_degree=2), GenerateRequest(**{**GOOD, **change}))


def test_guider_other_than_plain_cfg_is_refused():
    from diffusers import ClassifierFreeGuidance

    from meshdit.models.hunyuanvideo15 import _runs_cfg

    assert _runs_cfg(ClassifierFreeGuidance(guidance_scale=4.0), 4.0)
    assert not _runs_cfg(ClassifierFreeGuidance(guidance_scale=4.0), 1.0)
    assert not _runs_cfg(ClassifierFreeGuidance(guidance_scale=4.0, enabled=False), 4.0)
    for bad in (dict(guidance_rescale=0.7), dict(stop=0.5), dict(use_original_formulation=True)):
        with pytest.raises(NotImplementedError, match="not plain classifier-free guidance"):
            _runs_cfg(ClassifierFreeGuidance(**bad), 4.0)


def _tail_attention(head: int):
    from meshdit.attention.usp import SequenceGroups
    from meshdit.parallel.plan import MaskedTail
    from meshdit.parallel.sequence import _MaskedTailAttention, _SequenceState

    state = _SequenceState(SequenceGroups(None, 1, None, 1), None, 0, 1, stream_lens={"img": [head]})
    return _MaskedTailAttention(state, MaskedTail(("img",), "txt"), "transformer_blocks.0.attn")


def test_masked_tail_takes_a_query_x_key_mask_of_one_token_mask_and_equals_sdpa():
    """HunyuanVideo 1.5's processor masks padding as query and key: SDPA gives those rows 0, as MaskedTail does."""
    import torch

    q, k, v = torch.randn(3, 2, 4, 7, 8).unbind(0)  # [B=2, H=4, 3 video + 4 text tokens, D=8]
    tokens = torch.tensor([[True] * 5 + [False] * 2, [True] * 7])  # [2, 7]: 2 and 4 text tokens kept
    mask = (tokens[:, None, :, None] & tokens[:, None, None, :])  # [2, 1, 7, 7]
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out = _tail_attention(3)(q, k, v, mask)
    assert torch.allclose(out, expected, atol=1e-6) and not out[0, :, 5:].any()
    attention = _tail_attention(3)
    assert attention._kept(tokens[:, None, None, :].expand(2, 1, 7, 7), 2, 3, 4) == [2, 4]  # every row equal
    lopsided = mask.clone()
    lopsided[0, 0, 6, :5] = True  # a padding query that sees the kept keys: its output would not be 0
    with pytest.raises(NotImplementedError, match="one token mask applied to queries and keys alike"):
        attention._kept(lopsided, 2, 3, 4)
