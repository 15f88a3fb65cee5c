"""The nodes: Settings and LoRA feed the generation nodes, which send one request to `meshdit serve` and
return its result as ComfyUI's types (IMAGE [B, H, W, 3] float 0..1; a video as its frames, the MP4's path,
its frame rate and its audio)."""
from __future__ import annotations

import os

from . import comfy_hooks
from .client import DEFAULT_URL, Client, MeshditError
from .jobs import IMAGES, VIDEOS, JobRun
from .tensors import batch, image_to_png, mask_to_png, mp4_frames, png_to_image

CATEGORY = "meshdit"
CACHE_PRESETS = ["none", "fast", "fbcache", "dbcache"]  # serve's `cache.method` (docs/caching.md)
MAX_SEED = 2**63 - 1  # the server's limit
PROMPT = ("STRING", {"multiline": True, "default": "", "tooltip": "what to draw"})
SETTINGS = ("MESHDIT_SETTINGS", {"tooltip": "a meshdit Settings node: the server and the request's settings"})
LORAS = ("MESHDIT_LORAS", {"tooltip": "meshdit LoRA nodes, chained"})


class MeshditSettings:
    """The server and what every request from the nodes it feeds shares. 0 (or a negative guidance) leaves a
    value to the server's default, which is the model's (`meshdit serve --height/--width/--steps` change it)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "server_url": ("STRING", {"default": DEFAULT_URL, "tooltip": "where `meshdit serve` listens"}),
            "api_key": ("STRING", {"default": "", "tooltip": "the server's --api-key; empty: the MESHDIT_API_KEY "
                                                             "environment variable of ComfyUI, else none"}),
            "seed": ("INT", {"default": 0, "min": 0, "max": MAX_SEED}),
            "width": ("INT", {"default": 0, "min": 0, "max": 8192, "step": 16, "tooltip": "0: the server's"}),
            "height": ("INT", {"default": 0, "min": 0, "max": 8192, "step": 16, "tooltip": "0: the server's"}),
            "steps": ("INT", {"default": 0, "min": 0, "max": 1000, "tooltip": "0: the server's"}),
            "guidance": ("FLOAT", {"default": -1.0, "min": -1.0, "max": 100.0, "step": 0.1,
                                   "tooltip": "guidance_scale; below 0: the server's"}),
            "cache": (CACHE_PRESETS, {"default": "none", "tooltip": "step cache preset (lossy; fast: about 2x)"}),
            "negative_prompt": ("STRING", {"multiline": True, "default": "",
                                           "tooltip": "empty: none (only models with CFG use one)"}),
        }}

    RETURN_TYPES = ("MESHDIT_SETTINGS",)
    RETURN_NAMES = ("settings",)
    FUNCTION = "settings"
    CATEGORY = CATEGORY

    def settings(self, server_url, api_key, seed, width, height, steps, guidance, cache, negative_prompt):
        if (width == 0) != (height == 0):
            raise MeshditError(f"width {width}, height {height}: give both, or both 0 for the server's size")
        return ({"server_url": server_url, "api_key": api_key, "seed": seed, "width": width, "height": height,
                 "steps": steps, "guidance": guidance, "cache": cache, "negative_prompt": negative_prompt},)


def lora_names() -> list[str] | None:
    """The adapters of the server at $MESHDIT_URL (what a request's `loras` may name), or None if none answers.
    INPUT_TYPES has no node's inputs, so the list comes from the environment of the ComfyUI process."""
    client = Client(os.environ.get("MESHDIT_URL", DEFAULT_URL), os.environ.get("MESHDIT_API_KEY", ""), timeout=3)
    try:
        return client.model_ids()[1]
    except MeshditError:
        return None


class MeshditLora:
    """One LoRA adapter of the server's --lora-dir, by name, and its weight; chain them through `loras`."""

    @classmethod
    def INPUT_TYPES(cls):
        names = lora_names()
        if names:
            name = (names, {})
        else:  # a free name, which the server checks when the graph runs
            why = "no server answered at $MESHDIT_URL to list its adapters" if names is None else \
                "the server at $MESHDIT_URL has no adapters (meshdit serve --lora-dir)"
            name = ("STRING", {"default": "", "tooltip": f"{why}: type the adapter's name"})
        return {"required": {"lora_name": name,
                             "strength": ("FLOAT", {"default": 1.0, "min": -100.0, "max": 100.0, "step": 0.05})},
                "optional": {"loras": LORAS}}

    RETURN_TYPES = ("MESHDIT_LORAS",)
    RETURN_NAMES = ("loras",)
    FUNCTION = "choose"
    CATEGORY = CATEGORY

    def choose(self, lora_name, strength, loras=None):
        return ([*(loras or []), {"name": lora_name, "weight": strength}],)


def client_of(settings: dict) -> Client:
    return Client(settings["server_url"], settings["api_key"] or os.environ.get("MESHDIT_API_KEY", ""))


def request_body(settings: dict, prompt: str, loras) -> dict:
    """The request's JSON fields (serve's names); unset values are left out so the server's defaults apply."""
    body = {"prompt": prompt, "seed": settings["seed"]}
    if settings["width"] and settings["height"]:
        body["size"] = f"{settings['width']}x{settings['height']}"
    if settings["steps"]:
        body["steps"] = settings["steps"]
    if settings["guidance"] >= 0:
        body["guidance_scale"] = settings["guidance"]
    if settings["cache"] != "none":
        body["cache"] = {"method": settings["cache"]}
    if settings["negative_prompt"].strip():
        body["negative_prompt"] = settings["negative_prompt"]
    if loras:
        body["loras"] = list(loras)
    return body


class _ImageNode:
    RETURN_TYPES = ("IMAGE",)
    RETURN_NAMES = ("images",)
    FUNCTION = "generate"
    CATEGORY = CATEGORY

    def run_job(self, settings: dict, body: dict, files: dict | None = None):
        """Runs one image job; returns its images [n, H, W, 3]."""
        client = client_of(settings)
        self.job = JobRun(client, IMAGES)  # kept for a look at the server's side (tests)
        status = self.job.run(body, files)
        pngs = [client.call("GET", f"/v1/images/jobs/{self.job.id}/content?index={i}")[0]
                for i in range(int(status.get("n", 1)))]
        return batch(png_to_image(png) for png in pngs)


class MeshditTextToImage(_ImageNode):
    """Text to image on the served model; the same image `meshdit generate` draws with the same settings."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"settings": SETTINGS, "prompt": PROMPT,
                             "batch_size": ("INT", {"default": 1, "min": 1, "max": 64, "tooltip": "images (n)"})},
                "optional": {"loras": LORAS}}

    def generate(self, settings, prompt, batch_size, loras=None):
        return (self.run_job(settings, dict(request_body(settings, prompt, loras), n=batch_size)),)


class MeshditImageEdit(_ImageNode):
    """An image-edit model (FLUX.1 Kontext, Qwen-Image-Edit) changes each input image as the prompt says. The
    mask is sent as OpenAI's edit mask (transparent: change); a server that cannot use one says so."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"settings": SETTINGS, "image": ("IMAGE",), "prompt": PROMPT},
                "optional": {"mask": ("MASK",), "loras": LORAS}}

    def generate(self, settings, image, prompt, mask=None, loras=None):
        body = request_body(settings, prompt, loras)
        outputs = []
        for index in range(image.shape[0]):  # one job per input image: a request takes one
            files = {"image": ("image.png", image_to_png(image[index]), "image/png")}
            if mask is not None:
                masks = mask if mask.dim() == 3 else mask[None]  # [B, H, W]
                files["mask"] = ("mask.png", mask_to_png(masks[min(index, masks.shape[0] - 1)]), "image/png")
            outputs.append(self.run_job(settings, body, files))
        return (batch(outputs),)


