"""Qwen-Image-Edit's `processor` (transformers' Qwen2VLProcessor) without its video processor.

QwenImageEditPipeline calls its processor with text and images only (diffusers' pipeline_qwenimage_edit.py,
`_get_qwen_prompt_embeds`): the tokenizer and the image processor are all it uses. transformers 5 builds, saves and
loads a Qwen2VLProcessor only together with a video processor, whose class needs torchvision. Here one is built from
the other two (ProcessorMixin.__init__'s class check of every sub-processor skipped; the attributes it and
Qwen2VLProcessor.__init__ set, set the same way; __call__ is the real one), saved as the Hub's Qwen-Image-Edit
processor/ folder holds it (the tokenizer's files, the image processor's preprocessor_config.json, the chat template),
and loaded from such a folder with the image processor's PIL backend (the one transformers falls back to without
torchvision). Where torchvision is installed, the real Qwen2VLProcessor.from_pretrained loads the same folder: its
video processor then comes from preprocessor_config.json, as for the Hub checkpoints saved before video processors
had a file of their own.
"""
from __future__ import annotations

import functools
import os

PROCESSOR_CLASS = "Qwen2VLProcessor"
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # the file ProcessorMixin.save_pretrained writes a str template to


def image_only_processor(image_processor, tokenizer, chat_template=None):
    """A Qwen2VLProcessor of `image_processor` and `tokenizer`, its video_processor None (never called: the edit
    pipeline passes no videos); its save_pretrained writes what image_only_processor_from_folder reads back."""
    from transformers import Qwen2VLProcessor

    processor = Qwen2VLProcessor.__new__(Qwen2VLProcessor)
    processor.image_processor, processor.tokenizer = image_processor, tokenizer
    processor.video_processor, processor.chat_template = None, chat_template
    # as Qwen2VLProcessor.__init__ derives them from the tokenizer
    processor.image_token = getattr(tokenizer, "image_token", "<|image_pad|>")
    processor.video_token = getattr(tokenizer, "video_token", "<|video_pad|>")
    processor.image_token_id = getattr(tokenizer, "image_token_id", None) or \
        tokenizer.convert_tokens_to_ids(processor.image_token)
    processor.video_token_id = getattr(tokenizer, "video_token_id", None) or \
        tokenizer.convert_tokens_to_ids(processor.video_token)
    # diffusers' save_pretrained calls the component's save_pretrained; ProcessorMixin's would save the absent video
    # processor too (and fail on None)
    processor.save_pretrained = functools.partial(save_image_only_processor, processor)
    return processor


def save_image_only_processor(processor, save_directory: str, **kwargs) -> list[str]:
    """The files ProcessorMixin.save_pretrained writes, less the video processor's: the tokenizer's (marked with the
    processor class, as it marks them), the image processor's preprocessor_config.json, the chat template."""
    os.makedirs(save_directory, exist_ok=True)
    processor.tokenizer._set_processor_class(PROCESSOR_CLASS)
    files = list(processor.tokenizer.save_pretrained(save_directory))
    files += processor.image_processor.save_pretrained(save_directory)
    if isinstance(processor.chat_template, str):
        path = os.path.join(save_directory, CHAT_TEMPLATE_FILE)
        with open(path, "w", encoding="utf-8") as f:
            f.write(processor.chat_template)
        files.append(path)
    return files


def image_only_processor_from_folder(folder: str):
    """The processor of a processor/ folder (save_image_only_processor's, or the Hub's with or without a video
    processor config, which is not read): its tokenizer, its image processor on the PIL backend, its chat template
    (read by ProcessorMixin's own get_processor_dict)."""
    from transformers import AutoTokenizer, Qwen2VLImageProcessorPil, Qwen2VLProcessor

    processor_dict, _ = Qwen2VLProcessor.get_processor_dict(folder, local_files_only=True)
    return image_only_processor(Qwen2VLImageProcessorPil.from_pretrained(folder), AutoTokenizer.from_pretrained(folder),
                                processor_dict.get("chat_template"))
