"""Continue training the bundled model on natural captions at 256-512 px (issue 18), time-boxed and
resumable across sessions.

    python -m default_model.finetune --init-from meshdit/default_model/weights \
        --checkpoint default_model/checkpoints/natural --minutes 60 --plan-steps 16000 --threads 2 \
        --save meshdit/default_model/weights

Each run does what is not done yet, in order:
  start     (once) the init folder's transformer, VAE and text encoders; the tokenizers of --grammar (natural), the
            text encoders extended to them (components.extend_text_encoders: old captions read exactly as
            before, case ignored); written to CHECKPOINT with a fresh optimizer at step 0
  grammar   (with --grammar G, once) moves the checkpoint to caption grammar G (stored in it; "natural"
            when absent): the text encoders extended again from its grammar's tokenizers to G's, as at the
            start (extend_text_encoders: every caption of the old grammar reads exactly as before). Under
            "joined" the mixed captions say "and" between their two shapes (captions.say_mixed), and with
            --mixed-uncounted no count word before either ("red circle on the left and blue square on the
            right"). Both tried from step 55,959 at 30 % mixed scenes and not kept (model card).
  blocks    (with --blocks D,S, once) grows the transformer to D double- and S single-stream blocks
            (components.deepen_transformer: copies of the last blocks with their residual gates zeroed, so the
            same function; model and EMA; the optimizer starts afresh): capacity without training anew.
            3,6 tried from step 55,959: at peak lr 2e-4 not kept, at 5e-5 shipped (step 57,960; model card)
  latents   (once per size, cached in --cache, not committed: deterministic, rebuilt in minutes) images of
            training scenes at every size of --images, encoded by the frozen VAE (posterior mean)
  train     --minutes of training, resumed from CHECKPOINT/state.pt: every step draws one size, a batch of
            its latents (fewer at larger sizes: about the same tokens per step), and for each image a new
            caption (captions.natural_caption; --fixed-share of them the fixed caption, 10 % empty for CFG).
            The learning rate follows one cosine over --plan-steps optimizer steps, counted across runs, so
            the schedule does not depend on how fast (or how loaded) each run's machine is: a run on a busy
            machine, even one started at idle priority (`chrt -i 0`), makes fewer steps, not a shorter
            schedule. Checkpoints every --save-every minutes. `--replan N` lengthens the current cosine to end
            at step N (it goes on from the current step's fraction of it); `--replan N --restart` begins a new
            one at this step (peak --lr after 100 warmup steps, zero at step N). `--centre-prior p` leaves the position
            out mostly for centred single shapes (captions.position_drop), so "a blue square" means the
            centre with odds p. `--no-pooled` (once; stored in the checkpoint) makes the transformer ignore
            CLIP's pooled vector (drop_pooled_input): tried from step 48,500 and not kept (model card).
            `--mixed p` draws that share of every batch from mixed scenes (two shapes of different trained
            pairs, dataset.sample_mixed_scene, captioned by captions.mixed_caption; their latents cached
            beside the others as mixed-{size}.pt, --mixed-images), so a colour word binds to its own shape;
            batches of a size --mixed-images leaves out are all one kind.
  save      (with --save DIR) the EMA transformer as a FluxPipeline folder with the checkpoint grammar's
            tokenizers, the extended text encoders and vocabulary.json

CHECKPOINT holds what a later session needs to go on training (model, EMA, Adam moments, text
encoders, VAE); the latent cache is rebuilt from seeds when missing. Neither is in the source tree
(default_model/checkpoints/ is git-ignored; nothing in meshdit/ or tests/ reads it). To regenerate the
checkpoint the shipped weights came from, run the model card's "Stage 2" commands in order, starting with
`--init-from` the first release's weights (meshdit/default_model/weights/README.md, Training: it lists every
segment's command and schedule); the last committed copy (step 55,959) is in git history at commit 5cad6ec
(`git checkout 5cad6ec -- default_model/checkpoints`).
"""

from __future__ import annotations

import argparse
import math
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from . import captions as K
from . import components as C
from . import dataset as D
from .train import encode_captions, log, rectified_flow_loss, to_tensor

