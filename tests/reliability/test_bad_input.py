"""Bad input is refused before any rank starts: exit status 2, a message naming the flag, in under 0.5 s,
no rank spawned, no earlier output touched, nothing left behind."""
import os
import subprocess
import sys
import time

import pytest

import meshdit.distributed.launch
from meshdit.cli import main

# (flags, text the message must contain). The model is the bundled one unless the flags name another.
BAD_INPUTS = {
    "steps-0": (["--steps", "0"], "--steps 0 is out of range"),
    "steps-negative": (["--steps", "-3"], "--steps -3 is out of range"),
    "steps-alias-0": (["--num_inference_steps", "0"], "--steps 0 is out of range"),
    "steps-not-a-number": (["--steps", "x"], "argument --steps"),
    "height-0": (["--height", "0"], "--height 0 is out of range"),
    "height-negative": (["--height", "-256"], "--height -256 is out of range"),
    "height-huge": (["--height", "100000"], "--height 100000 is out of range: it must be in 1..8192"),
    "width-0": (["--width", "0"], "--width 0 is out of range"),
    "width-above-8192": (["--width", "8208"], "--width 8208 is out of range"),
    "height-not-patch-multiple": (["--height", "36"], "height 36 cannot be split into this model's patches"),
    "seed-negative": (["--seed", "-1"], "--seed -1 is out of range"),
    "seed-2**64": (["--seed", str(2**64)], f"--seed {2**64} is out of range"),
    "guidance-inf": (["--guidance-scale", "inf"], "--guidance-scale must be a finite number, got inf"),
    "guidance-minus-inf": (["--guidance-scale=-inf"], "--guidance-scale must be a finite number, got -inf"),
    "guidance-minus-inf-as-typed": (["--guidance-scale", "-inf"], "--guidance-scale must be a finite number, got -inf"),
    "guidance-nan": (["--guidance-scale", "nan"], "--guidance-scale must be a finite number, got nan"),
    "images-per-prompt-0": (["--num-images-per-prompt", "0"], "--num-images-per-prompt 0 is out of range"),
    "images-per-prompt-0-with-dp": (["--num-images-per-prompt", "0", "--data-parallel-degree", "2"],
                                    "--num-images-per-prompt 0 is out of range"),
    "max-sequence-length-0": (["--max-sequence-length", "0"], "--max-sequence-length 0 is out of range"),
    "max-sequence-length-negative": (["--max-sequence-length", "-1"], "--max-sequence-length -1 is out of range"),
    "max-sequence-length-above-t5": (["--max-sequence-length", "513"], "use --max-sequence-length <= 512"),
    "prompt-empty": (["--prompt", ""], "--prompt '' is blank"),
    "prompt-blank": (["--prompt", "a cat", "   "], "--prompt '   ' is blank"),
    "prompt-not-utf8": (["--prompt", "caf\udce9"], "--prompt 'caf\\udce9' is not valid UTF-8"),
    "negative-prompt-not-utf8": (["--negative-prompt", "\udcff"], "--negative-prompt '\\udcff' is not valid UTF-8"),
    "prompt-file-empty": (["--prompt-file", "{tmp}/empty.txt"], "holds no prompt (it is empty or blank)"),
    "prompt-file-blank": (["--prompt-file", "{tmp}/blank.txt"], "holds no prompt (it is empty or blank)"),
    "prompt-file-not-utf8": (["--prompt-file", "{tmp}/latin1.txt"], "not UTF-8 text"),
    "prompt-file-missing": (["--prompt-file", "{tmp}/nope.txt"], "cannot read --prompt-file"),
    "output-under-a-file": (["--output", "{tmp}/earlier.png/x.png"], "is a file, so no folder can be made"),
    "output-is-a-folder": (["--output", "{tmp}/folder.png"], "is a folder; name a file inside it"),
    "output-unwritable": (["--output", "/sys/meshdit-test.png"], "/sys/meshdit-test.png: cannot write in /sys"),
    "output-unknown-extension": (["--output", "{tmp}/x.gif2"], "use a .png, .jpg, .webp or .npy"),
    "model-index-malformed": (["--model", "{tmp}/bad-json"], "model_index.json is not valid JSON"),
    "model-index-no-class": (["--model", "{tmp}/no-class"], "model_index.json names no pipeline"),
    "model-folder-missing": (["--model", "{tmp}/missing/model"], "there is no such folder"),
    "ulysses-0": (["--ulysses-degree", "0"], "--ulysses-degree must be a whole number >= 1"),
    "ring-negative": (["--ring-degree", "-2"], "--ring-degree must be a whole number >= 1"),
    "warmup-0": (["--pipefusion-parallel-degree", "2", "--warmup-steps", "0"], "--warmup-steps must be"),
    "pipeline-patch-0": (["--num-pipeline-patch", "0"], "--num-pipeline-patch must be"),
    "data-parallel-0": (["--data-parallel-degree", "0"], "--data-parallel-degree must be"),
    "vae-overlap-negative": (["--vae-tile-overlap", "-1"], "--vae-tile-overlap must be"),
    "dtype-unknown": (["--dtype", "float8"], "argument --dtype: invalid choice"),
}


@pytest.fixture
def workdir(tmp_path):
    """Files the bad inputs refer to, and an earlier output that must survive."""
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "blank.txt").write_text("\n   \n\t\n")
    (tmp_path / "latin1.txt").write_bytes("un caf\u00e9 rouge\n".encode("latin-1"))
    (tmp_path / "earlier.png").write_bytes(b"an earlier output")
    (tmp_path / "folder.png").mkdir()
    for name, index in (("bad-json", '{"_class_name": "FluxPipeline",'), ("no-class", '{"a": 1}')):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model_index.json").write_text(index)
    return tmp_path


def _snapshot(folder):
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in folder.rglob("*")}


@pytest.mark.parametrize("flags,message", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_input_is_refused_before_ranks_start(flags, message, workdir, monkeypatch, capsys):
    def no_ranks(*args, **kwargs):
        raise AssertionError("ranks were started for a bad input")

    monkeypatch.setattr(meshdit.distributed.launch, "launch", no_ranks)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = ["generate", "--output", str(workdir / "out.png")] + [f.replace("{tmp}", str(workdir)) for f in flags]
    before = _snapshot(workdir)
    start = time.perf_counter()
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse's own refusals (not a number, unknown choice)
        status = exc.code
    seconds = time.perf_counter() - start
    err = capsys.readouterr().err
    assert status == 2, err
    assert message in err, err
    assert seconds < 0.5
    assert _snapshot(workdir) == before  # no earlier output touched, nothing written or left behind


def test_table_is_broad_enough():
    assert len(BAD_INPUTS) >= 25


def test_non_utf8_prompt_bytes_from_the_shell_are_refused(tmp_path):
    """The real console path: argv bytes that are not UTF-8 end in one `meshdit: error:` line, no traceback."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable.encode(), b"-m", b"meshdit", b"generate", b"--prompt", b"caf\xe9",
                           b"--output", str(tmp_path / "x.png").encode()], capture_output=True, timeout=60, env=env)
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == 2, err
    assert "is not valid UTF-8" in err and "Traceback" not in err and "rank" not in err
    assert list(tmp_path.iterdir()) == []

