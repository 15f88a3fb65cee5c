"""Score images of the default model against their prompts, from the pixels alone.

    python -m default_model.evaluate [--model DIR] [--steps N] [--seed S ...] [--size 512] [--paraphrased | --bare]
    python -m default_model.evaluate --check-evaluator
    python -m default_model.evaluate --check-vae [--model DIR] [--size 512]

The analysis is classic image processing: the background colour is the median of
the border pixels; every pixel is classified to the nearest palette colour; the
non-background pixels are split into 4-connected components (scipy.ndimage.label);
small specks are ignored; the colour is the majority
vote of the objects' eroded cores; each object's shape comes from its fill ratio (area /
bounding box) and, for the half-filled shapes, from where its mass sits vertically
(a triangle is bottom-heavy, a diamond is symmetric); a single object's position
comes from its centroid. An image passes when background, colour, count, every
object's shape and (when asked) the position all match the prompt.

Prompt i is drawn with seed S + i. One 56-prompt set moves by 2-4 points between seed sets on the same
weights, so `--seed 0 1000 2000` scores the set once per seed and prints the pooled score too.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field

import numpy as np
from scipy import ndimage

from . import captions as K
from . import dataset as D

_BG_NAMES = list(D.BACKGROUNDS)
_FG_NAMES = list(D.COLOURS)
_BG_RGB = np.array([D.BACKGROUNDS[n] for n in _BG_NAMES], dtype=np.float32)
_FG_RGB = np.array([D.COLOURS[n] for n in _FG_NAMES], dtype=np.float32)

MIN_OBJECT_FRACTION = 0.006  # of the image area; the smallest drawn shape is ~0.02
MIN_COLOUR_SHARE = 0.75  # of object pixels that must be the asked colour


@dataclass
class Analysis:
    background: str | None
    colour: str | None = None
    colour_share: float = 0.0
    shapes: list[str] = field(default_factory=list)
    centroids: list[tuple[float, float]] = field(default_factory=list)  # (x, y) in [0, 1]

    @property
    def count(self) -> int:
        return len(self.shapes)

    @property
    def position(self) -> str | None:
        if len(self.centroids) != 1:
            return None
        return position_of(*self.centroids[0])


def position_of(x: float, y: float) -> str:
    dx, dy = x - 0.5, y - 0.5
    if max(abs(dx), abs(dy)) < 0.1:
        return "center"
    if abs(dx) >= abs(dy):
        return "left" if dx < 0 else "right"
    return "top" if dy < 0 else "bottom"


def _as_rgb255(image: np.ndarray) -> np.ndarray:
    img = np.asarray(image)
    if img.ndim != 3 or img.shape[2] != 3:
        raise ValueError(f"expected an HxWx3 image, got shape {img.shape}")
    if img.dtype == np.uint8:
        return img.astype(np.float32)
    return np.clip(img.astype(np.float32), 0.0, 1.0) * 255.0


def shape_of(mask: np.ndarray) -> str:
    """Classify one object's boolean mask (cropped or not)."""
    ys, xs = np.nonzero(mask)
    h, w = ys.max() - ys.min() + 1, xs.max() - xs.min() + 1
    aspect = w / h
    if not 0.7 <= aspect <= 1.45:
        return "other"
    fill = len(ys) / float(h * w)
    if fill >= 0.9:
        return "square"
    if fill >= 0.66:
        return "circle"
    if fill < 0.35:
        return "other"
    mass_y = (ys.mean() - ys.min()) / max(h - 1, 1)  # 0 top .. 1 bottom
    return "triangle" if mass_y > 0.58 else "diamond"


def analyse(image: np.ndarray) -> Analysis:
    img = _as_rgb255(image)
    hgt, wid, _ = img.shape
    border = np.concatenate([img[:3].reshape(-1, 3), img[-3:].reshape(-1, 3), img[:, :3].reshape(-1, 3), img[:, -3:].reshape(-1, 3)])
    bg_rgb = np.median(border, axis=0)
    d_bg = np.linalg.norm(_BG_RGB - bg_rgb, axis=1)
    if d_bg.min() > 60:
        return Analysis(background=None)
    bg = int(d_bg.argmin())
    # Nearest palette colour per pixel, among this background and the shape colours.
    palette = np.concatenate([_BG_RGB[bg : bg + 1], _FG_RGB])  # [1 + 8, 3]
    dist = ((img[:, :, None, :] - palette[None, None]) ** 2).sum(-1)  # [H, W, 9]
    label = dist.argmin(-1)  # 0 = background
    fg = label > 0
    comps, n = ndimage.label(fg)
    out = Analysis(background=_BG_NAMES[bg])
    if n == 0:
        return out
    areas = ndimage.sum(fg, comps, index=np.arange(1, n + 1))
    keep = [i + 1 for i in range(n) if areas[i] >= MIN_OBJECT_FRACTION * hgt * wid]
    if not keep:
        return out
    objects = np.isin(comps, keep)
    # Colour vote on the objects' cores: soft edges blend towards the background.
    core = ndimage.binary_erosion(objects, iterations=2)
    core = core if core.any() else objects
    colours = np.bincount(label[core & fg] - 1, minlength=len(_FG_NAMES))
    out.colour = _FG_NAMES[int(colours.argmax())]
    out.colour_share = float(colours.max() / colours.sum())
    for sl_i, sl in enumerate(ndimage.find_objects(comps)):
        if sl_i + 1 not in keep:
            continue
        mask = comps[sl] == sl_i + 1
        out.shapes.append(shape_of(mask))
        ys, xs = np.nonzero(mask)
        out.centroids.append(((xs.mean() + sl[1].start + 0.5) / wid, (ys.mean() + sl[0].start + 0.5) / hgt))
    return out


