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


def test_learning_rate_is_one_cosine_per_cycle_with_warmup():
    assert F.learning_rate(0, 1e-3, 1000) == 1e-5  # first of 100 warmup steps
    assert F.learning_rate(99, 1e-3, 1000) == pytest.approx(1e-3 * 0.5 * (1 + np.cos(np.pi * 0.099)))
    assert F.learning_rate(500, 1e-3, 1000) == pytest.approx(0.5e-3)
    assert F.learning_rate(1000, 1e-3, 1000) == pytest.approx(0.0, abs=1e-15)
    # A restart at step 42,000 to 48,500 warms up again from its own start, peaks, and ends at zero.
    assert F.learning_rate(42_000, 1.5e-4, 48_500, cycle_start=42_000) == pytest.approx(1.5e-6)
    assert F.learning_rate(42_099, 1.5e-4, 48_500, cycle_start=42_000) == pytest.approx(1.5e-4, rel=1e-3)
    assert F.learning_rate(45_250, 1.5e-4, 48_500, cycle_start=42_000) == pytest.approx(0.75e-4)
    # Without the restart the same step sits near the end of the old cosine (0 to 48,500): 4 % of the peak.
    assert F.learning_rate(42_000, 1.5e-4, 48_500) < 0.05 * 1.5e-4


def test_dropping_the_pooled_input_answers_every_prompt_as_the_empty_one():
    from diffusers import FluxTransformer2DModel

    model = FluxTransformer2DModel.from_pretrained(weights_path(), subfolder="transformer").eval()
    gen = torch.Generator().manual_seed(0)
    x, text = torch.randn(1, 64, 16, generator=gen), torch.randn(1, 8, 64, generator=gen)  # 8x8 packed latents
    empty, other = torch.randn(2, 1, 64, generator=gen)  # two pooled vectors

    def velocity(pooled):
        with torch.no_grad():
            return model(hidden_states=x, encoder_hidden_states=text, pooled_projections=pooled,
                         timestep=torch.tensor([0.5]), img_ids=torch.zeros(64, 3), txt_ids=torch.zeros(8, 3)).sample

    before, before_other = velocity(empty), velocity(other)
    assert not torch.allclose(before, before_other)  # the pooled vector mattered
    F.drop_pooled_input(model, empty)
    assert torch.allclose(velocity(empty), before, atol=1e-5)
    assert torch.equal(velocity(other), velocity(empty))  # and now does not


