"""Servers the serve tests share: one `meshdit serve` per (tiny pipeline, flags, prompt), each beside the output
`meshdit generate` writes for the same flags, --seed 3 and prompt (conftest's `served_tiny` fixture)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from meshdit.testing.serve_process import REPO, Server
from meshdit.testing.tiny_models import sample_image, tiny_families

SEED = 3


def edit_flags(name: str, *more: str) -> list[str]:
    """serve / generate flags of tiny edit pipeline `name` (TinyTests.edit) at 48 x 32, 2 steps, under `more`."""
    tests = next(module.TESTS for _, module in tiny_families(video=False) if module.TESTS.edit == name)
    out = [*more, "--height", "32", "--width", "48", "--steps", "2", "--max-sequence-length", "8"]
    if tests.guidance is not None:
        out += ["--guidance-scale", str(tests.guidance)]
    for key, value in tests.request_extra.items():  # e.g. Kontext's reference kept at its own size
        out += ["--extra", f"{key}={json.dumps(value)}"]
    return out


class SharedServers:
    """Starts each server on first ask and stops them all in close(); tests that share one leave it as they found
    it (they delete or cancel the jobs they start, and count metrics from where they were)."""

    def __init__(self, make_folder, tiny_folder) -> None:
        self._make_folder, self._tiny_folder = make_folder, tiny_folder
        self._servers: dict = {}

    def get(self, name: str, flags: list[str], prompt: str, output: str, image: bool = False):
        """(a ready Server of tiny pipeline `name` with `flags`, its folder): the folder holds generate's `output`
        (e.g. generated.png, generated.mp4) and, where `image`, the input.png (sample_image(40, 56)) both got."""
        key = (name, tuple(flags), prompt, output, image)
        if key not in self._servers:
            folder = self._make_folder(f"served-{name}")
            model = ["--model", self._tiny_folder(name), *flags]
            more = []
            if image:
                sample_image(40, 56).save(folder / "input.png")
                more = ["--image", str(folder / "input.png")]
            server = Server(folder, *model)  # starts while generate runs
            try:
                subprocess.run([sys.executable, "-m", "meshdit", "generate", *model, "--seed", str(SEED), "--prompt",
                                prompt, *more, "--output", str(folder / output)], cwd=REPO,
                               env=dict(os.environ, PYTHONPATH=str(REPO)), check=True, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=600)
                self._servers[key] = server.wait_ready(), folder
            except BaseException:
                server.stop()
                raise
        return self._servers[key]

    def close(self) -> None:
        for server, _ in self._servers.values():
            server.stop()
        self._servers.clear()