class _VideoNode:
    RETURN_TYPES = ("IMAGE", "STRING", "FLOAT", "AUDIO")
    RETURN_NAMES = ("frames", "mp4_path", "fps", "audio")
    FUNCTION = "generate"
    CATEGORY = CATEGORY

    @staticmethod
    def video_inputs() -> dict:
        return {"frames": ("INT", {"default": 0, "min": 0, "max": 1024, "tooltip": "0: the server's"}),
                "fps": ("INT", {"default": 0, "min": 0, "max": 240, "tooltip": "0: the server's (the model's)"}),
                "filename_prefix": ("STRING", {"default": "meshdit/video"})}

    def run_video(self, settings, prompt, frames, fps, filename_prefix, loras, image=None):
        client = client_of(settings)
        body = request_body(settings, prompt, loras)
        if frames:
            body["num_frames"] = frames  # meshdit's field; OpenAI's `seconds` is rounded to the VAE's frame count
        if fps:
            body["fps"] = fps
        files = None
        if image is not None:  # OpenAI's Videos API: the first frame as the `input_reference` upload
            files = {"input_reference": ("first_frame.png", image_to_png(image[0]), "image/png")}
        self.job = JobRun(client, VIDEOS)
        self.job.run(body, files)
        mp4, _ = client.call("GET", f"/v1/videos/{self.job.id}/content")
        path = save_mp4(mp4, filename_prefix, self.job.id)
        pixels, fps, audio = mp4_frames(path)
        return (pixels, path, fps, audio)


def save_mp4(data: bytes, prefix: str, job_id: str) -> str:
    """Writes the server's MP4 under ComfyUI's output folder (prefix may name a subfolder); returns its path.
    Written to a temporary name first, so an interrupted write leaves no truncated file at the path."""
    root = os.path.realpath(comfy_hooks.output_directory())
    path = os.path.realpath(os.path.join(root, f"{prefix}_{job_id}.mp4"))
    if os.path.commonpath([root, path]) != root:
        raise MeshditError(f"filename_prefix {prefix!r} leads outside ComfyUI's output folder")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".part", "wb") as f:
        f.write(data)
    os.replace(path + ".part", path)
    return path


class MeshditTextToVideo(_VideoNode):
    """Text to video on a served video model (Wan, LTX-Video, ...)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"settings": SETTINGS, "prompt": PROMPT, **cls.video_inputs()},
                "optional": {"loras": LORAS}}

    def generate(self, settings, prompt, frames, fps, filename_prefix, loras=None):
        return self.run_video(settings, prompt, frames, fps, filename_prefix, loras)


class MeshditImageToVideo(_VideoNode):
    """Image to video: the image is the first frame (an image-to-video model such as Wan 2.1 I2V)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"settings": SETTINGS, "image": ("IMAGE",), "prompt": PROMPT, **cls.video_inputs()},
                "optional": {"loras": LORAS}}

    def generate(self, settings, image, prompt, frames, fps, filename_prefix, loras=None):
        return self.run_video(settings, prompt, frames, fps, filename_prefix, loras, image=image)