GRAMMAR = "natural"  # of a new checkpoint, and of one without a "grammar" entry (made before there were several)
DEFAULT_IMAGES = "256:6000,320:1500,384:1500,448:1500,512:3000"  # size:count of the latent cache
DEFAULT_MIXED_IMAGES = "256:2000,320:500,384:500,448:500,512:1000"  # the mixed scenes' cache (with --mixed)
DEFAULT_SIZE_WEIGHTS = "256:0.4,320:0.1,384:0.1,448:0.1,512:0.3"  # share of steps per size (others: 0.1)
BASE_BATCH = 16  # images per step at 256 px; a size s gets about 16 * (256 / s)^2 (same tokens)
SCENE_FIELDS = ("colour", "shape", "count", "position", "background")


def parse_size_weights(text: str) -> dict[int, float]:
    weights = {int(s): float(w) for s, w in (part.split(":") for part in text.split(","))}
    if any(w < 0 for w in weights.values()) or not sum(weights.values()) > 0:
        raise SystemExit(f"--size-weights must be non-negative with a positive sum: {text}")
    return weights


def parse_images(text: str) -> dict[int, int]:
    sizes = {int(s): int(n) for s, n in (part.split(":") for part in text.split(","))}
    if any(s % 16 for s in sizes):
        raise SystemExit(f"--images sizes must be multiples of 16 (FluxPipeline packs 2x2 latents): {sorted(sizes)}")
    return sizes


def batch_for(size: int, base: int = BASE_BATCH) -> int:
    return max(2, round(base * (256 / size) ** 2))


# ---------------------------------------------------------------- start


def start(init: Path, ckpt: Path, seed: int, plan_steps: int, grammar: str = GRAMMAR) -> None:
    """CHECKPOINT from the init folder: frozen VAE and extended text encoders, the transformer at step 0."""
    from diffusers import AutoencoderKL, FluxTransformer2DModel
    from transformers import AutoTokenizer, CLIPTextModel, T5EncoderModel

    ckpt.mkdir(parents=True, exist_ok=True)
    old_tok = AutoTokenizer.from_pretrained(init, subfolder="tokenizer"), AutoTokenizer.from_pretrained(
        init, subfolder="tokenizer_2")
    clip = CLIPTextModel.from_pretrained(init, subfolder="text_encoder")
    t5 = T5EncoderModel.from_pretrained(init, subfolder="text_encoder_2")
    clip, t5 = C.extend_text_encoders(clip, t5, *old_tok, C.clip_tokenizer(grammar), C.t5_tokenizer(grammar),
                                      seed=seed + 1)
    clip.save_pretrained(ckpt / "text_encoder")
    t5.save_pretrained(ckpt / "text_encoder_2")
    AutoencoderKL.from_pretrained(init, subfolder="vae").save_pretrained(ckpt / "vae")
    transformer = FluxTransformer2DModel.from_pretrained(init, subfolder="transformer")
    transformer.save_pretrained(ckpt / "transformer")  # the EMA weights, rewritten at every checkpoint
    weights = transformer.state_dict()
    torch.save({"model": weights, "ema": weights, "opt": None, "step": 0, "trained_s": 0.0,
                "plan_steps": plan_steps, "init": str(init), "grammar": grammar}, ckpt / "state.pt")
    log(f"started {ckpt} from {init}")


def grammar_of(ckpt: Path) -> str:
    return torch.load(ckpt / "state.pt", map_location="cpu").get("grammar", GRAMMAR)


def change_grammar(ckpt: Path, grammar: str, seed: int) -> None:
    """Move CHECKPOINT to caption grammar `grammar`: its text encoders extended from the current grammar's
    tokenizers to the new one's (the old words keep their rows, new words get new seeded rows), the grammar
    stored in state.pt. Only to a grammar that keeps every word of the current one."""
    from transformers import CLIPTextModel, T5EncoderModel

    state = torch.load(ckpt / "state.pt")
    old = state.get("grammar", GRAMMAR)
    if old == grammar:
        return
    if not set(K.vocabulary(old)) <= set(K.vocabulary(grammar)):
        raise SystemExit(f"--grammar {grammar}: the checkpoint was trained on {old!r}, whose words {grammar!r} "
                         f"does not all have; a checkpoint can only gain words")
    clip = CLIPTextModel.from_pretrained(ckpt / "text_encoder")
    t5 = T5EncoderModel.from_pretrained(ckpt / "text_encoder_2")
    clip, t5 = C.extend_text_encoders(clip, t5, C.clip_tokenizer(old), C.t5_tokenizer(old), C.clip_tokenizer(grammar),
                                      C.t5_tokenizer(grammar), seed=seed + 2)
    clip.save_pretrained(ckpt / "text_encoder")
    t5.save_pretrained(ckpt / "text_encoder_2")
    state["grammar"] = grammar
    torch.save(state, ckpt / "state.pt.tmp")
    (ckpt / "state.pt.tmp").replace(ckpt / "state.pt")
    with open(ckpt / "steps.txt", "a") as f:
        f.write(f"grammar {old} -> {grammar} at step {state['step']} (text encoders extended)\n")
    log(f"checkpoint moved from grammar {old} to {grammar}")


