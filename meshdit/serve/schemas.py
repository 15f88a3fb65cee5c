"""The HTTP request bodies: OpenAI's image fields plus meshdit's extensions, strictly typed."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from ..lora_files import MAX_LORA_WEIGHT

MAX_PROMPT_CHARS = 2000  # longer prompts are refused before tokenizing; the tokenizer limit is checked after


class CacheBody(BaseModel):
    """The request's step cache: GenerateRequest.cache (meshdit.cache.CacheSettings), field for field."""

    model_config = ConfigDict(extra="forbid")

    method: Literal["fast", "fbcache", "dbcache"]  # meshdit.cache_settings.CHOICES
    threshold: StrictFloat | StrictInt | None = None
    front_blocks: StrictInt | None = None
    back_blocks: StrictInt | None = None
    warmup: StrictInt | None = None
    max_cached: StrictInt | None = None
    compute_steps: list[StrictInt] = Field(default_factory=list, max_length=1000)
    taylorseer: Literal[1, 2] | None = None


class LoraChoice(BaseModel):
    """One adapter of the server's --lora-dir, by name, and its weight."""

    model_config = ConfigDict(extra="forbid")

    name: StrictStr = Field(min_length=1, max_length=200)
    weight: StrictFloat | StrictInt = Field(default=1.0, ge=-MAX_LORA_WEIGHT, le=MAX_LORA_WEIGHT)


class PerRequestSettings(BaseModel):
    """What `meshdit generate` takes per request beyond OpenAI's fields, under the same names (GenerateRequest's);
    unset: the server's flag, else the model's default. Checked by request.resolve_request against the model and
    the server's layout (a 400 naming the field)."""

    cache: CacheBody | None = None  # step caching (docs/caching.md); none: every block at every step
    loras: list[LoraChoice] = Field(default_factory=list, max_length=16)  # adapters of --lora-dir, by name
    loras_2: list[LoraChoice] = Field(default_factory=list, max_length=16)  # Wan 2.2's second expert: --lora-2-dir
    extra: dict[str, Any] | None = None  # generate's --extra KEY=JSON (and max_sequence_length), the family's keys
    warmup_steps: StrictInt | None = Field(default=None, ge=1)  # PipeFusion's, as generate's flags
    num_pipeline_patch: StrictInt | None = Field(default=None, ge=1)
    kv_drift_correction: StrictBool | None = None


    def dimensions(self, default: tuple[int, int]) -> tuple[int, int]:
        """(height, width) of the body's `size` "WxH" (ImageRequest's and VideoRequest's)."""
        if getattr(self, "size", None) is None:
            return default
        width, height = (int(v) for v in self.size.split("x"))
        return height, width


PER_REQUEST_FIELDS = ("extra", "warmup_steps", "num_pipeline_patch", "kv_drift_correction")
"""PerRequestSettings' fields that are GenerateRequest's under the same name (cache and loras are translated)."""


class ImageRequest(PerRequestSettings):
    """POST /v1/images/generations, /v1/images/edits and /v1/images/jobs (JSON, or multipart/form-data)."""

    model_config = ConfigDict(extra="forbid")

    prompt: StrictStr = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    model: StrictStr | None = None  # accepted for the openai client; the server has one model
    n: StrictInt = Field(default=1, ge=1)
    size: StrictStr | None = Field(default=None, pattern=r"^\d{1,5}x\d{1,5}$", description="WxH, e.g. 256x256")
    response_format: Literal["b64_json"] = "b64_json"
    user: StrictStr | None = None  # OpenAI's end-user id: accepted, unused
    # meshdit's extensions
    steps: StrictInt | None = Field(default=None, ge=1, le=1000)
    seed: StrictInt = Field(default=0, ge=0, le=2**63 - 1)
    guidance_scale: StrictFloat | StrictInt | None = Field(default=None, ge=0, le=100)
    negative_prompt: StrictStr | None = Field(default=None, max_length=MAX_PROMPT_CHARS)
    # the input image of an edit model: base64 (or a data: URL); a multipart upload arrives here base64-encoded
    image: StrictStr | None = None



class ImageReference(BaseModel):
    """OpenAI's reference object for `input_reference`: an image as a data: URL (a file id or a remote URL is
    refused: this server fetches nothing)."""

    model_config = ConfigDict(extra="forbid")

    image_url: StrictStr | None = None
    file_id: StrictStr | None = None


class VideoRequest(PerRequestSettings):
    """POST /v1/videos (JSON, or multipart/form-data as OpenAI's client sends it): OpenAI's video fields plus
    meshdit's extensions, those of ImageRequest where they mean the same."""

    model_config = ConfigDict(extra="forbid")

    prompt: StrictStr = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    model: StrictStr | None = None  # accepted for the openai client; the server has one model
    seconds: StrictStr | StrictInt | StrictFloat | None = None  # OpenAI sends "4": the clip's length, > 0
    size: StrictStr | None = Field(default=None, pattern=r"^\d{1,5}x\d{1,5}$", description="WxH, e.g. 832x480")
    # the first frame of an image-to-video model: base64, a data: URL, or OpenAI's {"image_url": "data:..."};
    # a multipart upload arrives here base64-encoded
    input_reference: StrictStr | ImageReference | None = None
    user: StrictStr | None = None  # OpenAI's end-user id: accepted, unused
    # meshdit's extensions
    num_frames: StrictInt | None = Field(default=None, ge=1)  # instead of seconds
    fps: StrictInt | None = Field(default=None, ge=1, le=240)
    steps: StrictInt | None = Field(default=None, ge=1, le=1000)
    seed: StrictInt = Field(default=0, ge=0, le=2**63 - 1)
    guidance_scale: StrictFloat | StrictInt | None = Field(default=None, ge=0, le=100)
    negative_prompt: StrictStr | None = Field(default=None, max_length=MAX_PROMPT_CHARS)
