"""Caption grammars of the default model: the words each knows, the natural training captions, and the
evaluation-only paraphrases.

Three grammars:
  fixed    what the first release was trained on: "one red circle on the left on a white background"
  natural  the same scenes said as people say them (issue 18): articles for one ("a", "an", "one",
           "a single", "1"), number words or digits, optional position phrase (a single shape with none
           is a shape somewhere), optional background phrase (none: any background), the background
           first ("on a black background, three yellow triangles"), case and punctuation; now and then
           no colour word ("two squares": any colour), so the shape word alone must carry the shape.
           With a centre prior (position_drop) a caption without a position mostly shows a centred
           shape, so "a blue square" has one likely layout instead of five equal ones.
  joined   the natural grammar and the word "and", which joins the two shapes of a mixed caption (and,
           with finetune --mixed-uncounted, "yellow circle on the left and red square on the right": no
           count word, so "a" / "one" before a shape always means an image of one shape).
  mixed    (training only, finetune --mixed) two single shapes of different trained pairs, each with its
           position: one sentence each under the natural grammar ("a yellow circle on the left. a red
           square on the right"), joined by "and" under the joined one ("a yellow circle on the left and
           a red square on the right"), so that no one-shape caption reads like half of a mixed one
           (tried, not kept: the model card's "The wording of the mixed captions").

A caption's *template* (`template_of`) is what stays when the colour, shape and background words are
taken out and case and punctuation dropped: the phrase order and the count form. (The model still
sees punctuation, a token of its own to both tokenizers, and T5 sees case; ignoring them makes a
template only stricter: a paraphrase must differ from every training caption in its words alone.)
The training sampler draws from TRAINING_TEMPLATES only; PARAPHRASED_PROMPTS uses other templates
(position first, position after the background, a digit after a leading background) on the held-out
(colour, shape) pairs, so it measures rewording the model never saw, on pairs it never saw.
"""

from __future__ import annotations

import itertools

import numpy as np

from . import dataset as D

GRAMMARS = ("fixed", "natural", "joined")
FUNCTION_WORDS = ("on", "the", "at", "in", "a", "background")
NATURAL_WORDS = ("an", "single", "1", "2", "3")  # the natural grammar's words beyond the fixed one's
JOINED_WORDS = ("and",)  # the joined grammar's words beyond the natural one's

# How a count is said: single shapes in 4 forms, groups as a word or a digit.
ONE_FORMS = ("article", "one", "single", "digit")
GROUP_FORMS = ("word", "digit")
# Phrase orders: N = count colour shape, P = position (single shapes), B = background.
TRAINING_ORDERS = ("N", "NP", "NB", "NPB", "B,N", "B,NP")
CASES = ("lower", "sentence", "upper", "title")
CASE_WEIGHTS = (0.6, 0.25, 0.07, 0.08)
# Share of natural captions without the colour word. In training a colour rules out its held-out
# shape (no yellow square is ever drawn), so colour words carry shape evidence the model learns
# to use, and a held-out pair comes out as the colour's usual shape; colourless captions train
# the shape word's own pathway, which is what a held-out pair needs.
COLOURLESS_SHARE = 0.15


def vocabulary(grammar: str = "fixed") -> list[str]:
    """The tokenizer words of `grammar` (plural 's' is its own piece), in a fixed order: the fixed
    grammar's words first, so the natural tokenizers keep every earlier word."""
    if grammar not in GRAMMARS:
        raise ValueError(f"unknown grammar {grammar!r}: one of {GRAMMARS}")
    words = D.vocabulary()
    if grammar != "fixed":
        words += list(NATURAL_WORDS)
    if grammar == "joined":
        words += list(JOINED_WORDS)
    return words


def known_words(grammar: str) -> dict:
    """What `grammar` lets a prompt say, by kind, and every word it uses (plurals included): the content
    of a model folder's vocabulary.json (meshdit's unknown-word warning reads it)."""
    counts = list(D.COUNT_WORDS.values()) + (["a", "an", "single", "1", "2", "3"] if grammar != "fixed" else [])
    return {
        "grammar": grammar,
        "colours": list(D.COLOURS),
        "shapes": list(D.SHAPES),
        "counts": counts,
        "positions": [D.POSITION_PHRASES[p] for p in D.POSITIONS],
        "backgrounds": [f"on a {b} background" for b in D.BACKGROUNDS],
        "example": D.Scene("red", "circle", 2, None, "white").caption,
        "words": sorted(set(vocabulary(grammar)) | {s + "s" for s in D.SHAPES}),
        # The fixed grammar's T5 tokenizer has lower-case pieces only; the natural one reads any case and , .
        "reads_case_and_punctuation": grammar != "fixed",
    }


