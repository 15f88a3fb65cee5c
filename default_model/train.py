"""Train the default model on CPU and save it as a diffusers FluxPipeline folder.

    python -m default_model.train --out DIR [--vae-minutes 10] [--dit-minutes 35]

Stages (each resumable from DIR/work/):
  vae        train a small AutoencoderKL on crops of dataset images
  latents    encode a fixed set of 256 px dataset images (SIZES) and their captions
  dit        rectified-flow training of a small FluxTransformer2DModel on those latents
  save       assemble FluxPipeline(...) and save_pretrained(DIR) (fp32 weights)

Text encoders are tiny, random and frozen; their outputs for every caption are
computed once. Timesteps follow FluxPipeline's sampler: sigma = time_shift(mu, u)
with mu = calculate_shift(image tokens) as the scheduler does at inference.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import torch

from . import components as C
from . import dataset as D
from .captions import write_vocabulary

LOG_EVERY = 25


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, flush=True)


def to_tensor(images: list[np.ndarray]) -> torch.Tensor:
    """uint8 [H, W, 3] list -> float [-1, 1] [B, 3, H, W]."""
    x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float()
    return x / 127.5 - 1.0


# ---------------------------------------------------------------- VAE


VAE_SIZES = (192, 256, 320)


def train_vae(work: Path, minutes: float, seed: int, batch: int = 16, crop: int = 64, lr: float = 2e-4) -> None:
    """Time-boxed VAE training on crops of images of several sizes.
    Continues from work/vae when it exists."""
    from diffusers import AutoencoderKL

    torch.manual_seed(seed)
    if (work / "vae").exists():
        vae = AutoencoderKL.from_pretrained(work / "vae")
    else:
        vae = C.init_vae_as_pooling(C.vae())  # see its docstring: colours survive from step 0
    opt = torch.optim.AdamW(vae.parameters(), lr=lr, weight_decay=0.0)
    rng = np.random.default_rng(seed)
    t0, step, avg = time.time(), 0, None
    while time.time() - t0 < minutes * 60:
        cur = lr * min(1.0, (step + 1) / 50)
        if time.time() - t0 > minutes * 60 * 0.7:
            cur *= 0.25  # final stretch at a lower rate
        for g in opt.param_groups:
            g["lr"] = cur
        # Random crops that show part of a shape (cheap; the pooling init keeps the
        # GroupNorm statistics nearly content-independent, so crops behave like images).
        imgs, bgs = [], []
        for _ in range(batch):
            size = int(rng.choice(VAE_SIZES))
            img = D.sample(int(rng.integers(2**31)), size=size)[0]
            for _ in range(6):
                y, x = rng.integers(0, size - crop + 1, size=2)
                patch = img[y : y + crop, x : x + crop]
                if (patch != img[:1, :1]).any(-1).mean() > 0.05:
                    break
            imgs.append(patch)
            bgs.append(img[:1, :1])  # the image corner is always background
        x = to_tensor(imgs)
        bg = to_tensor(bgs)
        # Edges are few pixels: weight shape pixels 4x.
        wgt = 1.0 + 3.0 * (x != bg).any(1, keepdim=True).float()
        wgt = wgt / wgt.mean()
        post = vae.encode(x).latent_dist
        rec = vae.decode(post.sample()).sample
        kl = post.kl().mean() / x[0].numel()
        loss = (wgt * ((rec - x).pow(2) + 0.5 * (rec - x).abs())).mean() + 1e-4 * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        avg = loss.item() if avg is None else 0.95 * avg + 0.05 * loss.item()
        step += 1
        if step % 100 == 0:
            vae.save_pretrained(work / "vae")
        if step % LOG_EVERY == 0:
            log(f"vae step {step} loss {avg:.5f} kl {kl.item():.4f}")
    log(f"vae done: {step} steps in {time.time() - t0:.0f}s, loss {avg:.5f}")
    vae.save_pretrained(work / "vae")
    with open(work / "vae_steps.txt", "a") as f:
        f.write(f"{step} steps {time.time() - t0:.0f}s loss {avg:.5f}\n")


# ---------------------------------------------------------------- latents + captions

SIZES = {256: 6000}  # images encoded per training resolution (the default 256 px only)
MAX_SEQ = 32  # T5 tokens; see DEFAULT_MAX_SEQUENCE_LENGTH


@torch.no_grad()
def encode_captions(clip, clip_tok, t5, t5_tok, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """The same calls FluxPipeline.encode_prompt makes: T5 sequence + CLIP pooled."""
    ids = t5_tok(captions, padding="max_length", max_length=MAX_SEQ, truncation=True, return_tensors="pt").input_ids
    seq = t5(ids)[0]  # [N, MAX_SEQ, TEXT_DIM]
    cids = clip_tok(captions, padding="max_length", max_length=77, truncation=True, return_tensors="pt").input_ids
    pooled = clip(cids).pooler_output  # [N, TEXT_DIM]
    return seq, pooled


@torch.no_grad()
def make_latents(work: Path, seed: int) -> None:
    from diffusers import AutoencoderKL

    vae = AutoencoderKL.from_pretrained(work / "vae").eval()
    clip_tok, t5_tok = C.clip_tokenizer(), C.t5_tokenizer()
    clip, t5 = C.text_encoders(len(clip_tok), len(t5_tok), seed=seed)
    clip.save_pretrained(work / "text_encoder")
    t5.save_pretrained(work / "text_encoder_2")
    captions = [""] + sorted({s.caption for s in D.all_scenes(held_out=False)})
    seq, pooled = encode_captions(clip, clip_tok, t5, t5_tok, captions)
    index = {c: i for i, c in enumerate(captions)}
    out = {"captions": captions, "seq": seq, "pooled": pooled}
    t0, base = time.time(), 10_000_000 * (seed + 1)
    for size, n in SIZES.items():
        zs, cap_ids = [], []
        for start in range(0, n, 16):
            batch = [D.sample(base + size * 100_000 + i, size=size) for i in range(start, min(n, start + 16))]
            zs.append(vae.encode(to_tensor([b[0] for b in batch])).latent_dist.mean)
            cap_ids += [index[b[1]] for b in batch]
        out[f"z{size}"] = torch.cat(zs)
        out[f"c{size}"] = torch.tensor(cap_ids)
        log(f"encoded {n} images at {size}px ({time.time() - t0:.0f}s)")
    z = out["z256"]
    shift, scale = z.mean().item(), 1.0 / z.std().item()
    out["shift"], out["scale"] = shift, scale
    log(f"latent shift {shift:.4f} scale {scale:.4f}")
    torch.save(out, work / "latents.pt")


# ---------------------------------------------------------------- transformer


def sigma_for(u: torch.Tensor, image_tokens: int) -> torch.Tensor:
    """Map u in (0, 1) to the sigma FluxPipeline would use at this many image tokens."""
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    mu = calculate_shift(image_tokens, 256, 4096, 0.5, 1.15)
    return math.exp(mu) / (math.exp(mu) + (1.0 / u - 1.0))


def rectified_flow_loss(model, x0: torch.Tensor, seq: torch.Tensor, pooled: torch.Tensor,
                        obj_weight: float) -> torch.Tensor:
    """The training loss on a batch of latents x0 [B, 4, h, w] (already shifted and scaled) with their
    captions' T5 sequence [B, T, D] and CLIP pooled [B, D]: rectified flow at FluxPipeline's sigmas."""
    from diffusers import FluxPipeline

    b, c, h, w = x0.shape
    x0 = FluxPipeline._pack_latents(x0, b, c, h, w)  # [B, h/2*w/2, 4c]
    img_ids = FluxPipeline._prepare_latent_image_ids(b, h // 2, w // 2, x0.device, x0.dtype)
    u = torch.sigmoid(torch.randn(b)).clamp(1e-4, 1 - 1e-4)
    sigma = sigma_for(u, x0.shape[1])
    noise = torch.randn_like(x0)
    xt = (1 - sigma[:, None, None]) * x0 + sigma[:, None, None] * noise
    pred = model(
        hidden_states=xt,
        timestep=sigma,  # FluxPipeline passes t/1000 = sigma
        pooled_projections=pooled,
        encoder_hidden_states=seq,
        txt_ids=torch.zeros(seq.shape[1], 3),
        img_ids=img_ids,
        return_dict=False,
    )[0]
    # Shapes cover few tokens; weight them 5x so they are learnt before the easy background.
    # (The top-left token is always background: shapes keep a margin from the border.)
    obj = ((x0 - x0[:, :1]).abs().amax(-1) > 0.5).float()  # [B, N]
    wgt = 1.0 + obj_weight * obj
    wgt = wgt / wgt.mean(dim=1, keepdim=True)
    return (wgt[..., None] * (pred - (noise - x0)).pow(2)).mean()


def train_dit(work: Path, minutes: float, seed: int, batch: int = 16, lr: float = 1e-3, hidden: int = 128,
              heads: int = 4, double: int = 2, single: int = 4, drop: float = 0.1, resume: bool = False,
              obj_weight: float = 4.0, ema_decay: float = 0.995) -> None:
    torch.manual_seed(seed)
    data = torch.load(work / "latents.pt")
    shift, scale = data["shift"], data["scale"]
    model = C.transformer(hidden=hidden, heads=heads, double=double, single=single)
    ema = C.transformer(hidden=hidden, heads=heads, double=double, single=single)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.99))
    state_file = work / "dit_state.pt"
    step0 = 0
    if resume and state_file.exists():  # continue: weights, EMA and optimizer moments
        state = torch.load(state_file)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step0 = state["step"]
        log(f"resumed from step {step0}")
    ema.load_state_dict(state["ema"] if step0 else model.state_dict())
    ema.requires_grad_(False)
    sizes = [s for s in SIZES if f"z{s}" in data]
    probs = np.array([0.15 if s != 256 else 0.7 for s in sizes])
    probs /= probs.sum()
    rng = np.random.default_rng(seed)
    seq_all, pooled_all = data["seq"], data["pooled"]
    t0, step, avg = time.time(), 0, None
    budget = minutes * 60

    def save() -> None:  # EMA weights for the pipeline; full state to resume
        ema.save_pretrained(work / "transformer")
        torch.save({"model": model.state_dict(), "ema": ema.state_dict(), "opt": opt.state_dict(),
                    "step": step0 + step}, state_file)

    while (elapsed := time.time() - t0) < budget:
        frac = elapsed / budget
        warm = 1.0 if step0 else min(1.0, (step + 1) / 100)
        cur_lr = lr * warm * 0.5 * (1 + math.cos(math.pi * frac))
        for g in opt.param_groups:
            g["lr"] = cur_lr
        size = int(rng.choice(sizes, p=probs))
        zall, call = data[f"z{size}"], data[f"c{size}"]
        idx = torch.from_numpy(rng.integers(0, len(zall), size=batch))
        x0 = (zall[idx] - shift) * scale  # [B, 4, h, w]
        cap = call[idx].clone()
        cap[torch.from_numpy(rng.random(batch) < drop)] = 0  # caption dropout -> "" (index 0)
        loss = rectified_flow_loss(model, x0, seq_all[cap], pooled_all[cap], obj_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        decay = min(ema_decay, (1 + step0 + step) / (10 + step0 + step))
        with torch.no_grad():
            for pe, pm in zip(ema.parameters(), model.parameters()):
                pe.lerp_(pm, 1 - decay)
        avg = loss.item() if avg is None else 0.98 * avg + 0.02 * loss.item()
        step += 1
        if step % LOG_EVERY == 0:
            log(f"dit step {step0 + step} loss {avg:.4f} lr {cur_lr:.2e} ({elapsed:.0f}s)")
        if step % 250 == 0:
            save()
    log(f"dit done: {step} steps in {time.time() - t0:.0f}s, loss {avg:.4f}")
    save()
    with open(work / "dit_steps.txt", "a") as f:
        f.write(f"{step} steps {time.time() - t0:.0f}s loss {avg:.5f}\n")


# ---------------------------------------------------------------- assemble


def save_pipeline(work: Path, out: Path) -> None:
    from diffusers import AutoencoderKL, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextModel, T5EncoderModel

    data = torch.load(work / "latents.pt")
    vae = AutoencoderKL.from_pretrained(work / "vae")
    vae.register_to_config(shift_factor=data["shift"], scaling_factor=data["scale"])
    pipe = FluxPipeline(
        scheduler=C.scheduler(),
        vae=vae,
        text_encoder=CLIPTextModel.from_pretrained(work / "text_encoder"),
        tokenizer=C.clip_tokenizer(),
        text_encoder_2=T5EncoderModel.from_pretrained(work / "text_encoder_2"),
        tokenizer_2=C.t5_tokenizer(),
        transformer=FluxTransformer2DModel.from_pretrained(work / "transformer"),
    )
    pipe.save_pretrained(out)
    write_vocabulary(out, "fixed")  # this trainer's captions are the fixed grammar's
    log(f"saved pipeline to {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="pipeline folder to write")
    ap.add_argument("--work", type=Path, default=None, help="intermediate files (default OUT/../OUT.work)")
    ap.add_argument("--stages", default="vae,latents,dit,save")
    ap.add_argument("--vae-minutes", type=float, default=10.0)
    ap.add_argument("--dit-minutes", type=float, default=35.0)
    ap.add_argument("--resume", action="store_true", help="continue the transformer from work/dit_state.pt")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--double", type=int, default=2)
    ap.add_argument("--single", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    work = args.work or args.out.with_name(args.out.name + ".work")
    work.mkdir(parents=True, exist_ok=True)
    stages = args.stages.split(",")
    t0 = time.time()
    if "vae" in stages:
        train_vae(work, args.vae_minutes, args.seed)
    if "latents" in stages:
        make_latents(work, args.seed)
    if "dit" in stages:
        train_dit(work, args.dit_minutes, args.seed, batch=args.batch, lr=args.lr, hidden=args.hidden,
                  heads=args.heads, double=args.double, single=args.single, resume=args.resume)
    if "save" in stages:
        save_pipeline(work, args.out)
    log(f"total {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