def mismatches(image: np.ndarray, prompt: str) -> list[str]:
    """What in the image disagrees with the prompt (empty list: it matches)."""
    want = D.parse_prompt(prompt)
    got = analyse(image)
    errs = []
    if want.background is not None and got.background != want.background:  # None: any background
        errs.append(f"background {got.background} != {want.background}")
    if got.colour != want.colour or got.colour_share < MIN_COLOUR_SHARE:
        errs.append(f"colour {got.colour} ({got.colour_share:.0%}) != {want.colour}")
    if got.count != want.count:
        errs.append(f"count {got.count} != {want.count}")
    if any(s != want.shape for s in got.shapes):
        errs.append(f"shapes {got.shapes} != {want.shape}")
    if want.position is not None and got.position != want.position:
        errs.append(f"position {got.position} != {want.position}")
    return errs


def score_image(image: np.ndarray, prompt: str) -> bool:
    """True when the image (HxWx3, uint8 or float in [0, 1]) shows what `prompt` asks."""
    return not mismatches(image, prompt)


# ---------------------------------------------------------------- evaluator self-check


def wrong_prompt(prompt: str, attribute: str) -> str:
    """The prompt with one attribute changed (to the next value in its list)."""
    s = D.parse_prompt(prompt)

    def nxt(seq, v):
        seq = list(seq)
        return seq[(seq.index(v) + 1) % len(seq)]

    if attribute == "colour":
        s = D.Scene(nxt(D.COLOURS, s.colour), s.shape, s.count, s.position, s.background)
    elif attribute == "shape":
        s = D.Scene(s.colour, nxt(D.SHAPES, s.shape), s.count, s.position, s.background)
    elif attribute == "count":
        n = s.count % 3 + 1
        s = D.Scene(s.colour, s.shape, n, "center" if n == 1 else None, s.background)
    elif attribute == "background":
        s = D.Scene(s.colour, s.shape, s.count, s.position, nxt(D.BACKGROUNDS, s.background))
    elif attribute == "position":
        if s.position is None:
            return ""
        s = D.Scene(s.colour, s.shape, s.count, nxt(D.POSITIONS, s.position), s.background)
    return s.caption


ATTRIBUTES = ("colour", "shape", "count", "background", "position")


def check_evaluator(n: int = 200, sizes=(192, 256, 320)) -> dict[str, float]:
    """Accuracy on ground-truth images (held-out split) and pass rate of wrong prompts."""
    right, wrong = 0, {a: [0, 0] for a in ATTRIBUTES}
    total = 0
    for i in range(n):
        size = sizes[i % len(sizes)]
        img, cap = D.sample(900_000 + i, size=size, held_out=True)
        total += 1
        right += score_image(img, cap)
        for a in ATTRIBUTES:
            wp = wrong_prompt(cap, a)
            if wp:
                wrong[a][0] += score_image(img, wp)
                wrong[a][1] += 1
    res = {"ground_truth_pass": right / total}
    for a, (passed, cnt) in wrong.items():
        res[f"wrong_{a}_pass"] = passed / max(cnt, 1)
    return res


def check_vae(model: str, n: int = 48, size: int = 256) -> float:
    """Share of held-out ground-truth images that still pass after the model's VAE
    encodes (posterior mean) and decodes them: the ceiling the VAE puts on the score."""
    import torch
    from diffusers import AutoencoderKL

    torch.set_num_threads(1)
    vae = AutoencoderKL.from_pretrained(model, subfolder="vae").eval()
    passed = 0
    with torch.inference_mode():
        for i in range(n):
            img, cap = D.sample(800_000 + i, size=size, held_out=True)
            x = torch.from_numpy(img).permute(2, 0, 1)[None].float() / 127.5 - 1.0  # [1, 3, H, W]
            rec = vae.decode(vae.encode(x).latent_dist.mean).sample[0]  # [3, H, W]
            passed += score_image(((rec.permute(1, 2, 0) + 1) / 2).clamp(0, 1).numpy(), cap)
    return passed / n


# ---------------------------------------------------------------- model evaluation


