"""Jobs of tests/models/test_zimage.py, run on every rank of the pool (module-level: they are pickled)."""
import dataclasses

import torch

from meshdit.config import GenerateRequest
from meshdit.engine import Engine
from meshdit.models import zimage
from meshdit.parallel.plan import LOCAL
from meshdit.testing.rank_pool import mesh_for, split_layout
from tests.parallel.sp_jobs import pipeline

# two prompts whose chat-templated tokens pad to different multiples of 32 (about 12 and 40 tokens): their joint
# sequences differ in length, so every main layer gets a key mask
SHORT = "a red cat"
LONG = " ".join(["a red cat on a blue square with a green dog"] * 4)
SIZE = (36, 44)  # pixels: 9 x 11 tokens, 99 padded to 128 image tokens; with the captions 160 and 192 in all


def broken_plan(variant: str):
    """The family plan with one wrong choice: `local-layers` leaves the main layers' attention to each rank's shard;
    `freqs-once` splits the rotary table for the first layer only (the others get it whole)."""
    sequence = zimage.PLAN.sequence
    if variant == "local-layers":
        sequence = dataclasses.replace(sequence, attention={**sequence.attention, "layers.*": LOCAL})
    elif variant == "freqs-once":
        sequence = dataclasses.replace(sequence, splits=tuple(
            dataclasses.replace(s, module="layers.0") if s.arg == "freqs_cis" else s for s in sequence.splits))
    return dataclasses.replace(zimage.PLAN, sequence=sequence)


def two_prompts(degrees: dict, guidance: float = 3.0, variant: str = "plan"):
    """The image of both prompts in one batch (a key mask in every main layer) under `degrees`, with the family
    plan or a broken `variant` of it."""
    pipe = pipeline("zimage")
    config, settings = split_layout(degrees)
    saved = zimage.PLAN
    zimage.PLAN = zimage.PLAN if variant == "plan" else broken_plan(variant)
    try:
        engine = Engine(pipe, mesh_for(config) if config.world_size > 1 else None)
    finally:
        zimage.PLAN = saved
    try:
        request = GenerateRequest(prompt=[SHORT, LONG], height=SIZE[0], width=SIZE[1], num_inference_steps=2,
                                  seed=3, guidance_scale=guidance, negative_prompt="a dog",
                                  extra=dict(max_sequence_length=64), **settings)
        with torch.inference_mode():
            return engine.generate(request).images
    finally:
        engine.close()
