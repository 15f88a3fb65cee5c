"""The Python API as the README shows it: library warnings stay quiet as in `meshdit generate` (unless verbose),
and a wrong model path in a script run on every rank (torchrun) is one clear error, not a traceback per rank."""
import os
import subprocess
import sys
import textwrap

import pytest

from meshdit.logs import QUIET_ENV

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code, tmp_path, *argv, timeout=240):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(code))
    # torchrun makes itself a torchelastic_* log folder under TMPDIR and leaves it: keep it in tmp_path
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": ROOT, "HF_HUB_OFFLINE": "1"}
    for key in QUIET_ENV:  # an engine built earlier in this pytest process set them (quiet_libraries)
        env.pop(key, None)
    return subprocess.run([sys.executable, *argv, str(script)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("verbose", [False, True])
def test_from_pretrained_keeps_library_warnings_quiet_unless_verbose(tmp_path, verbose):
    proc = run_python(f"""
        import meshdit
        engine = meshdit.Engine.from_pretrained(verbose={verbose})
        engine.close()
        """, tmp_path)
    assert proc.returncode == 0, proc.stderr
    if not verbose:
        assert "[transformers]" not in proc.stderr and "torchvision" not in proc.stderr, proc.stderr
    else:
        try:
            import torchvision  # noqa: F401 - with it, transformers has nothing to warn about
        except ImportError:
            assert "torchvision" in proc.stderr  # verbose shows them


def test_wrong_model_path_on_every_rank_is_one_error(tmp_path):
    proc = run_python("""
        import meshdit
        mesh = meshdit.init(meshdit.ParallelConfig(ulysses_degree=2))
        engine = meshdit.Engine.from_pretrained("path/or/hub-id", mesh)
        """, tmp_path, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")
    assert proc.returncode != 0
    assert proc.stderr.count("meshdit: error: model 'path/or/hub-id' was not found") == 1, proc.stderr
    assert 'script.py", line' not in proc.stderr, proc.stderr  # no rank's traceback
    assert "[transformers]" not in proc.stderr


def test_latent_output_is_refused_not_answered_with_pixels():
    """diffusers' output_type="latent" returns latents; the engine keeps none, and said nothing (pixels came back)."""
    from meshdit import Engine, GenerateRequest
    from meshdit.errors import ConfigError
    from meshdit.testing.tiny_models import tiny_pipeline

    engine = Engine(tiny_pipeline("flux"))
    try:
        with pytest.raises(ConfigError, match="output_type='latent'.*no 'latent'"):
            engine.generate(GenerateRequest(prompt="a cat", height=32, width=32, num_inference_steps=1),
                            output_type="latent")
    finally:
        engine.close()
