"""Wan 2.2's second expert (transformer_2) takes adapters: --lora-2 / Engine(lora_experts=...) equals diffusers'
load_lora_weights(..., load_into_transformer_2=True) + set_adapters bit for bit at degree 1 (second expert only,
both experts from one file, a pair of files); the adapter changes the second expert's steps only."""
import numpy as np
import pytest
import torch

from meshdit.config import GenerateRequest
from meshdit.engine import Engine
from meshdit.errors import ConfigError
from meshdit.lora_files import with_second_expert
from meshdit.testing.tiny_lora import save_tiny_lora
from meshdit.testing.tiny_models import tiny_pipeline

PROMPT = "a red cat on a blue square"
FIRST, SECOND = ("transformer",), ("transformer_2",)
# case -> ((adapter, denoisers, weight), ...)
CASES = {
    "second-only": (("b", SECOND, 0.8),),
    "both-experts": (("a", FIRST + SECOND, 0.7),),
    "pair": (("a", FIRST, 1.0), ("b", SECOND, 0.6)),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wan22-loras")
    return {a: save_tiny_lora("wan22", str(folder / f"{a}.safetensors"), seed=i + 1) for i, a in enumerate("ab")}


def _request(loras=()):
    # 2 steps: t = 1000 on transformer, then t = 47 on transformer_2 (the tiny pair's boundary 0.9)
    return GenerateRequest(prompt=PROMPT, height=64, width=48, num_inference_steps=2, guidance_scale=1.0,
                           num_frames=5, loras=loras, extra={"max_sequence_length": 16})


def _meshdit(files, adapters):
    pipe = tiny_pipeline("wan22")
    pipe.set_progress_bar_config(disable=True)
    engine = Engine(pipe, loras={a: files[a] for a, _, _ in adapters},
                    lora_experts={a: experts for a, experts, _ in adapters})
    try:
        return engine.generate(_request(tuple((a, w) for a, _, w in adapters))).images
    finally:
        engine.close()


def _diffusers(files, adapters):
    pipe = tiny_pipeline("wan22")
    pipe.set_progress_bar_config(disable=True)
    for adapter, experts, _ in adapters:
        for expert in experts:
            pipe.load_lora_weights(files[adapter], adapter_name=adapter,
                                   load_into_transformer_2=expert == "transformer_2")
    pipe.set_adapters([a for a, _, _ in adapters], [w for _, _, w in adapters])
    out = pipe(prompt=PROMPT, height=64, width=48, num_frames=5, num_inference_steps=2, guidance_scale=1.0,
               max_sequence_length=16, generator=torch.Generator("cpu").manual_seed(0), output_type="np")
    return out.frames


@pytest.mark.parametrize("case", list(CASES))
def test_second_expert_adapters_equal_diffusers(files, case):
    ours = _meshdit(files, CASES[case])
    assert np.array_equal(ours, _diffusers(files, CASES[case])), f"max abs diff {np.abs(ours - _diffusers(files, CASES[case])).max()}"


def test_the_second_experts_adapter_lands_on_the_second_expert(files):
    pipe = tiny_pipeline("wan22")
    pipe.set_progress_bar_config(disable=True)
    base = Engine(pipe).generate(_request()).images
    second = _meshdit(files, (("b", SECOND, 1.0),))
    first = _meshdit(files, (("b", FIRST, 1.0),))
    both = _meshdit(files, (("b", FIRST + SECOND, 1.0),))
    assert not np.array_equal(second, base) and not np.array_equal(second, first)
    assert not np.array_equal(both, first) and not np.array_equal(both, second)
    pipe = tiny_pipeline("wan22")
    engine = Engine(pipe, loras={"b": files["b"]}, lora_experts={"b": SECOND})
    assert any(".lora_" in n for n, _ in pipe.transformer_2.named_parameters())
    assert not any(".lora_" in n for n, _ in pipe.transformer.named_parameters())
    engine.close()


def test_a_second_expert_adapter_on_a_one_expert_model_is_refused(files):
    with pytest.raises(ConfigError, match="--lora-2 .*has no second expert \\(transformer_2\\).*use --lora"):
        Engine(tiny_pipeline("wan"), loras={"b": files["b"]}, lora_experts={"b": SECOND})


def test_generate_flags_merge_into_one_adapter_per_file(files):
    request, engine, experts = with_second_expert(((files["a"], 0.5),), [(files["b"], 1.0), (files["a"], 0.5)])
    assert request == ((files["a"], 0.5), (files["b"], 1.0))
    assert dict(engine) == {"a": files["a"], "b": files["b"]}
    assert dict(experts) == {"a": FIRST + SECOND, "b": SECOND}
    with pytest.raises(ConfigError, match="--lora-2 .*one weight"):
        with_second_expert(((files["a"], 0.5),), [(files["a"], 1.0)])


def test_generates_flags_are_checked_before_ranks_start(files, tiny_folder, tmp_path):
    """--lora-2 on a saved model: refused on Wan 2.1 (no transformer_2), taken on Wan 2.2 (the file's tensors checked
    against transformer_2's weights)."""
    from meshdit.cli import build_parser, generate_settings

    argv = ["generate", "--lora-2", f"{files['b']}:0.5", "--prompt", "a cat", "--height", "64", "--width", "48",
            "--num-frames", "5", "--steps", "2", "--output", str(tmp_path / "x.mp4")]
    with pytest.raises(ConfigError, match="--lora-2 .*WanPipeline has no second expert"):
        generate_settings(build_parser().parse_args(argv + ["--model", tiny_folder("wan")]))
    engine, _, request = generate_settings(build_parser().parse_args(argv + ["--model", tiny_folder("wan22")]))
    assert dict(engine.lora_experts) == {"b": SECOND} and request.loras == ((files["b"], 0.5),)
