"""serve takes every per-request setting `meshdit generate` takes: LoRA for both of Wan 2.2's experts (`loras` over
--lora-dir, `loras_2` over --lora-2-dir), `extra`, the step cache and PipeFusion's settings, each request's MP4
equal to `meshdit generate`'s for the same request byte for byte (tiny Wan 2.2 under PipeFusion 2); a setting the
model or layout refuses is a 400 naming its field (request.resolve_request's RequestFieldError)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from meshdit.testing.serve_process import REPO, Server
from meshdit.testing.tiny_lora import save_tiny_lora
from meshdit.testing.tiny_models import tiny_pipeline

PROMPT = "a red cat walks"
# 2 steps: t = 1000 on the first expert, then the second (the tiny pair's boundary 0.9)
FLAGS = ["--pipefusion-parallel-degree", "2", "--height", "64", "--width", "48", "--steps", "2", "--num-frames", "5",
         "--guidance-scale", "1", "--max-sequence-length", "16"]
# a served body's settings -> the same request as generate's flags ({dir} is the adapters' folder)
CASES = {
    "loras-both-experts-patches": (
        {"loras": [{"name": "ink", "weight": 0.7}], "loras_2": [{"name": "neon", "weight": 0.6}],
         "num_pipeline_patch": 4, "kv_drift_correction": False},
        ["--lora", "{dir}/first/ink.safetensors:0.7", "--lora-2", "{dir}/second/neon.safetensors:0.6",
         "--num-pipeline-patch", "4", "--no-kv-drift-correction"]),
    "extra-cache-warmup": (
        {"extra": {"max_sequence_length": 12}, "cache": {"method": "fbcache", "threshold": 0.5}, "warmup_steps": 2},
        ["--max-sequence-length", "12", "--cache", "fbcache", "--cache-threshold", "0.5", "--warmup-steps", "2"]),
}


def wait(server, video_id, timeout=180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        video = server.client.get(f"/v1/videos/{video_id}").json()
        if video["status"] in ("completed", "failed"):
            return video
        time.sleep(0.05)
    raise TimeoutError(video)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("per-request")
    tiny_pipeline("wan22").save_pretrained(folder / "model")
    for expert, name, seed in (("first", "ink", 1), ("second", "neon", 2)):
        (folder / expert).mkdir()
        save_tiny_lora("wan22", str(folder / expert / f"{name}.safetensors"), seed=seed)
    server = Server(folder, "--model", str(folder / "model"), "--lora-dir", str(folder / "first"),
                    "--lora-2-dir", str(folder / "second"), *FLAGS)
    generated = {}
    try:
        for case, (_, flags) in CASES.items():
            output = folder / f"{case}.mp4"
            subprocess.run([sys.executable, "-m", "meshdit", "generate", "--model", str(folder / "model"), *FLAGS,
                            *[f.format(dir=folder) for f in flags], "--seed", "3", "--prompt", PROMPT,
                            "--output", str(output)], cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                           check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
            generated[case] = output.read_bytes()
        yield server.wait_ready(), generated
    finally:
        server.stop()


def test_each_per_request_setting_equals_meshdit_generate(setup):
    server, generated = setup
    ids = {}
    for case, (body, _) in CASES.items():
        r = server.client.post("/v1/videos", json={"prompt": PROMPT, "seed": 3, **body})
        assert r.status_code == 200, r.text
        ids[case] = r.json()["id"]
    assert generated["loras-both-experts-patches"] != generated["extra-cache-warmup"]
    for case, video_id in ids.items():
        assert wait(server, video_id)["status"] == "completed", case
        assert server.client.get(f"/v1/videos/{video_id}/content").content == generated[case], case


@pytest.mark.parametrize("body, field", [
    ({"num_pipeline_patch": 64}, "num_pipeline_patch"),  # more patches than the layout's token rows
    ({"cache": {"method": "fbcache"}}, "cache"),  # under PipeFusion only with full warmup
    ({"extra": {"bogus": 1}}, "extra"),  # not one of the family's call arguments
    ({"loras_2": [{"name": "ink"}]}, "loras_2"),  # an adapter of --lora-dir, not --lora-2-dir
    ({"loras": [{"name": "neon", "weight": 0.5}]}, "loras"),
    ({"size": "50x64"}, "size"),
    ({"num_frames": 6}, "num_frames"),
])
def test_a_refused_setting_is_a_400_naming_its_field(setup, body, field):
    server, _ = setup
    r = server.client.post("/v1/videos", json={"prompt": PROMPT, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field and error["message"].startswith(f"{field}:"), error