def write_vocabulary(folder, grammar: str) -> None:
    """vocabulary.json of a model folder trained on `grammar` (read by meshdit.prompt_vocabulary)."""
    import json
    from pathlib import Path

    text = json.dumps(known_words(grammar), indent=1) + "\n"
    (Path(folder) / "vocabulary.json").write_text(text, encoding="utf-8")


# ---------------------------------------------------------------- natural captions


def _count_phrase(scene: D.Scene, form: str | None) -> str:
    if form is None:  # uncounted mixed captions: "yellow circle on the left and red square on the right"
        return ""
    if scene.count > 1:
        return str(scene.count) if form == "digit" else D.COUNT_WORDS[scene.count]
    if form == "article":
        return "an" if (scene.colour or scene.shape)[0] in "aeiou" else "a"
    return {"one": "one", "single": "a single", "digit": "1"}[form]


def _noun_phrase(scene: D.Scene, form: str) -> str:
    noun = scene.shape + ("s" if scene.count > 1 else "")
    return " ".join(w for w in (_count_phrase(scene, form), scene.colour, noun) if w)


def _apply_case(text: str, case: str) -> str:
    if case == "sentence":
        return text[0].upper() + text[1:]
    if case == "upper":
        return text.upper()
    if case == "title":
        return " ".join(w[0].upper() + w[1:] for w in text.split(" "))
    return text


def say(scene: D.Scene, order: str, form: str, case: str = "lower", period: bool = False, comma: bool = True) -> str:
    """`scene` in the phrase order `order` (letters N, P, B; "," after a leading phrase)."""
    phrases = {"N": _noun_phrase(scene, form),
               "P": D.POSITION_PHRASES[scene.position] if scene.position else "",
               "B": f"on a {scene.background} background" if scene.background else ""}
    parts, text = [p for p in order.split(",")], []
    for i, part in enumerate(parts):
        chunk = " ".join(phrases[c] for c in part)
        text.append(chunk + ("," if comma and i < len(parts) - 1 else ""))
    out = _apply_case(" ".join(text), case)
    return out + ("." if period else "")


# A single shape's position is left out of 40 % of natural captions, whatever the position: "a blue square"
# is then any of five places with equal odds, and a small model hedges between them (two faint shapes or a
# blob). With a centre prior p, captions leave the position out mostly for centred shapes, so a caption
# without one shows the shape in the centre with odds p (elsewhere 1 - p), as photographers frame a
# lone subject.
CENTRE_DROP = 0.9  # share of centred single shapes whose caption leaves the position out (with a prior)


def position_drop(position: str, centre_prior: float | None) -> float:
    """Share of natural captions of a single shape at `position` that leave the position out."""
    if centre_prior is None:
        return 0.4
    if not 0 < centre_prior < 1:
        raise ValueError(f"centre prior {centre_prior}: a share between 0 and 1 (exclusive)")
    others = len(D.POSITIONS) - 1  # sample_scene draws the positions uniformly
    # P(centre | no position) = CENTRE_DROP / (CENTRE_DROP + others * q) = centre_prior
    q = CENTRE_DROP * (1 - centre_prior) / (centre_prior * others)
    return CENTRE_DROP if position == "center" else min(q, 1.0)


def natural_caption(scene: D.Scene, rng: np.random.Generator, colourless: float = COLOURLESS_SHARE,
                    centre_prior: float | None = None) -> str:
    """A natural caption of an image showing `scene` (every field set): the position is said 60 % of the
    time (or, with `centre_prior`, mostly left out for centred shapes: see position_drop), the background
    70 %, the colour all but `colourless` of the time, so the model learns that what a caption leaves out
    can be anything."""
    said_position = scene.count == 1 and rng.random() < 1 - position_drop(scene.position, centre_prior)
    position = scene.position if said_position else None
    background = scene.background if rng.random() < 0.7 else None
    colour = None if rng.random() < colourless else scene.colour
    said = D.Scene(colour, scene.shape, scene.count, position, background)
    form = (ONE_FORMS if scene.count == 1 else GROUP_FORMS)[rng.integers(2 if scene.count > 1 else 4)]
    orders = [o for o in TRAINING_ORDERS if ("P" in o) == (position is not None) and ("B" in o) == (background is not None)]
    if form == "digit":  # a digit never follows a leading background in training (kept for PARAPHRASED_PROMPTS)
        orders = [o for o in orders if not o.startswith("B")]
    order = orders[rng.integers(len(orders))]
    case = CASES[rng.choice(len(CASES), p=CASE_WEIGHTS)]
    return say(said, order, form, case, period=rng.random() < 0.3, comma=rng.random() < 0.8)


