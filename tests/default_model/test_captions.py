"""The natural caption grammar: what the training sampler says, what it never says, and the paraphrase set."""
import re

import numpy as np
import pytest

from default_model import captions as K
from default_model import dataset as D

N_SAMPLES = 6000


@pytest.fixture(scope="module")
def sampled():
    rng = np.random.default_rng(0)
    return [K.sample_training_caption(rng) for _ in range(N_SAMPLES)]


def _norm(caption: str) -> str:
    return " ".join(D.prompt_words(caption))


def test_training_sampler_never_says_a_held_out_pair_or_prompt(sampled):
    held_out = {_norm(p) for p in D.EVAL_PROMPTS + K.PARAPHRASED_PROMPTS}
    for scene, caption in sampled:
        said = D.parse_prompt(caption)
        assert (said.colour, said.shape) not in D.HELD_OUT_PAIRS, caption
        assert _norm(caption) not in held_out, caption
        # what the caption says is what the image shows; what it leaves out is anything
        assert (said.shape, said.count) == (scene.shape, scene.count), caption
        assert said.colour in (None, scene.colour), caption
        assert said.background in (None, scene.background) and said.position in (None, scene.position), caption


def test_every_kind_of_variation_occurs(sampled):
    captions = [c for _, c in sampled]
    singles = [c for s, c in sampled if s.count == 1]
    kinds = {
        "article a": r"^(a|A) (?!single)", "article an": r"\b[Aa][Nn] ", "one": r"\b[Oo][Nn][Ee] ",
        "a single": r"\b[Ss][Ii][Nn][Gg][Ll][Ee] ", "digit 1": r"^1 ", "number words": r"\b([Tt]wo|[Tt]hree|TWO|THREE) ",
        "digits": r"^[23] ", "plural": r"[Ss] *[.,]?$|[Ss],", "background first": r"^[Oo][Nn] [Aa] \w+ [Bb]ackground",
        "upper case": r"^[^a-z]+$", "sentence case": r"^[A-Z][a-z]", "title case": r"^[A-Z]\w* [A-Z][a-z]",
        "comma": ",", "period": r"\.$",
    }
    for kind, pattern in kinds.items():
        assert any(re.search(pattern, c) for c in captions), kind
    assert any(D.parse_prompt(c).position is None for c in singles)  # a shape somewhere
    assert any(D.parse_prompt(c).position is not None for c in singles)
    assert any(D.parse_prompt(c).background is None for c in captions)  # any background
    colourless = sum(D.parse_prompt(c).colour is None for c in captions) / len(captions)  # any colour
    assert abs(colourless - K.COLOURLESS_SHARE) < 0.02
    assert any(_norm(c) == _norm(s.caption) for s, c in sampled)  # the fixed caption is one of them


MIXED_KINDS = {"natural": (False, True), "joined": (True, True), "joined-uncounted": (True, False)}  # (joined, counted)


@pytest.fixture(scope="module", params=list(MIXED_KINDS))
def sampled_mixed(request):
    rng = np.random.default_rng(1)
    joined, counted = MIXED_KINDS[request.param]
    return joined, counted, [K.sample_mixed_caption(rng, joined, counted) for _ in range(3000)]


def test_training_templates_are_what_the_samplers_draw(sampled):
    rng = np.random.default_rng(1)
    mixed = [K.sample_mixed_caption(rng, *kind) for _ in range(3000) for kind in MIXED_KINDS.values()]
    assert {K.template_of(c) for _, c in sampled + mixed} == K.training_templates()


def test_mixed_captions_say_each_shape_with_its_place_and_never_a_held_out_pair(sampled_mixed):
    joined, counted, sampled_mixed = sampled_mixed
    held_out = {_norm(p) for p in D.EVAL_PROMPTS + K.PARAPHRASED_PROMPTS}
    for scenes, caption in sampled_mixed:
        assert _norm(caption) not in held_out, caption
        # natural: one sentence per shape; joined: one sentence, "and" between the shapes (and never a "." there)
        parts = re.split(r"\band\b", caption, flags=re.I) if joined else caption.split(".")
        said = [D.parse_prompt(t) for t in parts if t.strip(" .")]
        assert len(said) == 2 and ("and" in caption.lower().split()) == joined, caption
        assert not joined or "." not in caption[:-1], caption
        # uncounted: no count word before a shape ("a" is then only the background phrase's)
        said_words = D.prompt_words(re.sub(r"on a \w+ background", "", caption, flags=re.I))
        assert counted or not {"a", "an", "one", "single", "1"} & set(said_words), caption
        assert not counted or sum(w in ("a", "an", "one", "1") for w in said_words) == 2, caption
        by_place = {s.position: s for s in scenes}
        for p in said:
            shown = by_place[p.position]
            assert p.shape == shown.shape and p.colour in (None, shown.colour) and p.count == 1, caption
            assert (p.colour, p.shape) not in D.HELD_OUT_PAIRS, caption
            assert p.background in (None, shown.background), caption
        assert {p.position for p in said} == set(by_place), caption
        assert sum(p.background is not None for p in said) <= 1, caption  # the background said once at most
    colourless = sum(D.parse_prompt(c).colour is None for _, c in sampled_mixed) / len(sampled_mixed)
    assert abs(colourless - K.COLOURLESS_SHARE) < 0.03


