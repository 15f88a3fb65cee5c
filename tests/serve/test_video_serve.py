"""A real `meshdit serve` of tiny video pipelines: OpenAI's /v1/videos jobs (the openai client's videos.create,
retrieve and download_content; JSON; a multipart upload of `input_reference` for image to video) answer with the
MP4 `meshdit generate --output clip.mp4` writes for the same request, byte for byte (the same frames through the
same encoder and settings: output.video_file_bytes); status, progress, delete and the refusals."""
from __future__ import annotations

import time

import httpx
import pytest

from meshdit.testing.serve_process import KEY

pytestmark = pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")  # the openai client's own note
PROMPT = "a red cat walks"
T2V = ["--height", "64", "--width", "64", "--steps", "2", "--num-frames", "9"]  # tiny Wan: 16 fps, so 9 frames
I2V = ["--height", "64", "--width", "96", "--steps", "2", "--num-frames", "9"]  # tiny LTX: 32-pixel tokens, 25 fps


def wait(server, video_id, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        video = server.client.get(f"/v1/videos/{video_id}").json()
        assert video["status"] in ("queued", "in_progress", "completed", "failed") and 0 <= video["progress"] <= 100
        if video["status"] in ("completed", "failed"):
            return video
        time.sleep(0.05)
    raise TimeoutError(video)


@pytest.fixture
def wan(served_tiny):
    """The tiny Wan's server and generate's generated.mp4 (shared with tests/serve/comfyui/test_video_nodes.py)."""
    return served_tiny("wan", T2V, PROMPT, "generated.mp4")


def test_openai_videos_equal_meshdit_generate(wan):
    import openai

    server, folder = wan
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY)
    # 0.5 s at the tiny Wan's 16 fps: 8 frames, rounded up to the VAE's 4k + 1: the 9 frames generate made
    video = client.videos.create(model="tiny-wan", prompt=PROMPT, seconds="0.5", size="64x64",
                                 extra_body={"seed": 3})
    assert video.status in ("queued", "in_progress") and video.id.startswith("video_")
    done = wait(server, video.id)
    assert done["status"] == "completed" and done["progress"] == 100, done
    assert (done["num_frames"], done["fps"], done["size"]) == (9, 16, "64x64")
    assert client.videos.retrieve(video.id).status == "completed"
    content = client.videos.download_content(video.id)
    assert content.response.headers["content-type"] == "video/mp4"
    assert content.content == (folder / "generated.mp4").read_bytes()


def test_json_request_delete_and_refusals(wan):
    server, folder = wan
    r = server.client.post("/v1/videos", json={"prompt": PROMPT, "num_frames": 9, "seed": 3})
    assert r.status_code == 200, r.text
    video_id = r.json()["id"]
    assert wait(server, video_id)["status"] == "completed"
    mp4 = server.client.get(f"/v1/videos/{video_id}/content")
    assert mp4.content == (folder / "generated.mp4").read_bytes()
    listed = server.client.get("/v1/videos").json()
    assert video_id in [v["id"] for v in listed["data"]]
    gone = server.client.delete(f"/v1/videos/{video_id}").json()
    assert gone == {"id": video_id, "object": "video.deleted", "deleted": True}
    assert server.client.get(f"/v1/videos/{video_id}").status_code == 404
    assert server.client.get(f"/v1/videos/{video_id}/content").status_code == 404
    for body, param in (({"prompt": PROMPT, "num_frames": 10}, "num_frames"),  # not 4k + 1
                        ({"prompt": PROMPT, "num_frames": 9, "seconds": "1"}, "num_frames"),
                        ({"prompt": PROMPT, "seconds": "-1"}, "seconds"),
                        ({"prompt": PROMPT, "num_frames": 1001}, "num_frames"),  # past --max-frames
                        ({"prompt": PROMPT, "input_reference": "aGk="}, "input_reference"),  # a text-to-video model
                        ({"prompt": PROMPT, "n": 2}, "n")):  # OpenAI's videos have no n
        r = server.client.post("/v1/videos", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
    assert httpx.post(server.url + "/v1/videos", json={"prompt": PROMPT}).status_code == 401  # the key, as images
    image = server.client.post("/v1/images/generations", json={"prompt": PROMPT})
    assert image.status_code == 400 and "/v1/videos" in image.json()["error"]["message"]
    assert server.client.get("/health").json()["defaults"] == {"size": "64x64", "steps": 2, "num_frames": 9, "fps": 16}
    assert "<video" in server.client.get("/").text


def test_delete_cancels_a_queued_video(wan):
    server, _ = wan
    first = server.client.post("/v1/videos", json={"prompt": PROMPT, "num_frames": 33, "steps": 50}).json()
    queued = server.client.post("/v1/videos", json={"prompt": PROMPT, "num_frames": 33, "steps": 50}).json()
    assert server.client.get(f"/v1/images/jobs/{queued['id']}").status_code == 404  # not an image job
    assert server.client.delete(f"/v1/videos/{queued['id']}").json()["deleted"] is True
    assert server.client.delete(f"/v1/videos/{first['id']}").json()["deleted"] is True
    assert server.client.get(f"/v1/videos/{queued['id']}").status_code == 404
    metrics = server.client.get("/metrics").text.splitlines()
    assert float(next(line for line in metrics if line.startswith(
        'meshdit_requests_total{outcome="cancelled"}')).split()[1]) >= 1


def test_image_to_video_upload_equals_meshdit_generate_image(served_tiny):
    """LTX-Video image to video: input_reference uploaded as multipart/form-data (as OpenAI's client sends it)."""
    server, folder = served_tiny("ltx-i2v", I2V, PROMPT, "generated.mp4", image=True)
    upload = (folder / "input.png").read_bytes()
    r = server.client.post("/v1/videos", data={"prompt": PROMPT, "seed": "3", "size": "96x64"},
                           files={"input_reference": ("first.png", upload, "image/png")})
    assert r.status_code == 200, r.text
    assert wait(server, r.json()["id"])["status"] == "completed"
    mp4 = server.client.get(f"/v1/videos/{r.json()['id']}/content").content
    assert mp4 == (folder / "generated.mp4").read_bytes()
    missing = server.client.post("/v1/videos", json={"prompt": PROMPT})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "input_reference"