def sample_training_caption(rng: np.random.Generator) -> tuple[D.Scene, str]:
    """(scene of the image, its natural caption) from the training split."""
    scene = D.sample_scene(rng)
    return scene, natural_caption(scene, rng)


# ---------------------------------------------------------------- mixed captions (training only)

# Where a mixed caption says its background: not at all, first ("on a gray background, a red circle on the
# left. a blue square on the right"), or last. Under the natural grammar the two shapes are two sentences
# joined by "." (a comma would teach "on the left, a blue square", the paraphrase set's position-first
# order); then a one-shape caption ("a blue square on the right") is word for word the second half of a
# mixed one. The joined grammar says "and" between them instead, a word no one-shape caption has (and, not
# counted, drops the count words too). Tried at 30 % mixed scenes: neither stops one shape at a side being
# drawn as two at 512 px, which the two-shape images themselves teach (model card).
MIXED_BACKGROUND_PLACES = (None, "first", "last")


def say_mixed(said: tuple[D.Scene, ...], forms: tuple[str, ...], background: str | None, place: str | None,
              case: str = "lower", period: bool = False, joined: bool = False) -> str:
    """Single shapes (each with its position) as one sentence each (`joined`: one sentence, "and" between
    them), the background `place`d once."""
    parts = [say(s, "NP", f) for s, f in zip(said, forms)]
    if place == "first":
        parts[0] = f"on a {background} background, " + parts[0]
    elif place == "last":
        parts[-1] += f" on a {background} background"
    text = _apply_case(" and ".join(parts), case) if joined else ". ".join(_apply_case(t, case) for t in parts)
    return text + ("." if period else "")


def mixed_caption(scenes: tuple[D.Scene, ...], rng: np.random.Generator, colourless: float = COLOURLESS_SHARE,
                  joined: bool = False, counted: bool = True) -> str:
    """A natural caption of a mixed scene (dataset.sample_mixed_scene): every shape with its position, in
    either order, joined by "." or (`joined`, the joined grammar) by "and"; the background said 70 % of the
    time, first or last; both colour words left out `colourless` of the time; count forms, case and a final
    period as natural_caption. Not `counted`: no count word before either shape, so a count word for one
    ("a", "one", "a single", "1") is only ever said of an image with one shape."""
    if not counted and not joined:
        raise ValueError("uncounted mixed captions need the joined grammar (\"circle on the left and square on the right\")")
    order = list(scenes) if rng.random() < 0.5 else list(scenes)[::-1]
    colourless_now = rng.random() < colourless
    said = tuple(D.Scene(None if colourless_now else s.colour, s.shape, 1, s.position, None) for s in order)
    forms = tuple(ONE_FORMS[rng.integers(len(ONE_FORMS))] for _ in said)
    forms = forms if counted else (None,) * len(said)
    place = MIXED_BACKGROUND_PLACES[1 + rng.integers(2)] if rng.random() < 0.7 else None
    case = CASES[rng.choice(len(CASES), p=CASE_WEIGHTS)]
    return say_mixed(said, forms, scenes[0].background, place, case, period=rng.random() < 0.3, joined=joined)


def sample_mixed_caption(rng: np.random.Generator, joined: bool = False,
                         counted: bool = True) -> tuple[tuple[D.Scene, ...], str]:
    """(mixed scene of the image, its caption)."""
    scenes = D.sample_mixed_scene(rng)
    return scenes, mixed_caption(scenes, rng, joined=joined, counted=counted)


