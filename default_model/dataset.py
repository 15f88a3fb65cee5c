"""Procedural captioned-shapes dataset for the default model.

Every image is drawn from a seed (numpy RNG + PIL), so the same seed always gives
the same pixels and the same caption. An image holds 1-3 flat-colour shapes of one
colour and one kind on a plain background; the caption says which:

    "one red circle on the left on a white background"
    "three blue squares on a black background"

Position words are only used for a single shape; a pair stands side by side and a
triple forms a triangle (see SLOTS). Shape colours and background colours are
disjoint word sets, so a caption is unambiguous as a bag of words.

Held-out combinations: the (colour, shape) pairs in HELD_OUT_PAIRS never appear in
training. EVAL_PROMPTS, the fixed evaluation list, uses only those pairs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

# Shape colours (saturated, well separated hues) and background colours (neutral).
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "orange": (245, 135, 0),
    "yellow": (235, 215, 0),
    "green": (30, 165, 45),
    "cyan": (0, 195, 215),
    "blue": (35, 65, 220),
    "purple": (125, 40, 195),
    "pink": (250, 105, 185),
}
BACKGROUNDS: dict[str, tuple[int, int, int]] = {
    "white": (255, 255, 255),
    "black": (0, 0, 0),
    "gray": (128, 128, 128),
}
SHAPES = ("circle", "square", "triangle", "diamond")
COUNT_WORDS = {1: "one", 2: "two", 3: "three"}
POSITIONS = ("left", "right", "top", "bottom", "center")
POSITION_PHRASES = {
    "left": "on the left",
    "right": "on the right",
    "top": "at the top",
    "bottom": "at the bottom",
    "center": "in the center",
}
# Layout choices: a single shape at one of 5 positions, or a group of 2 or 3.
LAYOUTS: tuple[tuple[int, str | None], ...] = tuple((1, p) for p in POSITIONS) + ((2, None), (3, None))

# (colour, shape) pairs never seen in training: one per colour, two per shape.
HELD_OUT_PAIRS: frozenset[tuple[str, str]] = frozenset(
    {
        ("red", "triangle"),
        ("orange", "circle"),
        ("yellow", "square"),
        ("green", "diamond"),
        ("cyan", "circle"),
        ("blue", "triangle"),
        ("purple", "square"),
        ("pink", "diamond"),
    }
)
TRAIN_PAIRS: tuple[tuple[str, str], ...] = tuple(
    (c, s) for c in COLOURS for s in SHAPES if (c, s) not in HELD_OUT_PAIRS
)

# Object half-size as a fraction of the image side.
SIZE_RANGE = (0.12, 0.15)


@dataclass(frozen=True)
class Scene:
    """What an image shows; `caption` is its prompt."""

    colour: str | None  # None only in a prompt: any colour
    shape: str
    count: int
    position: str | None  # only for count == 1 (None in a prompt: anywhere)
    background: str | None  # None only in a prompt: any background

    @property
    def caption(self) -> str:
        noun = self.shape + ("s" if self.count > 1 else "")
        words = [COUNT_WORDS[self.count], self.colour, noun]
        if self.position is not None:
            words.append(POSITION_PHRASES[self.position])
        if self.background is not None:
            words.append(f"on a {self.background} background")
        return " ".join(words)


NUMBER_WORDS = {"one": 1, "single": 1, "1": 1, "two": 2, "2": 2, "three": 3, "3": 3}


def prompt_words(prompt: str) -> list[str]:
    """The prompt's words, lower case, punctuation dropped (what the tokenizers read)."""
    return re.findall(r"[a-z0-9]+", prompt.lower())


def parse_prompt(prompt: str) -> Scene:
    """What a prompt asks for, from its words: the fixed captions (inverse of Scene.caption) and the
    natural ones (articles, digits, any order, case, punctuation). Colour or background None: any;
    position None for a single shape: anywhere."""
    words = prompt_words(prompt)
    colour = next((c for c in COLOURS if c in words), None)
    shape = next(s for s in SHAPES if s in words or s + "s" in words)
    count = next((NUMBER_WORDS[w] for w in words if w in NUMBER_WORDS), 1)  # "a"/"an": one
    background = next((b for b in BACKGROUNDS if b in words), None)
    position = next((p for p in POSITIONS if p in words), None)
    return Scene(colour, shape, count, position, background)


def vocabulary() -> list[str]:
    """Every word a fixed caption can contain (plural 's' is tokenised as its own piece)."""
    words: list[str] = list(COUNT_WORDS.values()) + list(COLOURS) + list(SHAPES) + list(POSITIONS)
    words += list(BACKGROUNDS) + ["on", "the", "at", "in", "a", "background"]
    return words


def all_scenes(held_out: bool) -> list[Scene]:
    """Every caption of the training split (held_out=False) or of the held-out split."""
    pairs = sorted(HELD_OUT_PAIRS) if held_out else list(TRAIN_PAIRS)
    return [
        Scene(c, s, n, p, b)
        for (c, s) in pairs
        for (n, p) in LAYOUTS
        for b in BACKGROUNDS
    ]


def _eval_prompts() -> tuple[str, ...]:
    # Every held-out pair with every layout (8 x 7 = 56 prompts); backgrounds cycle
    # so each appears equally often. Fixed order, no randomness.
    bgs = list(BACKGROUNDS)
    out = []
    for i, (c, s) in enumerate(sorted(HELD_OUT_PAIRS)):
        for j, (n, p) in enumerate(LAYOUTS):
            out.append(Scene(c, s, n, p, bgs[(i + j) % len(bgs)]).caption)
    return tuple(out)


