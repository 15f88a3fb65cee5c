"""LoRA beside FP8 GEMMs. The rule: the base Linear runs in FP8 (quantized after the adapters load, as peft's base
layer), the adapter's low-rank term in the working dtype on the unquantized input, so a layer's FP8 + LoRA output
is its FP8 output plus exactly the adapter's term; images stay within FP8's bound of the fp32 + LoRA image, and
every layout equals FP8 + LoRA serial."""
import numpy as np
import pytest
import torch

from meshdit.errors import ConfigError
from meshdit.testing.tiny_lora import save_tiny_lora
from tests.quant import lora_jobs

NAME = "flux-4blocks"
LORAS = (("a", 0.8),)
IMAGE_BOUND = 0.02  # relative L2 error of an FP8 image against fp32 (measured: 0.0019 alone, 0.0069 with LoRA)
DELTA_BOUND = 0.15  # relative L2 error of the adapter's change to the image (measured 0.058)


def test_an_fp8_layer_adds_exactly_the_adapters_term():
    from peft import LoraConfig, inject_adapter_in_model

    from meshdit.quant.fp8_linear import Fp8Linear, quantize_linears

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 24))
    model = inject_adapter_in_model(LoraConfig(r=4, lora_alpha=8, target_modules=["0"]), model)
    layer = model[0]
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_()
    assert quantize_linears(model) == 1
    assert isinstance(layer.base_layer, Fp8Linear) and layer.lora_A["default"].weight.dtype == torch.float32
    x = torch.randn(5, 16)
    with torch.no_grad():
        term = layer.lora_B["default"](layer.lora_A["default"](x)) * layer.scaling["default"]
        assert torch.allclose(model(x) - layer.base_layer(x), term, rtol=0, atol=1e-6 * term.abs().max())
        layer.enable_adapters(False)
        assert torch.equal(model(x), layer.base_layer(x))


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    return {"a": save_tiny_lora(NAME, str(tmp_path_factory.mktemp("fp8-lora") / "a.safetensors"), seed=1)}


_SERIAL: dict = {}


def serial(adapters, loras, fp8):
    key = (loras, fp8)
    if key not in _SERIAL:
        _SERIAL[key] = lora_jobs.generate(NAME, {}, adapters if loras else {}, loras, fp8)
    return _SERIAL[key]


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_fp8_with_lora_differs_from_fp8_alone_by_the_adapters_change(adapters):
    base, lora = serial(adapters, (), False), serial(adapters, LORAS, False)
    fp8, fp8_lora = serial(adapters, (), True), serial(adapters, LORAS, True)
    assert 0 < rel(fp8, base) <= IMAGE_BOUND and 0 < rel(fp8_lora, lora) <= IMAGE_BOUND
    assert rel(fp8_lora - fp8, lora - base) <= DELTA_BOUND  # the adapter's change, through FP8 GEMMs
    off = lora_jobs.generate(NAME, {}, adapters, (), True)  # adapters loaded, none active: FP8 alone
    assert np.array_equal(off, fp8)


# Split layouts: the adapters' own (fp32) GEMMs over a rank's share of the tokens round the last bit differently
# (max 7.7e-7 of the image without FP8), and an FP8 quantizer turns a last-bit change at a rounding boundary into
# a whole FP8 step: measured max 1.1e-3 of the image (relative L2 3.1e-4) under Ulysses 2. CFG 2 and PipeFusion
# with full warmup split no GEMM's tokens: equal (measured 0).
SPLIT_BOUND = 0.005  # max abs difference over the image's max


@pytest.mark.parametrize("degrees,bound", [
    (dict(cfg_degree=2), 1e-5), (dict(ulysses_degree=2), SPLIT_BOUND),
    (dict(pipefusion_parallel_degree=2, warmup_steps=2, num_pipeline_patch=2), 1e-5)], ids=["cfg2", "u2", "pf2"])
def test_layouts_equal_serial_under_fp8_and_lora(run_ranks, adapters, degrees, bound):
    ref = serial(adapters, LORAS, True)
    for rank, image in enumerate(run_ranks(2, lora_jobs.generate, NAME, degrees, adapters, LORAS, True)):
        error = np.abs(image - ref).max() / np.abs(ref).max()
        print(f"fp8 + lora {degrees}: max rel {error:.2e}")
        assert error <= bound, f"rank {rank}: {error}"


def test_a_pipeline_already_in_fp8_is_refused_naming_the_order(adapters):
    from meshdit.engine import Engine
    from meshdit.quant.fp8_linear import quantize_linears
    from meshdit.testing.tiny_models import tiny_pipeline

    pipe = tiny_pipeline(NAME)
    quantize_linears(pipe.transformer.transformer_blocks)
    with pytest.raises(ConfigError, match="already has FP8 Linear layers.*quantizes after the adapters load"):
        Engine(pipe, loras=adapters)
