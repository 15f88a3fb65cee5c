"""Each family's tiny random-weight pipelines, built in code (no downloads), for tests and benchmarks.

A family's record names its tiny module (`ModelFamily.modules.tiny`: `meshdit.models.tiny.<family>`), which
holds, beside the family's plan and recipe in `meshdit.models.<family>`:

- `BUILDERS`: {name: builder(seed=0) -> pipeline}. Each builder seeds torch, so the same call gives the same
  weights in every process. Sizes are chosen so that the head count (4) allows Ulysses 4, while token counts at
  the test resolutions do not all divide by the degrees.
- `TESTS`: a `TinyTests` naming which of them the parametrised tests run.
- `GUARD_CASES`: {case: GuardCase}, tests/models/test_diffusers_guard.py's degree-1 runs against the plain pipeline.

`meshdit.testing.tiny_models` joins them over `FAMILIES` (`BUILDERS`, `tiny_pipeline(name)`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TinyTests:
    """Which of a family's tiny pipelines (names in its BUILDERS) the parametrised tests run, and where."""

    main: str
    """The family's representative. Image families: every sequence-parallel layout and the parallel VAE
    (tests/parallel/test_sequence_parallel.py), the CFG and data-parallel cases (tests/parallel/test_cfg_data_parallel.py). Video
    families: every exact layout of tests/models/test_video.py (FAMILY_LAYOUTS) and the parallel VAE."""
    four_blocks: str
    """Four blocks, for up to four PipeFusion stages (tests/parallel/test_pipefusion.py; video: test_video's PipeFusion
    layouts)."""
    variants: tuple[str, ...] = ()
    """Image families: other pipelines or variants of the family, run under Ring 2 x Ulysses 2."""
    edit: str | None = None
    """The family's tiny image-edit pipeline (a name in BUILDERS; its row's image_edit_pipelines), where it has one:
    the --image CLI test and serve's /v1/images/edits test run it."""
    image_to_video: tuple[tuple[str, str], ...] = ()
    """Video families: (build, its four-block build) of each image-to-video pipeline (names in BUILDERS), run
    through tests/models/test_video.py's I2V_LAYOUTS and the parallel VAE besides `main` (LTX, CogVideoX)."""
    tensor_parallel: tuple[str, ...] | None = None
    """Builds tests/parallel/test_tensor_parallel.py runs under tp 2, equal to one process, where the family's record
    sets parallel.tensor (None: main; (): none, where another family's builds test the same transformer: FLUX.1
    Kontext's is FLUX.1's)."""
    tensor_parallel_share: float = 0.55
    """The most of a block's bytes one of the tp 2 ranks may hold (HunyuanDiT: 0.75, its long skips' skip_linear
    stays whole: it reads the whole LayerNorm of cat(x, skip))."""
    layouts: tuple[str, ...] | None = None
    """Ids of the family test's layouts that apply (image: tests/test_cfg_data_parallel.CASES; video:
    tests/test_video.FAMILY_LAYOUTS); None: every one; (): none there (a test file of its own covers them)."""
    guidance: float | None = None
    """The tests' guidance scale (FLUX.1: 3.0, true CFG); None: the model's default."""
    prompt_embeds: tuple[int, int] | None = None
    """(tokens, width) of random prompt embeddings, one row per prompt, for a tiny pipeline without a text encoder
    (FLUX.2); None: the prompts are encoded."""
    request_extra: dict[str, Any] = field(default_factory=dict)
    """Recipe settings the tests' requests add (LTX: its 0.9.1 decode timestep and noise)."""
    token_scale: int = 1
    """Test sizes are written for tokens 4 pixels wide (image: VAE 2 x patch 2) or 16 (video: VAE 8 x patch 2);
    a family whose tokens are wider multiplies them by this (HunyuanDiT: 4, LTX: 2), so every family sees the same
    token grids."""
    unscaled: tuple[str, ...] = ()
    """Builds of the family whose tokens are 4 (image) or 16 (video) pixels wide after all, so token_scale skips
    them (HunyuanDiT's VAE-factor-2 build)."""
    build_scales: dict[str, int] = field(default_factory=dict)
    """Builds whose tokens are wider than token_scale says: their own scale (Wan 2.2 TI2V's 32-pixel tokens: 2)."""

    def scale_of(self, name: str) -> int:
        """How much wider than the tests' sizes build `name`'s sizes are (token_scale, unscaled, build_scales)."""
        if name in self.build_scales:
            return self.build_scales[name]
        return 1 if name in self.unscaled else self.token_scale


@dataclass(frozen=True)
class GuardCase:
    """One degree-1 run of tests/models/test_diffusers_guard.py: meshdit's image must equal the pipeline's bit for bit."""

    build: str
    """The tiny pipeline (a name in BUILDERS)."""
    call: dict[str, Any]
    """The diffusers pipeline's __call__ arguments (besides size, steps and generator)."""
    guidance: float | None
    """meshdit's guidance_scale for the same run (None: the model's default)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """meshdit request extras (besides max_sequence_length, taken from `call`)."""
    size: dict[str, int] = field(default_factory=dict)
    """Overrides of GUARD_SIZE (height, width, num_inference_steps)."""


GUARD_PROMPT = "a red cat on a blue square"
GUARD_TEXT = 16
"""max_sequence_length of the guard's runs, kept small for speed."""
GUARD_SIZE = dict(height=64, width=48, num_inference_steps=2)
