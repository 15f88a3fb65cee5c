import numpy as np

from default_model import dataset as D


def test_same_seed_same_image_and_caption():
    for seed in (0, 7, 123456):
        a, ca = D.sample(seed)
        b, cb = D.sample(seed)
        assert ca == cb
        assert a.dtype == np.uint8 and a.shape == (256, 256, 3)
        np.testing.assert_array_equal(a, b)


def test_different_seeds_differ():
    imgs = [D.sample(s)[0] for s in range(8)]
    assert len({im.tobytes() for im in imgs}) == 8


def test_other_sizes():
    for size in (128, 192, 320):
        img, _ = D.sample(3, size=size)
        assert img.shape == (size, size, 3)


def test_training_split_never_shows_held_out_pairs():
    for seed in range(400):
        s = D.sample_scene(np.random.default_rng([seed, 1]))
        assert (s.colour, s.shape) not in D.HELD_OUT_PAIRS
    assert all((s.colour, s.shape) not in D.HELD_OUT_PAIRS for s in D.all_scenes(held_out=False))


def test_eval_prompts_are_fixed_held_out_and_parse():
    assert len(D.EVAL_PROMPTS) >= 50
    assert len(set(D.EVAL_PROMPTS)) == len(D.EVAL_PROMPTS)
    train_captions = {s.caption for s in D.all_scenes(held_out=False)}
    for p in D.EVAL_PROMPTS:
        s = D.parse_prompt(p)
        assert (s.colour, s.shape) in D.HELD_OUT_PAIRS
        assert s.caption == p and p not in train_captions
    # every held-out pair, count and position is covered
    parsed = [D.parse_prompt(p) for p in D.EVAL_PROMPTS]
    assert {(s.colour, s.shape) for s in parsed} == set(D.HELD_OUT_PAIRS)
    assert {s.count for s in parsed} == {1, 2, 3}
    assert {s.position for s in parsed} == set(D.POSITIONS) | {None}


def test_caption_words_are_in_vocabulary():
    vocab = set(D.vocabulary())
    for s in D.all_scenes(held_out=False)[:50] + D.all_scenes(held_out=True):
        for w in s.caption.split():
            assert w in vocab or (w.endswith("s") and w[:-1] in vocab)


def test_clip_tokenizer_is_deterministic_across_processes():
    import os
    import subprocess
    import sys

    code = (
        "from default_model.components import clip_tokenizer;"
        "t = clip_tokenizer(); print(t('three pink diamonds at the top on a gray background').input_ids, len(t))"
    )
    outs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONHASHSEED": seed}).stdout
        for seed in ("1", "2")
    }
    assert len(outs) == 1, outs


def test_mixed_scenes_show_two_different_trained_pairs_in_their_places():
    from default_model import evaluate as E

    rng, side_by_side = np.random.default_rng(0), set()
    for i in range(300):
        scenes = D.sample_mixed_scene(rng)
        assert len(scenes) == 2 and scenes[0].background == scenes[1].background
        assert all(s.count == 1 and (s.colour, s.shape) in D.TRAIN_PAIRS for s in scenes)
        assert (scenes[0].colour, scenes[0].shape) != (scenes[1].colour, scenes[1].shape)
        assert tuple(s.position for s in scenes) in D.MIXED_PLACES
        side_by_side |= {(a.colour, b.shape) for a, b in (scenes, scenes[::-1])}
        if i < 20:
            img = D.render_mixed(scenes, size=256, seed=i)
            for s in scenes:  # each shape in its own colour at its own slot
                x, y = D.SLOTS[s.position][0]
                assert tuple(img[int(y * 256), int(x * 256)]) == D.COLOURS[s.colour]
            assert E.analyse(img).count == 2
    # a held-out pair's colour beside its shape (a yellow circle beside a red square), never as one shape
    assert set(D.HELD_OUT_PAIRS) <= side_by_side