def parse_blocks(text: str) -> tuple[int, int]:
    try:
        double, single = (int(n) for n in text.split(","))
    except ValueError:
        raise SystemExit(f"--blocks takes DOUBLE,SINGLE (block counts, e.g. 3,6): {text!r}") from None
    return double, single


def deepen(ckpt: Path, double: int, single: int) -> None:
    """Grow CHECKPOINT's transformer (model and EMA) to `double` double-stream and `single` single-stream blocks
    (components.deepen_transformer: copies of the last blocks with zero gates, the same function); a checkpoint
    already that deep is left alone, so a resumed run may repeat the option. The optimizer starts afresh (its
    moments are per parameter); run it with --replan and --restart so the rate warms up again."""
    from diffusers import FluxTransformer2DModel

    config = FluxTransformer2DModel.load_config(ckpt / "transformer")
    have = config["num_layers"], config["num_single_layers"]
    if have == (double, single):  # decided from the config alone: a resumed run does not load the state twice
        return
    if double < have[0] or single < have[1]:
        raise SystemExit(f"--blocks {double},{single}: the checkpoint has {have[0]},{have[1]}; blocks can only be added")
    state = torch.load(ckpt / "state.pt")
    grown = {}
    for part in ("model", "ema"):
        model = FluxTransformer2DModel.from_config(config)
        model.load_state_dict(state[part])
        grown[part] = C.deepen_transformer(model, double - have[0], single - have[1])
    grown["ema"].save_pretrained(ckpt / "transformer")
    state.update(model=grown["model"].state_dict(), ema=grown["ema"].state_dict(), opt=None)
    torch.save(state, ckpt / "state.pt.tmp")
    (ckpt / "state.pt.tmp").replace(ckpt / "state.pt")
    with open(ckpt / "steps.txt", "a") as f:
        f.write(f"blocks {have[0]},{have[1]} -> {double},{single} at step {state['step']} (copies with zero gates; "
                f"optimizer reset)\n")
    log(f"transformer deepened from {have[0]},{have[1]} to {double},{single} blocks")


# ---------------------------------------------------------------- latents


def _one_kind(rng: np.random.Generator, size: int) -> tuple[np.ndarray, list]:
    scene = D.sample_scene(rng)
    return D.render(scene, size=size, seed=int(rng.integers(2**31))), [getattr(scene, f) for f in SCENE_FIELDS]


def _mixed(rng: np.random.Generator, size: int) -> tuple[np.ndarray, list]:
    scenes = D.sample_mixed_scene(rng)
    image = D.render_mixed(scenes, size=size, seed=int(rng.integers(2**31)))
    return image, [[getattr(sc, f) for f in SCENE_FIELDS] for sc in scenes]


@torch.no_grad()
def make_latents(ckpt: Path, cache: Path, images: dict[int, int], seed: int, mixed: bool = False) -> None:
    """cache/latents-{size}.pt per size: z [N, 4, s/8, s/8] and the scenes the images show; with `mixed`,
    cache/mixed-{size}.pt of mixed scenes (dataset.sample_mixed_scene) and their shapes' fields."""
    from diffusers import AutoencoderKL

    cache.mkdir(parents=True, exist_ok=True)
    vae = AutoencoderKL.from_pretrained(ckpt / "vae").eval()
    prefix, draw, stream = ("mixed", _mixed, 11) if mixed else ("latents", _one_kind, 7)
    for size, n in images.items():
        path = cache / f"{prefix}-{size}.pt"
        if path.exists() and torch.load(path)["z"].shape[0] == n:
            continue
        t0, rng = time.time(), np.random.default_rng([seed, size, stream])
        zs, scenes = [], []
        for start_i in range(0, n, 16):
            batch = []
            for _ in range(min(16, n - start_i)):
                image, fields = draw(rng, size)
                batch.append(image)
                scenes.append(fields)
            zs.append(vae.encode(to_tensor(batch)).latent_dist.mean)
        torch.save({"z": torch.cat(zs), "scenes": scenes}, path)
        log(f"encoded {n} {'mixed-scene ' if mixed else ''}images at {size}px ({time.time() - t0:.0f}s)")