EVAL_PROMPTS: tuple[str, ...] = _eval_prompts()


def sample_scene(rng: np.random.Generator, held_out: bool = False) -> Scene:
    """A random scene from the training split (or the held-out split)."""
    pairs = sorted(HELD_OUT_PAIRS) if held_out else TRAIN_PAIRS
    colour, shape = pairs[rng.integers(len(pairs))]
    # 40% single shapes (8% per position), 30% pairs, 30% triples.
    u = rng.random()
    if u < 0.4:
        count, position = 1, POSITIONS[rng.integers(len(POSITIONS))]
    else:
        count, position = (2 if u < 0.7 else 3), None
    background = list(BACKGROUNDS)[rng.integers(len(BACKGROUNDS))]
    return Scene(colour, shape, count, position, background)


# Where shapes go, as (x, y) fractions of the side: one slot per single-shape position,
# a side-by-side pair and a triangle of three. Fixed slots with a small jitter keep the
# layout a near-deterministic function of the caption, which a tiny model trained on a
# CPU can learn; the jitter keeps seeds from giving identical pictures.
SLOTS: dict[str, tuple[tuple[float, float], ...]] = {
    "left": ((0.25, 0.5),),
    "right": ((0.75, 0.5),),
    "top": ((0.5, 0.25),),
    "bottom": ((0.5, 0.75),),
    "center": ((0.5, 0.5),),
    "two": ((0.27, 0.5), (0.73, 0.5)),
    "three": ((0.5, 0.28), (0.27, 0.72), (0.73, 0.72)),
}
JITTER = 0.03  # max offset of a slot, fraction of the side


def _centres(rng: np.random.Generator, scene: Scene, size: int) -> list[tuple[float, float]]:
    key = scene.position if scene.count == 1 else COUNT_WORDS[scene.count]
    s = float(size)
    return [
        ((x + rng.uniform(-JITTER, JITTER)) * s, (y + rng.uniform(-JITTER, JITTER)) * s)
        for x, y in SLOTS[key]
    ]


def _draw_shape(draw: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, r: float, fill) -> None:
    if shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif shape == "square":
        q = r * 0.9  # equal area-ish footprint to the circle
        draw.rectangle([cx - q, cy - q, cx + q, cy + q], fill=fill)
    elif shape == "triangle":
        draw.polygon([(cx, cy - r), (cx + r, cy + r), (cx - r, cy + r)], fill=fill)
    elif shape == "diamond":
        q = r * 1.1
        draw.polygon([(cx, cy - q), (cx + q, cy), (cx, cy + q), (cx - q, cy)], fill=fill)
    else:
        raise ValueError(shape)


def render(scene: Scene, size: int = 256, seed: int = 0) -> np.ndarray:
    """Draw `scene` as a uint8 [size, size, 3] image; layout and size come from `seed`."""
    rng = np.random.default_rng(seed)
    r = rng.uniform(*SIZE_RANGE) * size
    img = Image.new("RGB", (size, size), BACKGROUNDS[scene.background])
    draw = ImageDraw.Draw(img)
    for cx, cy in _centres(rng, scene, size):
        _draw_shape(draw, scene.shape, cx, cy, r, COLOURS[scene.colour])
    return np.asarray(img, dtype=np.uint8).copy()


def sample(seed: int, size: int = 256, held_out: bool = False) -> tuple[np.ndarray, str]:
    """(image uint8 [size, size, 3], caption) for one seed. Deterministic."""
    rng = np.random.default_rng([seed, 1])
    scene = sample_scene(rng, held_out=held_out)
    return render(scene, size=size, seed=int(rng.integers(2**31))), scene.caption


# ---------------------------------------------------------------- mixed scenes (training only)

# Two single shapes of different (colour, shape) pairs side by side or one above the other, both trained
# pairs. In the one-kind scenes a colour word rules out its held-out shape in the whole image ("yellow" in a
# caption: never a square anywhere); a mixed scene shows a yellow circle beside a red square, so a colour
# word has to bind to its own shape, not to the picture. Prompts and the evaluator keep one kind per image.
MIXED_PLACES = (("left", "right"), ("top", "bottom"))


def sample_mixed_scene(rng: np.random.Generator) -> tuple[Scene, Scene]:
    """Two single shapes (count 1, positions set, one background) of two different trained pairs."""
    i, j = rng.choice(len(TRAIN_PAIRS), size=2, replace=False)
    places = MIXED_PLACES[rng.integers(len(MIXED_PLACES))]
    background = list(BACKGROUNDS)[rng.integers(len(BACKGROUNDS))]
    return tuple(Scene(*TRAIN_PAIRS[k], 1, p, background) for k, p in zip((i, j), places))


def render_mixed(scenes: tuple[Scene, ...], size: int = 256, seed: int = 0) -> np.ndarray:
    """Draw single shapes (each at its own position, one size) on their common background: uint8 [size, size, 3]."""
    rng = np.random.default_rng(seed)
    r = rng.uniform(*SIZE_RANGE) * size
    img = Image.new("RGB", (size, size), BACKGROUNDS[scenes[0].background])
    draw = ImageDraw.Draw(img)
    for scene in scenes:
        (cx, cy), = _centres(rng, scene, size)
        _draw_shape(draw, scene.shape, cx, cy, r, COLOURS[scene.colour])
    return np.asarray(img, dtype=np.uint8).copy()
