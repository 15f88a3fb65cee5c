"""The bundled model's vocabulary.json is its caption grammar's words, and its tokenizer knows each one."""
import json

from meshdit.default_model import weights_path
from default_model import captions as K

WEIGHTS = weights_path()


def test_shipped_vocabulary_is_the_grammar_the_weights_were_trained_on():
    shipped = json.loads((WEIGHTS / "vocabulary.json").read_text())
    assert shipped["grammar"] in K.GRAMMARS
    assert shipped == K.known_words(shipped["grammar"])


def test_every_vocabulary_word_is_one_known_token_of_the_shipped_tokenizer():
    from transformers import AutoTokenizer

    shipped = json.loads((WEIGHTS / "vocabulary.json").read_text())
    t5 = AutoTokenizer.from_pretrained(WEIGHTS, subfolder="tokenizer_2")
    for word in shipped["words"]:
        tokens = t5.convert_ids_to_tokens(t5(word, add_special_tokens=False).input_ids)
        plural = ["\u2581" + word[:-1], "s"]  # the T5 pieces split a plural's "s" off
        assert tokens == ["\u2581" + word] or tokens == plural, (word, tokens)