def load_latents(cache: Path, images: dict[int, int], mixed: bool = False) -> dict[int, dict]:
    data = {}
    for size in images:
        d = torch.load(cache / f"{'mixed' if mixed else 'latents'}-{size}.pt")
        d["scenes"] = [tuple(D.Scene(*f) for f in pair) if mixed else D.Scene(*pair) for pair in d["scenes"]]
        data[size] = d
    return data


# ---------------------------------------------------------------- train


def caption_batch(scenes: list[D.Scene], rng: np.random.Generator, fixed_share: float, drop: float,
                  colourless: float = K.COLOURLESS_SHARE, centre_prior: float | None = None) -> list[str]:
    out = []
    for scene in scenes:
        u = rng.random()
        natural = u >= drop + fixed_share
        out.append(K.natural_caption(scene, rng, colourless, centre_prior) if natural
                   else "" if u < drop else scene.caption)
    return out


@torch.no_grad()
def drop_pooled_input(transformer, pooled_empty: torch.Tensor) -> None:
    """Make the transformer ignore CLIP's pooled vector, answering every prompt as it answers "" now.

    The pooled vector enters through adaLN (time_text_embed.text_embedder.linear_1: y = W p + b). It is
    one entangled vector per prompt, so a colour/shape pair never seen in training gives a vector never
    seen, which might pull the shape towards the colour's training shapes; the T5 sequence keeps one token
    per word. Folding W p("") into b and zeroing W (kept zero: frozen) leaves the T5 tokens to say what to
    draw. Plain diffusers still loads and runs the folder: CLIP runs, its output is multiplied by zero.
    Tried from step 48,500: the held-out squares stayed round (the prior is not in the pooled vector).
    """
    linear = transformer.time_text_embed.text_embedder.linear_1
    linear.bias += linear.weight @ pooled_empty.reshape(-1)  # [128] += [128, 64] @ [64]
    linear.weight.zero_()
    linear.weight.requires_grad_(False)


def check_mixed_options(images: dict[int, int], mixed: float, mixed_images: dict[int, int] | None,
                        mixed_counted: bool, grammar: str) -> None:
    """Refuse mixed-scene options that cannot work, before any latent is made or loaded."""
    if not mixed_counted and grammar != "joined":
        raise SystemExit(f"--mixed-uncounted needs the joined grammar (--grammar joined); the checkpoint's is {grammar}")
    if mixed > 0 and not set(mixed_images) <= set(images):
        raise SystemExit(f"--mixed-images sizes {sorted(mixed_images)} must be among the --images sizes {sorted(images)}")


def learning_rate(step: int, peak: float, plan: int, cycle_start: int = 0) -> float:
    """The rate at optimizer step `step`: one cosine from `cycle_start` (100 warmup steps) to zero at `plan`."""
    frac = (step - cycle_start) / (plan - cycle_start)
    warm = min(1.0, (step - cycle_start + 1) / 100)
    return peak * warm * 0.5 * (1 + math.cos(math.pi * frac))