def generate_and_score(model: str, steps: int, seed: int, guidance: float, size: int, limit: int | None,
                       save: str | None, verbose: bool, every: int = 1, paraphrased: bool = False,
                       bare: bool = False) -> float:
    """Score on the 56 held-out prompts (or their evaluation-only paraphrases, or the 32 bare prompts),
    seed + i for prompt i."""
    import torch
    from diffusers import FluxPipeline

    from meshdit.default_model import generation_kwargs

    torch.set_num_threads(1)
    t_load = time.time()
    pipe = FluxPipeline.from_pretrained(model)
    pipe.set_progress_bar_config(disable=True)
    print(f"pipeline load: {time.time() - t_load:.2f}s")
    every_prompt = K.BARE_PROMPTS if bare else K.PARAPHRASED_PROMPTS if paraphrased else D.EVAL_PROMPTS
    which = "bare" if bare else "paraphrased held-out" if paraphrased else "held-out"
    prompts = every_prompt[::every][:limit] if limit else every_prompt[::every]
    passed, images, t_total = 0, [], 0.0
    wrong = {"background": 0, "colour": 0, "count": 0, "shapes": 0, "position": 0}
    for i, prompt in enumerate(prompts):
        t0 = time.time()
        settings = generation_kwargs() | dict(true_cfg_scale=guidance, height=size, width=size,
                                              num_inference_steps=steps)
        img = pipe(prompt, generator=torch.Generator().manual_seed(seed + i), output_type="np", **settings).images[0]
        t_total += time.time() - t0
        errs = mismatches(img, prompt)
        passed += not errs
        for e in errs:
            wrong[e.split()[0]] += 1
        if verbose:
            print(f"{'PASS' if not errs else 'FAIL'} {prompt!r} {'; '.join(errs)}", flush=True)
        if save:
            images.append((img * 255).round().astype(np.uint8))
    score = 100.0 * passed / len(prompts)
    print(f"seconds per image (generation only, {size}x{size}, {steps} steps, true_cfg {guidance}): "
          f"{t_total / len(prompts):.2f}")
    n_pos = sum(D.parse_prompt(p).position is not None for p in prompts)
    n_bg = sum(D.parse_prompt(p).background is not None for p in prompts)
    asked = {"position": n_pos, "background": n_bg}
    parts = ", ".join(f"{k} {100 * (1 - v / asked.get(k, len(prompts))):.0f}%" for k, v in wrong.items() if asked.get(k, 1))
    print(f"per attribute correct: {parts}")
    print(f"score: {score:.1f}% ({passed}/{len(prompts)} {which} prompts, "
          f"{size}x{size}; background asked in {n_bg})")
    if save:
        from PIL import Image

        cols = 8
        rows = [np.concatenate(images[r : r + cols] + [np.zeros_like(images[0])] * (cols - len(images[r : r + cols])), 1)
                for r in range(0, len(images), cols)]
        Image.fromarray(np.concatenate(rows, 0)).save(save)
        print(f"grid saved to {save}")
    return score


def main() -> None:
    from meshdit.default_model import DEFAULT_GUIDANCE, DEFAULT_HEIGHT, DEFAULT_STEPS, weights_path

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(weights_path()))
    ap.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    ap.add_argument("--seed", type=int, nargs="+", default=[0],
                    help="seed of the first prompt; several: score each seed set, then their pooled score")
    ap.add_argument("--guidance", type=float, default=DEFAULT_GUIDANCE, help="true_cfg_scale")
    ap.add_argument("--size", type=int, default=DEFAULT_HEIGHT, help="height and width (e.g. 512)")
    prompt_set = ap.add_mutually_exclusive_group()
    prompt_set.add_argument("--paraphrased", action="store_true",
                            help="score captions.PARAPHRASED_PROMPTS (evaluation-only templates) instead of the 56")
    prompt_set.add_argument("--bare", action="store_true",
                            help="score captions.BARE_PROMPTS ('a blue square': every pair, no position or background)")
    ap.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    ap.add_argument("--every", type=int, default=1, help="only every k-th prompt (quick checks)")
    ap.add_argument("--save", default=None, help="write a grid of the images to this PNG")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--check-evaluator", action="store_true", help="score ground-truth images instead")
    ap.add_argument("--check-vae", action="store_true", help="score VAE round trips of ground-truth images")
    args = ap.parse_args()
    if args.check_vae:
        n = 48
        print(f"VAE round trip pass: {100 * check_vae(args.model, n, args.size):.1f}% of {n} held-out "
              f"ground-truth images at {args.size} px")
        return
    if args.check_evaluator:
        for k, v in check_evaluator().items():
            print(f"{k}: {100 * v:.1f}%")
        return
    if args.save and len(args.seed) > 1:
        ap.error("--save writes one seed set's grid: give one --seed")
    scores = [generate_and_score(args.model, args.steps, seed, args.guidance, args.size, args.limit, args.save,
                                 not args.quiet, every=args.every, paraphrased=args.paraphrased, bare=args.bare)
              for seed in args.seed]
    if len(scores) > 1:  # every set has the same prompts, so the mean is the pooled pass rate
        print(f"pooled over {len(scores)} seed sets ({' / '.join(f'{s:.1f}%' for s in scores)}): "
              f"{sum(scores) / len(scores):.1f}%")


if __name__ == "__main__":
    main()
