"""Video families: every exact layout equals one process on a token grid no degree divides; degree 1 is diffusers'
own (tests/models/test_diffusers_guard.py). Every video family runs through FAMILY_LAYOUTS (its tiny module's TESTS say
which); Wan 2.2's experts, image-to-video and CogVideoX's variants have tests of their own."""
import numpy as np
import pytest

from meshdit.testing.rank_pool import split_layout
from meshdit.testing.tiny_models import tiny_families
from tests.models import video_jobs

_REFERENCE: dict = {}


def world(layout: dict) -> int:
    return split_layout(layout)[0].world_size


def reference(name, prompts=None, steps=2):
    key = (name, tuple(prompts or ()), steps)
    if key not in _REFERENCE:
        _REFERENCE[key] = video_jobs.generate(name, {}, prompts, steps, fresh=True)
    return _REFERENCE[key]


def check(results, ref, name="wan", frames=video_jobs.FRAMES):
    """frames: of the output video (HunyuanVideo image-to-video drops 4)."""
    ref_out, ref_video, _ = ref
    assert ref_video.shape[1:] == (frames, *video_jobs.size(name), 3)
    for rank, (out, video, _) in enumerate(results):
        if out is not None:
            assert (out - ref_out).abs().max().item() <= 1e-5 * ref_out.abs().max().item(), f"rank {rank}: output"
        assert video.shape == ref_video.shape, f"rank {rank}: {video.shape}"
        assert np.abs(video - ref_video).max() <= 1e-5 * np.abs(ref_video).max(), f"rank {rank}: video differs"


LAYOUTS = {
    "u2": dict(ulysses_degree=2),
    "r2": dict(ring_degree=2),
    "r2u2": dict(ring_degree=2, ulysses_degree=2),
    "cfg2": dict(cfg_degree=2),
    "cfg2-u2": dict(cfg_degree=2, ulysses_degree=2),
}


DP_PROMPTS = ["a red cat", "a blue dog", "two green circles"]  # 3 videos over 2 groups
PIPEFUSION = dict(pipefusion_parallel_degree=2, warmup_steps=2)  # full warmup: both steps on the whole video
FAMILY_LAYOUTS = {**LAYOUTS, "dp2": dict(data_parallel_degree=2), "pf2": dict(PIPEFUSION, num_pipeline_patch=2),
                  "pf2-3patches": dict(PIPEFUSION, num_pipeline_patch=3)}
"""Every exact layout of a video family (PipeFusion on its 4-block pipeline)."""
# every video family under the layouts its tiny pipelines take (TinyTests.layouts; () where a test file of its own
# covers the family: HunyuanVideo's and HunyuanVideo 1.5's masked prompts)
FAMILY_CASES = [(module.TESTS, layout) for _, module in tiny_families(video=True)
                for layout in (FAMILY_LAYOUTS if module.TESTS.layouts is None else module.TESTS.layouts)]


@pytest.mark.parametrize("tiny,layout", FAMILY_CASES, ids=[f"{tiny.main}-{layout}" for tiny, layout in FAMILY_CASES])
def test_family_equals_one_process_under_every_layout(run_ranks, tiny, layout):
    """Wan: the flat frame-major sequence sharded at blocks.0's input, the rotary table at the rope's output;
    PipeFusion's patches are frame-major token rows (2 patches: one crosses a frame boundary). LTX: packed
    [B, S, C] tokens sharded at the model's input and its rotary table at the rope's output; PipeFusion's patches
    are runs of those tokens. CogVideoX: text and video tokens both sharded at the first block (joint attention
    over [text, video]), its rotary table where the model takes it; DDIM."""
    degrees = FAMILY_LAYOUTS[layout]
    pipefusion = "pipefusion_parallel_degree" in degrees
    name = tiny.four_blocks if pipefusion else tiny.main
    prompts = DP_PROMPTS if "data_parallel_degree" in degrees else None
    check(run_ranks(world(degrees), video_jobs.generate, name, degrees, prompts, fresh=pipefusion),
          reference(name, prompts), name)


I2V_LAYOUTS = ("u2", "r2", "r2u2", "cfg2", "dp2", "pf2")
"""The layouts each image-to-video build of a family (TinyTests.image_to_video) runs: its per-token or channel
condition split with the tokens, cut with the batch, under CFG and PipeFusion (the CFG x Ulysses and 3-patch
cases add nothing an I2V condition could break that these do not)."""
I2V_CASES = [(pair, layout) for _, module in tiny_families(video=True) for pair in module.TESTS.image_to_video
             for layout in I2V_LAYOUTS]


