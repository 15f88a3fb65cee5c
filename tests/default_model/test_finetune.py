"""Continued training: start from the bundled weights, resume across time-boxed runs on one step schedule, save."""
import json

import numpy as np
import pytest
import torch

from default_model import dataset as D
from default_model import finetune as F
from meshdit.default_model import weights_path


def test_caption_batch_mixes_fixed_natural_and_empty_captions():
    scenes = [D.sample_scene(np.random.default_rng([i, 1])) for i in range(2000)]
    texts = F.caption_batch(scenes, np.random.default_rng(0), fixed_share=0.2, drop=0.1)
    empty = sum(t == "" for t in texts) / len(texts)
    fixed = sum(t == s.caption for t, s in zip(texts, scenes)) / len(texts)
    assert 0.07 < empty < 0.13 and 0.2 < fixed < 0.3  # natural captions sometimes say the fixed caption too
    assert F.batch_for(256) == 16 and F.batch_for(512) == 4


def test_runs_resume_one_schedule_until_the_plan_is_spent_then_save(tmp_path):
    torch.set_num_threads(1)
    ckpt, cache, images = tmp_path / "ckpt", tmp_path / "cache", {256: 4, 512: 2}
    F.start(weights_path(), ckpt, seed=0, plan_steps=10_000)
    F.make_latents(ckpt, cache, images, seed=0)
    assert torch.load(cache / "latents-512.pt")["z"].shape == (2, 4, 64, 64)
    run = dict(seed=0, lr=1e-4, fixed_share=0.2, save_every=10, base_batch=1)  # batches of 2: fast steps
    assert not F.train(ckpt, cache, images, minutes=0.01, **run)
    first = torch.load(ckpt / "state.pt")
    assert first["step"] > 0 and 0 < first["trained_s"] < 60 and first["opt"] is not None
    with pytest.raises(SystemExit, match="already at step"):  # a plan cannot end before the checkpoint
        F.train(ckpt, cache, images, minutes=10, replan=first["step"], **run)
    # Replan to 3 steps more: a long run trains only those, then the plan is complete (and stays replanned).
    assert F.train(ckpt, cache, images, minutes=10, replan=first["step"] + 3, **run)
    second = torch.load(ckpt / "state.pt")
    assert second["step"] == first["step"] + 3 and second["plan_steps"] == first["step"] + 3
    assert first["trained_s"] < second["trained_s"] < first["trained_s"] + 60
    assert f"plan 10000 -> {first['step'] + 3} steps" in (ckpt / "steps.txt").read_text()
    assert F.train(ckpt, cache, images, minutes=10, **run)  # nothing left: no step
    assert torch.load(ckpt / "state.pt")["step"] == second["step"]
    # A restart begins a new cosine at the checkpoint's step (it needs the step the cosine ends at).
    with pytest.raises(SystemExit, match="needs --replan"):
        F.train(ckpt, cache, images, minutes=10, restart=True, **run)
    assert F.train(ckpt, cache, images, minutes=10, replan=second["step"] + 2, restart=True, centre_prior=0.7, **run)
    third = torch.load(ckpt / "state.pt")
    assert third["step"] == second["step"] + 2 and third["cycle_start"] == second["step"]
    assert not torch.equal(third["model"]["proj_out.weight"], second["model"]["proj_out.weight"])  # lr > 0 at once
    assert f"cosine restarted at step {second['step']}" in (ckpt / "steps.txt").read_text()
    F.save_pipeline(ckpt, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "vocabulary.json").read_text())["grammar"] == "natural"
    assert (tmp_path / "out" / "transformer" / "diffusion_pytorch_model.safetensors").exists()