def template_of(caption: str) -> str:
    """The caption's template: colour -> C, shape -> S, background phrase -> B, position phrase -> P,
    the count form kept; case and punctuation dropped (so templates differ in words alone)."""
    words = D.prompt_words(caption)
    text = " " + " ".join(words) + " "
    for bg in D.BACKGROUNDS:
        text = text.replace(f" on a {bg} background ", " B ")
    for phrase in D.POSITION_PHRASES.values():
        text = text.replace(f" {phrase} ", " P ")
    out = []
    for w in text.split():
        if w in D.COLOURS:
            w = "C"
        elif w in D.SHAPES or (w.endswith("s") and w[:-1] in D.SHAPES):
            w = "S" if w in D.SHAPES else "Ss"
        elif w == "an":  # the article's form follows the colour word, not the template
            w = "a"
        elif w in ("two", "three"):
            w = "n"
        elif w in ("2", "3"):
            w = "d"
        out.append(w)
    return " ".join(out)


def training_templates() -> set[str]:
    """Every template the training samplers (one-kind and mixed captions, either joiner) can produce (enumerated,
    not sampled)."""
    out = set()
    for count, position in D.LAYOUTS:
        for bg in (None, "white"):
            for pos, colour in itertools.product({position, None} if position else {None}, ("red", None)):
                scene = D.Scene(colour, "circle", count, pos, bg)
                for form in (ONE_FORMS if count == 1 else GROUP_FORMS):
                    for order in TRAINING_ORDERS:
                        if ("P" in order) != (pos is not None) or ("B" in order) != (bg is not None):
                            continue
                        if form == "digit" and order.startswith("B"):
                            continue
                        out.add(template_of(say(scene, order, form)))
    mixed_forms = list(itertools.product(ONE_FORMS, repeat=2)) + [(None, None)]  # (None, None): uncounted
    for colour, forms, place, joined in itertools.product(("red", None), mixed_forms, MIXED_BACKGROUND_PLACES,
                                                          (False, True)):
        if forms == (None, None) and not joined:  # uncounted captions are the joined grammar's only
            continue
        said = (D.Scene(colour, "circle", 1, "left", None), D.Scene(colour, "square", 1, "right", None))
        out.add(template_of(say_mixed(said, forms, "white", place, joined=joined)))
    return out


# ---------------------------------------------------------------- evaluation-only paraphrases

# Single shapes: the position first, or after the background; groups: a digit after a leading background.
PARAPHRASE_ORDERS_SINGLE = ("P,NB", "P,N", "NBP", "B,P,N")
PARAPHRASE_CASES = ("sentence", "lower", "lower", "sentence")


def _paraphrased_prompts() -> tuple[str, ...]:
    # Every held-out pair with every layout (8 x 7 = 56), like EVAL_PROMPTS; orders, count forms,
    # backgrounds and case cycle so each appears with every position. Fixed, no randomness.
    bgs = list(D.BACKGROUNDS)
    out = []
    for i, (c, s) in enumerate(sorted(D.HELD_OUT_PAIRS)):
        for j, (n, p) in enumerate(D.LAYOUTS):
            k = i + j
            bg = bgs[k % len(bgs)]
            if n == 1:
                order = PARAPHRASE_ORDERS_SINGLE[k % len(PARAPHRASE_ORDERS_SINGLE)]
                scene = D.Scene(c, s, n, p, bg if "B" in order else None)
                text = say(scene, order, ONE_FORMS[k % len(ONE_FORMS)], PARAPHRASE_CASES[k % 4], period=k % 3 == 0)
            else:
                text = say(D.Scene(c, s, n, None, bg), "B,N", "digit", PARAPHRASE_CASES[k % 4], period=k % 3 == 0)
            out.append(text)
    return tuple(out)


PARAPHRASED_PROMPTS: tuple[str, ...] = _paraphrased_prompts()


# ---------------------------------------------------------------- bare prompts (evaluation)

def _bare_prompts() -> tuple[str, ...]:
    # The first thing people type, "a blue square": one shape named by colour and kind, no position,
    # no background (so any slot and any background are right). Every colour/shape pair (32: the 24
    # trained and the 8 held out), the article forms cycling. Training says these too (a natural
    # caption leaves the position out 40 % of the time): this set measures the one-of-five-places
    # case, which EVAL_PROMPTS and PARAPHRASED_PROMPTS never ask.
    return tuple(say(D.Scene(c, s, 1, None, None), "N", ONE_FORMS[(i + j) % len(ONE_FORMS)])
                 for i, c in enumerate(D.COLOURS) for j, s in enumerate(D.SHAPES))


BARE_PROMPTS: tuple[str, ...] = _bare_prompts()
