"""Qwen-Image-Edit's processor without a video processor (models/qwen_vl_processor.py): saved with the pipeline,
loaded back (meshdit's way without torchvision, and transformers' own Qwen2VLProcessor.from_pretrained given a video
processor, as torchvision would make it), it encodes the edit pipeline's text and image as the tiny builder's does."""
import json
from pathlib import Path

import pytest
import torch

from meshdit.loading.processors import processor_substitutes
from meshdit.models.qwen_vl_processor import image_only_processor, image_only_processor_from_folder
from meshdit.models.tiny.parts import sample_image
from meshdit.testing.tiny_models import tiny_pipeline


@pytest.fixture(scope="module")
def saved(tiny_folder):
    return tiny_pipeline("qwenimage-edit"), Path(tiny_folder("qwenimage-edit"))


def _encoded(processor, pipe):
    """What the edit pipeline's _get_qwen_prompt_embeds asks of its processor: two prompts of two lengths, each with
    an image of its own size."""
    text = [pipe.prompt_template_encode.format(p) for p in ("a red cat", "a blue square on a cat")]
    return processor(text=text, images=[sample_image(), sample_image(40, 56)], padding=True, return_tensors="pt")


def _assert_same_encoding(loaded, pipe):
    expected, got = _encoded(pipe.processor, pipe), _encoded(loaded, pipe)
    assert set(got) == set(expected) and {"input_ids", "pixel_values", "image_grid_thw"} <= set(got)
    for key in expected:
        assert torch.equal(got[key], expected[key]), key


def test_saved_processor_folder_holds_the_hub_layout(saved):
    """The files a Qwen2VLProcessor.from_pretrained reads: tokenizer marked with the processor class, the image
    processor's preprocessor_config.json under the name transformers infers the video processor from."""
    _, folder = saved
    processor = folder / "processor"
    assert json.loads((folder / "model_index.json").read_text())["processor"] == ["transformers", "Qwen2VLProcessor"]
    assert json.loads((processor / "tokenizer_config.json").read_text())["processor_class"] == "Qwen2VLProcessor"
    assert json.loads((processor / "preprocessor_config.json").read_text())["image_processor_type"] == \
        "Qwen2VLImageProcessor"
    from transformers.video_processing_utils import BaseVideoProcessor

    # with torchvision, AutoVideoProcessor reads this dict and infers Qwen2VLVideoProcessor from its type
    video_config, _ = BaseVideoProcessor.get_video_processor_dict(str(processor))
    assert video_config["image_processor_type"] == "Qwen2VLImageProcessor"


def test_processor_loaded_without_a_video_processor_encodes_as_the_builders(saved):
    pipe, folder = saved
    loaded = image_only_processor_from_folder(str(folder / "processor"))
    assert loaded.video_processor is None and loaded.image_token_id == pipe.processor.image_token_id
    _assert_same_encoding(loaded, pipe)


def test_transformers_own_loader_reads_the_same_folder(saved, monkeypatch):
    """Qwen2VLProcessor.from_pretrained given a video processor (what it loads itself where torchvision is): the class
    check of that stand-in, which needs torchvision, is the only thing patched."""
    from transformers import Qwen2VLProcessor
    from transformers.utils import PushToHubMixin

    class VideoProcessorStandIn(PushToHubMixin):
        def to_dict(self):
            return {}

    check = Qwen2VLProcessor.check_argument_for_proper_class
    monkeypatch.setattr(Qwen2VLProcessor, "check_argument_for_proper_class",
                        lambda self, name, arg: None if name == "video_processor" else check(self, name, arg))
    pipe, folder = saved
    stand_in = VideoProcessorStandIn()
    loaded = Qwen2VLProcessor.from_pretrained(str(folder / "processor"), video_processor=stand_in)
    assert loaded.video_processor is stand_in
    _assert_same_encoding(loaded, pipe)


def test_chat_template_is_saved_and_loaded_back(tmp_path):
    pipe = tiny_pipeline("qwenimage-edit")
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    image_only_processor(pipe.processor.image_processor, pipe.processor.tokenizer, template).save_pretrained(tmp_path)
    assert image_only_processor_from_folder(str(tmp_path)).chat_template == template


def test_loading_substitutes_the_processor_only_without_torchvision(saved, tiny_folder, monkeypatch):
    import transformers.utils

    pipe, folder = saved
    assert processor_substitutes(tiny_folder("qwenimage")) == {}  # text-to-image: no processor
    monkeypatch.setattr(transformers.utils, "is_torchvision_available", lambda: False)
    substitutes = processor_substitutes(str(folder))
    assert list(substitutes) == ["processor"] and substitutes["processor"].video_processor is None
    _assert_same_encoding(substitutes["processor"], pipe)
    monkeypatch.setattr(transformers.utils, "is_torchvision_available", lambda: True)
    assert processor_substitutes(str(folder)) == {}  # from_pretrained loads the real one itself