def train(ckpt: Path, cache: Path, images: dict[int, int], minutes: float, seed: int, lr: float,
          fixed_share: float, save_every: float, drop: float = 0.1, obj_weight: float = 4.0,
          ema_decay: float = 0.995, base_batch: int = BASE_BATCH, replan: int | None = None,
          size_weights: dict[int, float] | None = None, colourless: float = K.COLOURLESS_SHARE,
          restart: bool = False, centre_prior: float | None = None, no_pooled: bool = False,
          mixed: float = 0.0, mixed_images: dict[int, int] | None = None, mixed_counted: bool = True) -> bool:
    """Trains for `minutes` of wall time or what is left of the plan's steps; True once the plan is complete."""
    from diffusers import AutoencoderKL, FluxTransformer2DModel
    from transformers import CLIPTextModel, T5EncoderModel

    state = torch.load(ckpt / "state.pt")
    grammar = state.get("grammar", GRAMMAR)
    check_mixed_options(images, mixed, mixed_images, mixed_counted, grammar)
    if replan is not None and replan != state["plan_steps"]:
        if replan <= state["step"]:
            raise SystemExit(f"--replan {replan}: the checkpoint is already at step {state['step']}")
        log(f"plan changed from {state['plan_steps']} to {replan} steps at step {state['step']}")
        with open(ckpt / "steps.txt", "a") as f:
            f.write(f"plan {state['plan_steps']} -> {replan} steps at step {state['step']}\n")
        state["plan_steps"] = replan
    if restart:  # a new cosine from this step: peak lr now (after 100 warmup steps), zero at the plan's end
        if replan is None:
            raise SystemExit("--restart needs --replan (the step the new cosine ends at)")
        state["cycle_start"] = state["step"]
        with open(ckpt / "steps.txt", "a") as f:
            f.write(f"cosine restarted at step {state['step']} (peak lr {lr:g})\n")
    cycle0 = state.get("cycle_start", 0)  # where the current cosine began
    plan, trained0, step0 = state["plan_steps"], state["trained_s"], state["step"]
    budget = minutes * 60
    if step0 >= plan:
        log(f"plan of {plan} steps complete")
        return True
    torch.manual_seed(seed * 1_000_003 + step0)  # a resumed run draws new noise, reproducibly
    rng = np.random.default_rng([seed, step0])
    model = FluxTransformer2DModel.from_config(FluxTransformer2DModel.load_config(ckpt / "transformer"))
    ema = FluxTransformer2DModel.from_config(model.config)
    model.load_state_dict(state["model"])
    ema.load_state_dict(state["ema"])
    ema.requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.99))
    if state["opt"] is not None:
        opt.load_state_dict(state["opt"])
    vae_config = AutoencoderKL.load_config(ckpt / "vae")
    shift, scale = vae_config["shift_factor"], vae_config["scaling_factor"]  # as the init model was trained
    clip = CLIPTextModel.from_pretrained(ckpt / "text_encoder").eval()
    t5 = T5EncoderModel.from_pretrained(ckpt / "text_encoder_2").eval()
    tokenizers = C.clip_tokenizer(grammar), C.t5_tokenizer(grammar)
    if no_pooled and not state.get("no_pooled"):  # folded once; later runs read it from the checkpoint
        empty = encode_captions(clip, tokenizers[0], t5, tokenizers[1], [""])[1].detach()  # [1, 64]
        drop_pooled_input(model, empty)
        drop_pooled_input(ema, empty)
        state["no_pooled"] = True
        with open(ckpt / "steps.txt", "a") as f:
            f.write(f"pooled CLIP input folded into the bias and zeroed at step {step0}\n")
    if state.get("no_pooled"):  # a resumed run freezes the zero weight again (requires_grad is not saved)
        model.time_text_embed.text_embedder.linear_1.weight.requires_grad_(False)
    data = load_latents(cache, images)
    mixed_data = load_latents(cache, mixed_images, mixed=True) if mixed > 0 else {}
    sizes = sorted(data)
    weights = size_weights or parse_size_weights(DEFAULT_SIZE_WEIGHTS)
    probs = np.array([weights.get(s, 0.1) for s in sizes])
    probs /= probs.sum()
    log(f"training from step {step0} of {plan} ({trained0 / 60:.1f} min trained) for up to {budget / 60:.1f} min; "
        f"sizes {sizes}, step shares {[round(float(p), 3) for p in probs]}, "
        f"batches {[batch_for(s, base_batch) for s in sizes]}, fixed captions {fixed_share:g}, "
        f"colourless {colourless:g}, centre prior {centre_prior}, grammar {grammar}, mixed scenes {mixed:g} at {sorted(mixed_data)} px{'' if mixed_counted else ' (uncounted)'}, pooled input {'dropped' if state.get('no_pooled') else 'used'}")

    t0, step, avg, last_save, done_s = time.time(), 0, None, time.time(), 0.0  # done_s: training time, saves excluded

    def save() -> None:  # EMA weights for the pipeline; full state to resume (temp file + rename)
        ema.save_pretrained(ckpt / "transformer")
        torch.save({**state, "model": model.state_dict(), "ema": ema.state_dict(), "opt": opt.state_dict(),
                    "step": step0 + step, "trained_s": trained0 + done_s}, ckpt / "state.pt.tmp")
        (ckpt / "state.pt.tmp").replace(ckpt / "state.pt")

    while done_s < budget and step0 + step < plan:
        cur_lr = learning_rate(step0 + step, lr, plan, cycle0)
        for g in opt.param_groups:
            g["lr"] = cur_lr
        size = int(rng.choice(sizes, p=probs))
        n = batch_for(size, base_batch)
        n_mixed = int(rng.binomial(n, mixed)) if size in mixed_data else 0  # sizes without mixed latents: one kind
        idx = rng.integers(0, len(data[size]["scenes"]), size=n - n_mixed)
        z = data[size]["z"][torch.from_numpy(idx)]  # [B - M, 4, s/8, s/8]
        texts = caption_batch([data[size]["scenes"][i] for i in idx], rng, fixed_share, drop, colourless,
                              centre_prior)
        if n_mixed:
            idx_m = rng.integers(0, len(mixed_data[size]["scenes"]), size=n_mixed)
            z = torch.cat([z, mixed_data[size]["z"][torch.from_numpy(idx_m)]])  # [B, 4, s/8, s/8]
            texts += ["" if rng.random() < drop else K.mixed_caption(mixed_data[size]["scenes"][i], rng, colourless,
                                                                     joined=grammar == "joined", counted=mixed_counted)
                      for i in idx_m]
        x0 = (z - shift) * scale
        seq, pooled = encode_captions(clip, tokenizers[0], t5, tokenizers[1], texts)  # [B, 32, 64], [B, 64]
        loss = rectified_flow_loss(model, x0, seq, pooled, obj_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            for pe, pm in zip(ema.parameters(), model.parameters()):
                pe.lerp_(pm, 1 - ema_decay)
        avg = loss.item() if avg is None else 0.98 * avg + 0.02 * loss.item()
        step += 1
        done_s = time.time() - t0
        if step % 25 == 0:
            log(f"step {step0 + step} loss {avg:.4f} lr {cur_lr:.2e} ({(trained0 + done_s) / 60:.1f} min)")
        if time.time() - last_save > save_every * 60:
            pause = time.time()
            save()
            t0 += time.time() - pause  # saving is not training time
            last_save = time.time()
    save()
    log(f"trained {step} steps in {done_s:.0f}s, loss {avg:.4f}; checkpoint at step {step0 + step}")
    with open(ckpt / "steps.txt", "a") as f:
        f.write(f"steps {step0}-{step0 + step} {done_s:.0f}s loss {avg:.5f} peak lr {lr:g} colourless "
                f"{colourless:g} fixed {fixed_share:g} centre prior {centre_prior}"
                f"{f' mixed {mixed:g} at {sorted(mixed_data)} px' if mixed else ''}{'' if mixed_counted else ' uncounted'}{' no pooled' if state.get('no_pooled') else ''} (sizes {dict(zip(sizes, [round(float(p), 3) for p in probs]))})\n")
    return step0 + step >= plan


# ---------------------------------------------------------------- save


def save_pipeline(ckpt: Path, out: Path) -> None:
    from diffusers import AutoencoderKL, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextModel, T5EncoderModel

    grammar = grammar_of(ckpt)
    pipe = FluxPipeline(
        scheduler=C.scheduler(),
        vae=AutoencoderKL.from_pretrained(ckpt / "vae"),
        text_encoder=CLIPTextModel.from_pretrained(ckpt / "text_encoder"),
        tokenizer=C.clip_tokenizer(grammar),
        text_encoder_2=T5EncoderModel.from_pretrained(ckpt / "text_encoder_2"),
        tokenizer_2=C.t5_tokenizer(grammar),
        transformer=FluxTransformer2DModel.from_pretrained(ckpt / "transformer"),
    )
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("tokenizer", "tokenizer_2"):  # save_pretrained adds files; old tokenizer files must not stay
        shutil.rmtree(out / stale, ignore_errors=True)
    pipe.save_pretrained(out)
    K.write_vocabulary(out, grammar)
    log(f"saved pipeline to {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--init-from", type=Path, default=Path("meshdit/default_model/weights"),
                    help="pipeline folder to continue from (used once, when CHECKPOINT is new)")
    ap.add_argument("--checkpoint", type=Path, default=Path("default_model/checkpoints/natural"))
    ap.add_argument("--cache", type=Path, default=None, help="latent cache (default: CHECKPOINT.cache)")
    ap.add_argument("--images", default=DEFAULT_IMAGES, help="size:count,... of the latent cache")
    ap.add_argument("--minutes", type=float, default=60.0, help="training time of this run")
    ap.add_argument("--plan-steps", type=int, default=16000,
                    help="optimizer steps of the whole schedule, over all runs (fixed when CHECKPOINT is new)")
    ap.add_argument("--replan", type=int, default=None,
                    help="change an existing checkpoint's plan to this many steps (the current cosine, which now "
                         "ends at this step, continues from the current step's place in it)")
    ap.add_argument("--size-weights", default=DEFAULT_SIZE_WEIGHTS,
                    help="size:share,... of training steps per cached size (sizes not named: 0.1)")
    ap.add_argument("--save-every", type=float, default=10.0, help="minutes between checkpoints")
    ap.add_argument("--lr", type=float, default=2.5e-4, help="peak rate (the last segment of the first training's)")
    ap.add_argument("--fixed-share", type=float, default=0.2, help="captions in the fixed grammar (keeps the 56)")
    ap.add_argument("--colourless", type=float, default=K.COLOURLESS_SHARE,
                    help="share of natural captions without the colour word (trains the shape word alone)")
    ap.add_argument("--restart", action="store_true",
                    help="with --replan: start a new cosine at this step (peak --lr) instead of continuing the old one")
    ap.add_argument("--centre-prior", type=float, default=None,
                    help="share of position-less single-shape captions whose shape is centred (captions.position_drop; "
                         "default: every position alike, 1/5)")
    ap.add_argument("--no-pooled", action="store_true",
                    help="from this run on, ignore CLIP's pooled vector (drop_pooled_input; stored in the checkpoint)")
    ap.add_argument("--mixed", type=float, default=0.0,
                    help="share of training images showing two shapes of different trained pairs (mixed scenes: "
                         "a colour word must bind to its own shape), captioned by captions.mixed_caption")
    ap.add_argument("--mixed-uncounted", action="store_true",
                    help="mixed captions say no count word before their shapes (joined grammar: \"yellow circle on "
                         "the left and red square on the right\"), so a count word for one always means one shape")
    ap.add_argument("--mixed-images", default=DEFAULT_MIXED_IMAGES, help="size:count,... of the mixed-scene cache (the sizes with mixed scenes)")
    ap.add_argument("--grammar", choices=[g for g in K.GRAMMARS if g != "fixed"], default=None,
                    help="move the checkpoint to this caption grammar before training (once; stored in it; "
                         "default: the checkpoint's, natural for a new one); joined: mixed captions say \"and\"")
    ap.add_argument("--blocks", default=None, help="DOUBLE,SINGLE: grow the transformer to this many double- and "
                    "single-stream blocks before training (deepen: the same function; once, a repeat does nothing)")
    ap.add_argument("--save", type=Path, default=None, help="write the pipeline folder here after training")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    images = parse_images(args.images)
    cache = args.cache or args.checkpoint.with_name(args.checkpoint.name + ".cache")
    mixed_images = parse_images(args.mixed_images)
    t0 = time.time()
    new = not (args.checkpoint / "state.pt").exists()
    grammar = args.grammar or (GRAMMAR if new else grammar_of(args.checkpoint))
    check_mixed_options(images, args.mixed, mixed_images, not args.mixed_uncounted, grammar)  # before hours of work
    blocks = parse_blocks(args.blocks) if args.blocks else None
    if new:
        start(args.init_from, args.checkpoint, args.seed, args.plan_steps, grammar)
    if args.grammar:
        change_grammar(args.checkpoint, args.grammar, args.seed)
    if blocks:
        deepen(args.checkpoint, *blocks)
    make_latents(args.checkpoint, cache, images, args.seed)
    if args.mixed > 0:
        make_latents(args.checkpoint, cache, mixed_images, args.seed, mixed=True)
    if args.minutes > 0:
        train(args.checkpoint, cache, images, args.minutes, args.seed, args.lr, args.fixed_share, args.save_every,
              replan=args.replan, size_weights=parse_size_weights(args.size_weights),
              colourless=args.colourless, restart=args.restart, centre_prior=args.centre_prior,
              no_pooled=args.no_pooled, mixed=args.mixed, mixed_images=mixed_images,
              mixed_counted=not args.mixed_uncounted)
    if args.save:
        save_pipeline(args.checkpoint, args.save)
    log(f"total {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
