"""Smaller CLI edges (issue 60, item 9): a failed run's error starts on a line of its own (a rank's progress bar
may have left its line open), an error whose message says all (a full disk, a NaN image) comes without the rank's
traceback, and a 16-bit PNG input is scaled as a 16-bit image, not clipped to white."""
import numpy as np
from PIL import Image

import meshdit.distributed.launch
from meshdit.cli import main
from meshdit.distributed.launch import _traceback
from meshdit.errors import RankFailedError
from meshdit.input_image import open_image
from meshdit.output import NonFiniteOutputError, OutputWriteError


def test_a_rank_failure_starts_on_a_new_line(tmp_path, monkeypatch, capsys):
    def failing(*args, **kwargs):
        raise RankFailedError("rank 1 was killed by SIGKILL")

    monkeypatch.setattr(meshdit.distributed.launch, "launch", failing)
    assert main(["generate", "--steps", "1", "--output", str(tmp_path / "x.png")]) == 1
    assert "\nmeshdit: error: rank 1 was killed by SIGKILL" in capsys.readouterr().err


def test_errors_that_say_it_all_come_without_a_traceback():
    for exc in (OutputWriteError(28, "cannot write x.png: disk full"), NonFiniteOutputError("NaN image")):
        try:
            raise exc
        except Exception as caught:  # noqa: BLE001
            assert _traceback(caught) == ""
    try:
        raise ValueError("a bug")
    except ValueError as caught:
        assert "Traceback" in _traceback(caught)


def test_a_16_bit_png_is_scaled_not_clipped(tmp_path):
    ramp = np.linspace(0, 65535, 256, dtype=np.uint16).reshape(16, 16)  # [H, W], 16-bit grey (16 px: the least side)
    Image.fromarray(ramp).save(tmp_path / "grey16.png")
    rgb = np.asarray(open_image(str(tmp_path / "grey16.png")))  # [H, W, 3] uint8
    assert rgb.shape == (16, 16, 3) and rgb[0, 0, 0] == 0 and rgb[-1, -1, 0] == 255
    assert np.abs(rgb[..., 0].astype(int) - np.round(ramp / 257)).max() <= 1
