"""The unknown-word warning: a prompt's words that the model never saw in training.

A model folder may ship `vocabulary.json` (the bundled model does: written from its caption grammar by
`default_model/captions.known_words`). It lists every word the training captions used and what they say
by kind (colours, shapes, counts, positions, backgrounds). A model reads an unknown word as noise, so
the image is still made, but the user is told once which words were not understood and what would be.
Plain data, no torch: `meshdit generate` checks before any rank starts.
"""
from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

VOCABULARY_FILE = "vocabulary.json"
KINDS = ("colours", "shapes", "counts", "positions", "backgrounds")


class UnknownWordsWarning(UserWarning):
    """A prompt has words the model never saw in training (Engine.generate; the image is still made)."""


def prompt_words(prompt: str) -> list[str]:
    """Lower-case words and numbers in any script ("carrés" is one word, however its accent was typed); case and
    punctuation are not words. Scripts written without spaces (Chinese, Japanese) give one word per run between
    spaces or punctuation: no dictionary cuts them further."""
    return re.findall(r"[^\W_]+", unicodedata.normalize("NFC", prompt).lower())


@dataclass(frozen=True)
class PromptVocabulary:
    words: frozenset[str]  # every word the training captions used, lower case (plurals included)
    kinds: dict[str, list[str]]  # KINDS -> how the captions say them
    example: str = ""
    reads_case_and_punctuation: bool = True  # False: upper case and punctuation reach the model as unknown tokens

    @classmethod
    def of_model(cls, model: str) -> "PromptVocabulary | None":
        """The vocabulary a local model folder ships, or None (a Hub id, or a folder without the file)."""
        path = Path(model) / VOCABULARY_FILE
        if not path.is_file():
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
        return cls(frozenset(w.lower() for w in data["words"]), {k: list(data.get(k, [])) for k in KINDS},
                   data.get("example", ""), bool(data.get("reads_case_and_punctuation", True)))

    def unknown_words(self, prompts: list[str]) -> list[str]:
        """The prompts' words this model never saw, each once, in order of appearance."""
        return list(dict.fromkeys(w for p in prompts for w in prompt_words(p) if w not in self.words))

    def prompts_without_known_words(self, prompts: list[str]) -> list[str]:
        """The prompts of which this model knows no word at all (e.g. in another language or script)."""
        return [p for p in prompts if not any(w in self.words for w in prompt_words(p))]

    def needs_plain_text(self, prompts: list[str]) -> bool:
        """Whether a prompt has upper case or punctuation that this model cannot read."""
        return not self.reads_case_and_punctuation and any(re.search(r"[A-Z]|[^\w\s]", p) for p in prompts)

    def message(self, unknown: list[str], plain_text: bool = False, without_known_words: list[str] = ()) -> str:
        lines = []
        if unknown:
            lines.append("this model never saw the word(s) " + ", ".join(f'"{w}"' for w in unknown)
                         + " in training; it reads them as noise (the image is still made).")
        if without_known_words:
            lines.append("It knows no word at all of the prompt(s) " + ", ".join(f'"{p}"' for p in without_known_words)
                         + ": their images will not follow them.")
        if plain_text:
            lines.append("this model reads lower-case words without punctuation: upper case and punctuation "
                         "reach it as unknown tokens.")
        lines.append("It knows " + "; ".join(f"{k}: {', '.join(v)}" for k, v in self.kinds.items() if v) + ".")
        if self.example:
            lines.append(f'For example: "{self.example}".')
        return " ".join(lines)

    def warning(self, prompts: list[str]) -> str | None:
        """The warning for these prompts, or None when the model knows every word."""
        unknown, plain = self.unknown_words(prompts), self.needs_plain_text(prompts)
        lost = self.prompts_without_known_words(prompts)
        return self.message(unknown, plain, lost) if unknown or plain or lost else None


def unknown_words_warning(model: str, prompts: list[str]) -> str | None:
    """The warning `meshdit generate` prints for `model` (a folder) and these prompts, or None."""
    vocabulary = PromptVocabulary.of_model(model)
    return vocabulary.warning(prompts) if vocabulary is not None else None
