"""Pipeline __call__ arguments without a flag of their own: `--extra KEY=JSON` (GenerateRequest.extra), each
family's keys only, refused before ranks start otherwise. The results with them: tests/models/test_diffusers_guard.py
(HunyuanVideo's prompt_template, LTX's decode_timestep)."""
import inspect
import subprocess
import sys

import pytest

from meshdit.cli import build_parser
from meshdit.config import GenerateRequest, ParallelConfig
from meshdit.errors import ConfigError
from meshdit.flags import request_from_args
from meshdit.models.info import ModelInfo
from meshdit.models.registry import FAMILIES
from meshdit.testing.tiny_models import tiny_pipeline

def generate_args(argv):
    return build_parser().parse_args(["generate", *argv])


TEMPLATE = '{"template": "{}", "crop_start": 0}'  # diffusers' HunyuanVideo tests' prompt_template


@pytest.mark.parametrize("family", [f for f in FAMILIES if f.call_arguments.taken], ids=lambda f: f.name)
def test_call_arguments_are_the_pipelines_own(family):
    import diffusers

    for pipeline_class in family.pipeline_classes:
        taken = inspect.signature(getattr(diffusers, pipeline_class).__call__).parameters
        assert set(family.call_arguments.taken) <= set(taken), pipeline_class


def test_extra_flag_gives_json_values():
    args = generate_args(["--extra", f"prompt_template={TEMPLATE}", "--extra", "decode_timestep=0.05",
                                          "--max-sequence-length", "16"])
    request = request_from_args(args, ["a cat"])
    assert request.extra == {"prompt_template": {"template": "{}", "crop_start": 0}, "decode_timestep": 0.05,
                             "max_sequence_length": 16}


@pytest.mark.parametrize("item,message", [
    ("prompt_template", "write KEY=JSON"),
    ("decode_timestep=fast", "is not JSON"),
    ("max_sequence_length=16", "use --max-sequence-length"),
])
def test_extra_items_that_are_not_key_json_are_refused(item, message):
    args = generate_args(["--extra", item])
    with pytest.raises(ConfigError, match=message):
        request_from_args(args, ["a cat"])


def test_a_key_the_family_does_not_pass_is_refused():
    info = ModelInfo.from_pipeline(tiny_pipeline("hunyuanvideo"))
    request = GenerateRequest(prompt="a cat", height=32, width=32, num_frames=5, extra={"prompt_template": {}})
    info.check_request(ParallelConfig(), request)  # its own key passes
    with pytest.raises(ConfigError, match=r"--extra decode_timestep: .*HunyuanVideoPipeline \(the --extra keys it "
                                          r"takes: prompt_template\)"):
        info.check_request(ParallelConfig(), GenerateRequest(prompt="a cat", height=32, width=32, num_frames=5,
                                                             extra={"decode_timestep": 0.05}))


def test_cli_refuses_a_key_of_another_family_before_ranks_start(tiny_folder, tmp_path):
    model = tiny_folder("flux")
    proc = subprocess.run([sys.executable, "-m", "meshdit", "generate", "--model", model, "--height", "32",
                           "--width", "32", "--ulysses-degree", "2", "--extra", f"prompt_template={TEMPLATE}",
                           "--output", str(tmp_path / "x.png")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "--extra prompt_template: meshdit does not pass 'prompt_template' to this FluxPipeline" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "x.png").exists()
