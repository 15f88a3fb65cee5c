import numpy as np
import pytest

from default_model import dataset as D
from default_model import evaluate as E


def _gt(n, held_out=True):
    sizes = (192, 256, 320)
    return [D.sample(50_000 + i, size=sizes[i % 3], held_out=held_out) for i in range(n)]


def test_ground_truth_images_pass():
    samples = _gt(45)
    passed = [E.score_image(img, cap) for img, cap in samples]
    assert sum(passed) == len(passed), [E.mismatches(i, c) for (i, c), p in zip(samples, passed) if not p]


def test_float_and_uint8_inputs_agree():
    img, cap = D.sample(11)
    assert E.score_image(img, cap) and E.score_image(img.astype(np.float32) / 255.0, cap)


@pytest.mark.parametrize("attribute", E.ATTRIBUTES)
def test_wrong_prompts_fail(attribute):
    tried = 0
    for img, cap in _gt(30):
        wp = E.wrong_prompt(cap, attribute)
        if not wp:
            continue
        tried += 1
        assert not E.score_image(img, wp), (cap, wp)
    assert tried > 0


def test_blank_and_noise_images_fail():
    rng = np.random.default_rng(0)
    prompt = D.EVAL_PROMPTS[0]
    assert not E.score_image(np.ones((256, 256, 3)), prompt)
    assert not E.score_image(rng.random((256, 256, 3)), prompt)


def test_mild_blur_and_noise_still_pass():
    # generated images have soft edges and small colour noise
    from PIL import Image, ImageFilter

    rng = np.random.default_rng(1)
    for img, cap in _gt(12):
        soft = np.asarray(Image.fromarray(img).filter(ImageFilter.GaussianBlur(1.5))).astype(np.float32)
        soft = np.clip(soft + rng.normal(0, 8, soft.shape), 0, 255) / 255.0
        assert E.score_image(soft, cap), (cap, E.mismatches(soft, cap))


def test_several_seeds_print_the_pooled_score(monkeypatch, capsys):
    """--seed 0 1000: the prompts scored once per seed set, then the mean of the sets' scores."""
    import sys

    scores = {0: 50.0, 1000: 75.0}
    seen = []

    def fake_generate_and_score(model, steps, seed, *args, **kwargs):
        seen.append(seed)
        return scores[seed]

    monkeypatch.setattr(E, "generate_and_score", fake_generate_and_score)
    monkeypatch.setattr(sys, "argv", ["evaluate", "--seed", "0", "1000", "--quiet"])
    E.main()
    assert seen == [0, 1000]
    assert "pooled over 2 seed sets (50.0% / 75.0%): 62.5%" in capsys.readouterr().out


def test_one_seed_prints_no_pooled_score(monkeypatch, capsys):
    import sys

    monkeypatch.setattr(E, "generate_and_score", lambda *args, **kwargs: 50.0)
    monkeypatch.setattr(sys, "argv", ["evaluate", "--seed", "7"])
    E.main()
    assert "pooled" not in capsys.readouterr().out


def test_save_with_several_seeds_is_refused(monkeypatch, capsys):
    import sys

    monkeypatch.setattr(sys, "argv", ["evaluate", "--seed", "0", "1", "--save", "grid.png"])
    with pytest.raises(SystemExit):
        E.main()
    assert "give one --seed" in capsys.readouterr().err