def test_paraphrases_are_held_out_pairs_in_templates_training_never_uses():
    prompts = K.PARAPHRASED_PROMPTS
    assert len(prompts) >= 50 and len(set(prompts)) == len(prompts)
    training = K.training_templates()
    for p in prompts:
        assert K.template_of(p) not in training, p
        s = D.parse_prompt(p)
        assert (s.colour, s.shape) in D.HELD_OUT_PAIRS
    parsed = [D.parse_prompt(p) for p in prompts]
    assert {(s.colour, s.shape) for s in parsed} == set(D.HELD_OUT_PAIRS)
    assert {s.count for s in parsed} == {1, 2, 3} and {s.position for s in parsed} == set(D.POSITIONS) | {None}
    words = set(K.known_words("natural")["words"])
    assert all(w in words for p in prompts for w in D.prompt_words(p))


def test_bare_prompts_are_every_pair_alone_in_a_training_template():
    prompts = K.BARE_PROMPTS
    parsed = [D.parse_prompt(p) for p in prompts]
    assert len(prompts) == len(D.COLOURS) * len(D.SHAPES) == len(set(prompts))
    assert {(s.colour, s.shape) for s in parsed} == {(c, s) for c in D.COLOURS for s in D.SHAPES}
    assert all((s.count, s.position, s.background) == (1, None, None) for s in parsed)  # anywhere, any background
    training = K.training_templates()
    assert all(K.template_of(p) in training for p in prompts)
    assert {p.split()[0] for p in prompts} >= {"a", "an", "one", "1"}


def test_natural_tokenizers_and_extended_encoders_read_old_captions_as_before_and_ignore_case():
    from transformers import CLIPTextModel, T5EncoderModel

    from default_model import components as C
    from default_model.train import encode_captions
    from meshdit.default_model import weights_path

    clip = CLIPTextModel.from_pretrained(weights_path(), subfolder="text_encoder")
    t5 = T5EncoderModel.from_pretrained(weights_path(), subfolder="text_encoder_2")
    old = C.clip_tokenizer("fixed"), C.t5_tokenizer("fixed")
    new = C.clip_tokenizer("natural"), C.t5_tokenizer("natural")
    clip2, t52 = C.extend_text_encoders(clip, t5, *old, *new)
    captions = list(D.EVAL_PROMPTS[::4]) + [s.caption for s in D.all_scenes(held_out=False)[::37]]
    before = encode_captions(clip, old[0], t5, old[1], captions)
    for variant in (captions, [c.upper() for c in captions], [c.title() for c in captions]):
        after = encode_captions(clip2, new[0], t52, new[1], variant)
        assert all(bool((a == b).all()) for a, b in zip(before, after))
    for text in ("On a black background, 3 YELLOW triangles.", "an orange circle", "a single red circle"):
        assert "<unk>" not in new[1].convert_ids_to_tokens(new[1](text).input_ids)


def test_the_joined_grammar_reads_every_natural_caption_as_before_and_and_as_one_new_token():
    # A checkpoint moves from the natural grammar to the joined one (finetune.change_grammar) without
    # any caption it trained on reading differently; "and" is one token of each tokenizer.
    from transformers import CLIPTextModel, T5EncoderModel

    from default_model import components as C
    from default_model.train import encode_captions
    from meshdit.default_model import weights_path

    clip = CLIPTextModel.from_pretrained(weights_path(), subfolder="text_encoder")
    t5 = T5EncoderModel.from_pretrained(weights_path(), subfolder="text_encoder_2")
    natural = C.clip_tokenizer("natural"), C.t5_tokenizer("natural")
    joined = C.clip_tokenizer("joined"), C.t5_tokenizer("joined")
    assert clip.config.vocab_size == len(natural[0])  # the shipped encoders are the natural grammar's
    clip2, t52 = C.extend_text_encoders(clip, t5, *natural, *joined)
    rng = np.random.default_rng(5)
    captions = [K.sample_training_caption(rng)[1] for _ in range(40)] + [K.sample_mixed_caption(rng)[1] for _ in range(20)]
    before = encode_captions(clip, natural[0], t5, natural[1], captions)
    after = encode_captions(clip2, joined[0], t52, joined[1], captions)
    assert all(bool((a == b).all()) for a, b in zip(before, after))
    for word in ("and", "And", "AND"):
        assert len(joined[0](word, add_special_tokens=False).input_ids) == 1
        assert joined[1].convert_ids_to_tokens(joined[1](word, add_special_tokens=False).input_ids) == ["\u2581" + word]
    assert "and" in K.known_words("joined")["words"] and "and" not in K.known_words("natural")["words"]
    with pytest.raises(ValueError, match="need the joined grammar"):  # "circle on the left. square on the right"
        K.sample_mixed_caption(rng, joined=False, counted=False)


@pytest.mark.parametrize("prior", [None, 0.7])
def test_a_centre_prior_centres_most_position_less_single_shapes(prior):
    # Without a prior a caption that names no position shows each of the five places alike; with prior p
    # the centre with odds p, and the other four share the rest. Either way every place occurs.
    rng = np.random.default_rng(3)
    left_out = {p: 0 for p in D.POSITIONS}
    for _ in range(30000):
        scene = D.sample_scene(rng)
        if scene.count == 1 and D.parse_prompt(K.natural_caption(scene, rng, 0.3, prior)).position is None:
            left_out[scene.position] += 1
    share = {p: n / sum(left_out.values()) for p, n in left_out.items()}
    centre = 0.2 if prior is None else prior
    assert abs(share["center"] - centre) < 0.03, share
    assert all(abs(share[p] - (1 - centre) / 4) < 0.03 for p in D.POSITIONS if p != "center"), share
    with pytest.raises(ValueError, match="between 0 and 1"):
        K.position_drop("left", 1.0)