def test_deepening_adds_blocks_that_change_nothing_until_trained(tmp_path):
    from diffusers import FluxTransformer2DModel

    from default_model import components as C

    torch.set_num_threads(1)
    ckpt = tmp_path / "ckpt"
    F.start(weights_path(), ckpt, seed=0, plan_steps=100)
    old = FluxTransformer2DModel.from_pretrained(weights_path(), subfolder="transformer").eval()
    double, single = old.config.num_layers, old.config.num_single_layers  # the shipped 3 + 6
    F.deepen(ckpt, double + 1, single + 2)
    F.deepen(ckpt, double + 1, single + 2)  # a resumed run repeating the option changes nothing
    grown = f"blocks {double},{single} -> {double + 1},{single + 2}"
    assert (ckpt / "steps.txt").read_text().count(grown) == 1
    state = torch.load(ckpt / "state.pt")
    assert state["opt"] is None
    new = FluxTransformer2DModel.from_pretrained(ckpt / "transformer").eval()  # the EMA, as --save writes it
    assert (new.config.num_layers, new.config.num_single_layers) == (double + 1, single + 2)
    trained = FluxTransformer2DModel.from_config(new.config)
    trained.load_state_dict(state["model"])
    gen = torch.Generator().manual_seed(0)
    x, text, pooled = torch.randn(2, 64, 16, generator=gen), torch.randn(2, 8, 64, generator=gen), torch.randn(2, 64, generator=gen)
    img_ids = torch.stack([torch.zeros(64), torch.arange(64) // 8, torch.arange(64) % 8], 1)  # [64, 3]: 8x8 grid

    def velocity(model):
        with torch.no_grad():
            return model(hidden_states=x, encoder_hidden_states=text, pooled_projections=pooled,
                         timestep=torch.tensor([0.8, 0.3]), img_ids=img_ids, txt_ids=torch.zeros(8, 3)).sample

    assert torch.equal(velocity(new), velocity(old))  # zero gates: exactly the old function
    assert torch.equal(velocity(trained.eval()), velocity(old))
    # the copies are real blocks: ungated they change the output
    gate_rows = slice(2 * new.inner_dim, 3 * new.inner_dim)
    with torch.no_grad():
        new.single_transformer_blocks[-1].norm.linear.bias[gate_rows] = 1.0
    assert not torch.allclose(velocity(new), velocity(old))
    with pytest.raises(SystemExit, match="can only be added"):
        F.deepen(ckpt, double, single + 2)
    with pytest.raises(ValueError, match="at most"):
        C.deepen_transformer(old, double + 1, 0)
    with pytest.raises(SystemExit, match="DOUBLE,SINGLE"):
        F.parse_blocks("3")


def test_runs_resume_one_schedule_until_the_plan_is_spent_then_save(tmp_path, monkeypatch):
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
    # --no-pooled folds CLIP's pooled input away once; later runs keep its weight at zero without the flag.
    key = "time_text_embed.text_embedder.linear_1.weight"
    assert F.train(ckpt, cache, images, minutes=10, replan=third["step"] + 2, no_pooled=True, **run)
    assert F.train(ckpt, cache, images, minutes=10, replan=third["step"] + 4, **run)
    fourth = torch.load(ckpt / "state.pt")
    assert fourth["no_pooled"] and fourth["step"] == third["step"] + 4
    assert not fourth["model"][key].any() and not fourth["ema"][key].any()
    assert f"pooled CLIP input folded into the bias and zeroed at step {third['step']}" in (
        ckpt / "steps.txt").read_text()
    # --mixed draws that share of every batch from the mixed-scene cache, at the sizes it has latents of.
    F.make_latents(ckpt, cache, images, seed=0, mixed=True)
    assert torch.load(cache / "mixed-512.pt")["z"].shape == (2, 4, 64, 64)
    with pytest.raises(SystemExit, match="must be among the --images sizes"):
        F.train(ckpt, cache, images, minutes=10, replan=fourth["step"] + 2, mixed=0.5, mixed_images={320: 4}, **run)
    assert F.train(ckpt, cache, images, minutes=10, replan=fourth["step"] + 2, mixed=1.0, mixed_images=images, **run)
    assert torch.load(ckpt / "state.pt")["step"] == fourth["step"] + 2
    assert " mixed 1 at [256, 512] px " in (ckpt / "steps.txt").read_text()
    # Mixed scenes at 256 px only: the 512 px batches stay one kind. Each step's size and mixed captions, recorded:
    steps, mixed_said = [], []
    real_caption, real_loss = F.K.mixed_caption, F.rectified_flow_loss
    monkeypatch.setattr(F.K, "mixed_caption", lambda *a, **k: mixed_said.append(1) or real_caption(*a, **k))

    def loss(model, x0, *rest):  # x0: [B, 4, s/8, s/8]
        steps.append((x0.shape[-1] * 8, len(mixed_said)))
        mixed_said.clear()
        return real_loss(model, x0, *rest)

    monkeypatch.setattr(F, "rectified_flow_loss", loss)
    assert F.train(ckpt, cache, images, minutes=10, replan=fourth["step"] + 40, mixed=1.0, mixed_images={256: 4},
                   size_weights={256: 0.5, 512: 0.5}, **run)
    assert {size for size, _ in steps} == {256, 512}
    assert all(n == 0 for size, n in steps if size == 512) and sum(n for size, n in steps if size == 256) > 0
    assert " mixed 1 at [256] px " in (ckpt / "steps.txt").read_text()
    # --grammar joined: the text encoders gain "and" once; then every mixed caption says it, and the saved folder
    # has the joined grammar's tokenizers and vocabulary. A checkpoint cannot go back (it would lose a word).
    assert F.grammar_of(ckpt) == "natural"
    with pytest.raises(SystemExit, match="needs the joined grammar"):
        F.train(ckpt, cache, images, minutes=10, mixed=1.0, mixed_images=images, mixed_counted=False, **run)
    # The command refuses bad mixed-scene options before it makes any latent (a cache takes minutes to build).
    monkeypatch.setattr(F, "make_latents", lambda *a, **k: pytest.fail("latents made before the options were checked"))
    for argv, refusal in ((["--mixed", "0.3", "--mixed-uncounted"], "needs the joined grammar"),
                          (["--mixed", "0.3", "--mixed-images", "320:4"], "must be among the --images sizes")):
        monkeypatch.setattr("sys.argv", ["finetune", "--checkpoint", str(ckpt), "--cache", str(cache),
                                         "--images", "256:4,512:2", *argv])
        with pytest.raises(SystemExit, match=refusal):
            F.main()
    monkeypatch.undo()
    F.change_grammar(ckpt, "joined", seed=0)
    assert F.grammar_of(ckpt) == "joined" and "grammar natural -> joined at step" in (ckpt / "steps.txt").read_text()
    with pytest.raises(SystemExit, match="can only gain words"):
        F.change_grammar(ckpt, "natural", seed=0)
    said = []
    monkeypatch.setattr(F.K, "mixed_caption", lambda *a, **k: said.append(real_caption(*a, **k)) or said[-1])
    step = torch.load(ckpt / "state.pt")["step"]
    assert F.train(ckpt, cache, images, minutes=10, replan=step + 3, mixed=1.0, mixed_images=images, drop=0.0,
                   mixed_counted=False, **run)  # --mixed-uncounted: "red circle on the left and blue square on the right"
    assert len(said) >= 6 and all("and" in c.lower().split() and "one" not in c.lower().split() for c in said), said
    F.save_pipeline(ckpt, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "vocabulary.json").read_text())["grammar"] == "joined"
    from transformers import AutoTokenizer, CLIPTextModel

    saved = AutoTokenizer.from_pretrained(tmp_path / "out", subfolder="tokenizer")
    assert CLIPTextModel.from_pretrained(tmp_path / "out", subfolder="text_encoder").config.vocab_size == len(saved)
    assert len(saved("and", add_special_tokens=False).input_ids) == 1
    assert (tmp_path / "out" / "transformer" / "diffusion_pytorch_model.safetensors").exists()
