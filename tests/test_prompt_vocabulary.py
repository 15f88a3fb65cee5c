"""The unknown-word warning: `meshdit generate` names words the bundled model never saw, once, before the
ranks start, and still makes the image; Engine.generate warns API users the same way."""
import json
import warnings

import pytest
from PIL import Image

from meshdit.cli import main
from meshdit.default_model import weights_path
from meshdit.prompt_vocabulary import PromptVocabulary, UnknownWordsWarning, unknown_words_warning

BUNDLED = str(weights_path())
SMALL = ["--steps", "1", "--height", "64", "--width", "64"]


def test_cli_warns_once_for_a_cat_and_still_makes_the_image(tmp_path, capfd):
    out = tmp_path / "cat.png"
    assert main(["generate", "--prompt", "a cat", "--prompt", "a red cat", *SMALL, "--output",
                 str(tmp_path / "cat-{i}.png")]) == 0
    err = capfd.readouterr().err
    assert err.count("warning") == 1, err
    assert 'never saw the word(s) "cat" in training' in err
    for kind in ("colours: red, orange", "shapes: circle, square", "counts: one, two, three",
                 "positions: on the left", "backgrounds: on a white background"):
        assert kind in err
    assert Image.open(tmp_path / "cat-0.png").size == (64, 64) and not out.exists()


def test_cli_is_silent_for_a_grammar_prompt(tmp_path, capfd):
    assert main(["generate", "--prompt", "two red circles on a white background", *SMALL, "--output",
                 str(tmp_path / "ok.png")]) == 0
    assert "warning" not in capfd.readouterr().err
    assert (tmp_path / "ok.png").exists()


def test_engine_warns_api_users_once_per_word():
    from meshdit import Engine
    from meshdit.config import GenerateRequest

    engine = Engine.from_pretrained()
    request = GenerateRequest(prompt=["a cat"], num_inference_steps=1, height=64, width=64)
    with pytest.warns(UnknownWordsWarning, match='"cat"'):
        assert engine.generate(request).images.shape == (1, 64, 64, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnknownWordsWarning)
        engine.generate(request)  # "cat" was already reported
    engine.close()


def test_words_are_checked_without_case_or_punctuation_and_digits_need_the_grammar(tmp_path):
    from default_model import captions

    for grammar in captions.GRAMMARS:
        (tmp_path / grammar).mkdir()
        (tmp_path / grammar / "vocabulary.json").write_text(json.dumps(captions.known_words(grammar)))
    fixed = PromptVocabulary.of_model(str(tmp_path / "fixed"))
    assert fixed.unknown_words(["Two RED circles, on a white background!", "A cat; 2 dogs"]) == ["cat", "2", "dogs"]
    assert fixed.needs_plain_text(["Two red circles"]) and not fixed.needs_plain_text(["two red circles"])
    natural = PromptVocabulary.of_model(str(tmp_path / "natural"))
    assert natural.unknown_words(["On a black background, 3 YELLOW triangles.", "an orange circle"]) == []
    assert natural.warning(["A single red circle."]) is None
    assert not natural.needs_plain_text(["Two red circles"])
    assert unknown_words_warning(str(tmp_path / "elsewhere"), ["a cat"]) is None  # no vocabulary.json: no check


def test_the_bundled_model_reads_natural_phrasing():
    bundled = PromptVocabulary.of_model(BUNDLED)
    assert bundled.unknown_words(["A blue square.", "a red circle", "On a black background, 3 yellow triangles",
                                  "a cat"]) == ["cat"]


def test_words_of_other_scripts_and_accents_are_named_whole():
    """Chinese runs and accented words are words: named as written (lower case), never cut at the accent."""
    bundled = PromptVocabulary.of_model(BUNDLED)
    decomposed = "carre\u0301s"  # "carrés" typed as e + combining acute accent
    assert bundled.unknown_words(["deux carrés rouges", "一只红色的猫，在白色背景上", f"two {decomposed}"]) == [
        "deux", "carrés", "rouges", "一只红色的猫", "在白色背景上"]
    note = bundled.warning(["一只红色的猫"])
    assert note is not None and '"一只红色的猫"' in note


def test_a_prompt_without_any_known_word_is_said_so():
    bundled = PromptVocabulary.of_model(BUNDLED)
    note = bundled.warning(["deux carrés rouges", "two red squares", "🙂"])
    assert 'It knows no word at all of the prompt(s) "deux carrés rouges", "🙂"' in note
    assert "two red squares\"" not in note.split("It knows no word")[1].split(":")[0]
    assert "no word at all" not in bundled.warning(["a cat and two red squares"])
    assert bundled.warning(["two red squares"]) is None