@pytest.mark.parametrize("pair,layout", I2V_CASES, ids=[f"{pair[0]}-{layout}" for pair, layout in I2V_CASES])
def test_family_image_to_video_equals_one_process(run_ranks, pair, layout):
    """LTX: the image's latents on the first latent frame, whose per-token timestep 0 is split with the tokens
    (PipeFusion: cut to the patch). CogVideoX: the image latents concatenated on channels, sharded with the
    video tokens."""
    degrees = FAMILY_LAYOUTS[layout]
    pipefusion = "pipefusion_parallel_degree" in degrees
    name = pair[1] if pipefusion else pair[0]
    prompts = DP_PROMPTS if "data_parallel_degree" in degrees else None
    check(run_ranks(world(degrees), video_jobs.generate, name, degrees, prompts, fresh=pipefusion),
          reference(name, prompts), name)


VAE_FAMILIES = [module.TESTS.main for _, module in tiny_families(video=True) if module.TESTS.layouts != ()]
VAE_FAMILIES += [main for _, module in tiny_families(video=True) for main, _ in module.TESTS.image_to_video]


@pytest.mark.parametrize("family", VAE_FAMILIES)
def test_family_parallel_vae_decode_equals_one_process(run_ranks, family):
    """--use-parallel-vae on a video model: the latents [B, C, F, h, w] decoded in row bands over the image group
    (meshdit.vae; each VAE class on 2, 3 and 4 ranks in tests/vae/test_video_vae.py). LTX's timestep-conditioned
    decoder: `temb` reaches vae.decode on every rank of the band split; CogVideoX's frame batches with conv caches,
    in the engine."""
    degrees = dict(ulysses_degree=2)
    check(run_ranks(2, video_jobs.generate, family, degrees, vae=dict(parallel=True)), reference(family), family)


@pytest.mark.parametrize("name,layout", [("cogvideox-dpm", "cfg2"), ("cogvideox-dpm", "r2u2"),
                                         ("cogvideox-dpm", "pf2"), ("cogvideox-sincos", "u2"),
                                         ("cogvideox-sincos", "r2"), ("cogvideox-sincos16", "u2"),
                                         ("cogvideox-sincos16", "r2"), ("cogvideox-sincos16", "pf2"),
                                         ("cogvideox-i2v-ofs", "cfg2")])
def test_cogvideox_variants_equal_one_process(run_ranks, name, layout):
    """The 5B's DPM scheduler (3 steps: its second-order update runs from step 2; it draws noise in every step
    from the request's generator, which every rank holds alike; data parallelism is refused, see
    tests/test_bad_input.py) and the 2B's sin-cos positional table (added before the split), over the released 226 text
    tokens and diffusers' test config's 16 (the fixed length read from max_text_seq_length); image-to-video's ofs
    embedding (one row for the batch, whichever branches a rank runs)."""
    degrees = dict(FAMILY_LAYOUTS[layout])
    steps = 3 if name.startswith("cogvideox-dpm") else 2
    if "pipefusion_parallel_degree" in degrees:
        name, degrees["warmup_steps"] = f"{name}-4blocks", steps  # full warmup: exact
    pipefusion = "pipefusion_parallel_degree" in degrees
    check(run_ranks(world(degrees), video_jobs.generate, name, degrees, steps=steps, fresh=pipefusion),
          reference(name, steps=steps), name)


def test_parallel_video_vae_decode_under_cfg_and_ulysses_equals_one_process(run_ranks):
    """The band split over the image group of a CFG x Ulysses layout (two image groups of 2 ranks)."""
    degrees = LAYOUTS["cfg2-u2"]
    check(run_ranks(world(degrees), video_jobs.generate, "wan", degrees, vae=dict(parallel=True)), reference("wan"))


def test_pipefusion_hybrid_with_ulysses_equals_one_process(run_ranks):
    degrees = dict(pipefusion_parallel_degree=2, ulysses_degree=2, warmup_steps=2)
    check(run_ranks(4, video_jobs.generate, "wan-4blocks", degrees, fresh=True), reference("wan-4blocks"))


@pytest.mark.parametrize("degrees", [dict(ring_degree=2, ulysses_degree=2), dict(cfg_degree=2, ring_degree=2),
                                     dict(pipefusion_parallel_degree=2, warmup_steps=2)],
                         ids=["r2u2", "cfg2-r2", "pf2"])
def test_wan22_two_experts_equal_one_process(run_ranks, degrees):
    """Wan 2.2's pair: the first step runs `transformer`, the second `transformer_2`; both are hooked alike."""
    fresh = "pipefusion_parallel_degree" in degrees
    results = run_ranks(world(degrees), video_jobs.generate, "wan22", degrees, fresh=fresh)
    check(results, reference("wan22"))
    for rank, (_, _, second) in enumerate(results):
        if fresh:  # PipeFusion: each stage keeps one of the 2 blocks of the second expert too
            assert second["skipped"] == 1, f"rank {rank}: {second}"
        elif "ring_degree" in degrees:  # the split on blocks.0, the marks on its self-attention modules
            assert second["hooks"] > 0, f"rank {rank}: {second}"


@pytest.mark.parametrize("degrees", [dict(ring_degree=2, ulysses_degree=2), dict(cfg_degree=2),
                                     dict(data_parallel_degree=2),
                                     dict(pipefusion_parallel_degree=2, warmup_steps=2, num_pipeline_patch=2)],
                         ids=["r2u2", "cfg2", "dp2", "pf2"])
def test_image_to_video_equals_one_process(run_ranks, degrees):
    """WanImageToVideoPipeline: the image condition joins the latents' channels (sharded with them, cut with
    the batch under data parallelism), the CLIP embeddings join the text (whole on every rank)."""
    name = "wan-i2v-4blocks" if "pipefusion_parallel_degree" in degrees else "wan-i2v"
    prompts = ["a red cat", "a blue dog", "two green circles"] if "data_parallel_degree" in degrees else None
    results = run_ranks(world(degrees), video_jobs.generate, name, degrees, prompts,
                        fresh=True)
    check(results, reference(name, prompts))


def test_generate_command_writes_a_playable_mp4(tiny_folder, tmp_path):
    """`meshdit generate --output clip.mp4` on 2 ranks (Ulysses 2, memory-efficient loading): an H.264 file
    that ffmpeg reads back with every frame, at the requested size and fps."""
    import subprocess
    import sys

    import imageio.v3 as iio

    common = [sys.executable, "-m", "meshdit", "generate", "--model", tiny_folder("wan"), "--prompt", "a red cat",
              "--height", str(video_jobs.HEIGHT), "--width", str(video_jobs.WIDTH), "--num-frames",
              str(video_jobs.FRAMES), "--steps", "2", "--max-sequence-length", str(video_jobs.TEXT), "--fps", "8"]
    clip = tmp_path / "clip.mp4"
    proc = subprocess.run(common + ["--ulysses-degree", "2", "--output", str(clip)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "1 video(s) of 9 frames at 8 fps, height 48 x width 80" in proc.stdout
    frames = np.stack(list(iio.imiter(clip)))  # decoded by ffmpeg
    assert frames.shape == (video_jobs.FRAMES, video_jobs.HEIGHT, video_jobs.WIDTH, 3)
    assert iio.immeta(clip)["fps"] == 8
    assert not [p.name for p in tmp_path.iterdir() if ".partial" in p.name]  # the temp file was renamed


def test_ltx_condition_steps_a_pipefusion_patch_as_its_part_of_the_whole():
    """LTXConditionPipeline steps per token (per-token timesteps; the conditioning tokens kept, then re-noised for
    the next step): a PipeFusion patch finds its tokens through the scheduler's token index, which the per-patch
    scheduler copies cut to their patch. Stepping each patch (one cutting the conditioning frame's rows) equals
    its part of the whole step, bit for bit."""
    import torch

    from meshdit.denoising.pipefusion_loop import _patch_scheduler
    from meshdit.engine import Engine
    from meshdit.testing.tiny_models import tiny_pipeline

    pipe = tiny_pipeline("ltx-condition")
    pipe.set_progress_bar_config(disable=True)
    engine = Engine(pipe)
    try:
        recipe = engine.recipe
        state = recipe.prepare(video_jobs.request("ltx-condition", pipe), torch.Generator().manual_seed(3),
                               torch.device("cpu"))
        t, latents, main = state.timesteps[0], state.latents, pipe.scheduler
        pred = torch.randn(latents.shape, generator=torch.Generator().manual_seed(0))
        whole = recipe.step(state, pred, t, latents.clone())
        assert not torch.equal(whole[:, :15], latents[:, :15])  # the image's 3 x 5 tokens, re-noised
        for row0, row1 in [(0, 2), (2, 9)]:  # 9 token rows of 5 tokens; the image's frame: rows 0-2
            def view(x, row0=row0, row1=row1):
                return recipe.patch_view(state, x, row0, row1)

            pipe.scheduler = _patch_scheduler(main, view, latents.shape)
            try:
                part = recipe.step(state, view(pred), t, view(latents).clone())
            finally:
                pipe.scheduler = main
            assert torch.equal(part, view(whole)), (row0, row1)
    finally:
        engine.close()
