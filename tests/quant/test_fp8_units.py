"""FP8 pieces against float32: measured error bounds (docs/fp8.md), broken scales caught, options off exact."""
import pytest
import torch

from meshdit.attention.fp8 import emulated_fp8_attention
from meshdit.attention.kernels import attention_with_lse
from meshdit.errors import ConfigError
from meshdit.quant import formats
from meshdit.quant.codec import Fp8WireCodec
from meshdit.quant.fp8_linear import Fp8Linear, quantize_block_lists
from meshdit.quant.settings import Fp8Config
from meshdit.testing.tiny_models import tiny_pipeline
from tests.quant import jobs

LINEAR_BOUND = 0.06  # measured 0.035 (Gaussian weights and inputs)
ATTENTION_BOUND = 0.08  # measured 0.052 (K, V smoothed)
LSE_BOUND_NATS = 0.1  # measured 0.055
CODEC_BOUND = 0.03  # measured 0.025 (e4m3: 3 mantissa bits)


def rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(0)


def test_linear_error_and_a_broken_scale_is_caught(gen):
    linear = torch.nn.Linear(256, 192)
    x = torch.randn(3, 70, 256, generator=gen)
    fp8 = Fp8Linear(linear)
    assert 0 < rel(fp8(x), linear(x)) <= LINEAR_BOUND
    fp8.weight_scale.mul_(2)
    assert rel(fp8(x), linear(x)) > LINEAR_BOUND


def test_linear_keeps_the_working_dtype(gen):
    linear = torch.nn.Linear(64, 32).to(torch.bfloat16)
    out = Fp8Linear(linear)(torch.randn(5, 64, generator=gen).to(torch.bfloat16))
    assert out.dtype == torch.bfloat16 and out.shape == (5, 32)


def test_attention_and_lse_error(gen):
    q, k, v = (torch.randn(2, 4, 150, 32, generator=gen) for _ in range(3))
    out, lse = emulated_fp8_attention(q, k, v)
    ref_out, ref_lse = attention_with_lse(q, k, v)
    assert 0 < rel(out, ref_out) <= ATTENTION_BOUND
    assert 0 < (lse - ref_lse).abs().max().item() <= LSE_BOUND_NATS


def test_codec_error_bytes_and_a_broken_scale_is_caught(gen):
    for codec, x in [(Fp8WireCodec(token_dim=2), torch.randn(1, 2, 53, 16, generator=gen)),
                     (Fp8WireCodec(token_dim=3), torch.randn(2, 1, 4, 33, 16, generator=gen)),
                     (Fp8WireCodec(token_dim=1, min_values_per_scale=64), torch.randn(1, 99, 16, generator=gen))]:
        wire = codec.encode(x)
        assert wire.dtype == torch.uint8 and wire.numel() == codec.wire_bytes(x.shape)
        assert 0 < rel(codec.decode(wire, x.shape, torch.float32), x) <= CODEC_BOUND
        n = x.numel()
        broken = wire.clone()
        broken[n:].view(torch.bfloat16).mul_(2)  # every scale off by 2x
        assert rel(codec.decode(broken, x.shape, torch.float32), x) > CODEC_BOUND


def test_mi300_gets_e4m3fnuz(monkeypatch, gen):
    monkeypatch.setattr(formats, "_rocm_arch", lambda device: "gfx942")
    assert formats.fp8_dtype(torch.device("cuda")) == torch.float8_e4m3fnuz
    assert formats.fp8_gemm_problem(torch.device("cuda")) is None
    monkeypatch.setattr(formats, "_rocm_arch", lambda device: "gfx90a")
    assert "no FP8" in formats.fp8_gemm_problem(torch.device("cuda"))
    codec = Fp8WireCodec(token_dim=1, format=torch.float8_e4m3fnuz)  # max 240: the range follows the format
    x = 1000 * torch.randn(1, 40, 64, generator=gen)
    assert rel(codec.decode(codec.encode(x), x.shape, torch.float32), x) <= CODEC_BOUND


def test_options_off_change_nothing():
    ref = jobs.run("flux", {}, None)["preds"]
    off = jobs.run("flux", {}, Fp8Config())["preds"]
    assert torch.equal(ref, off)


def test_end_to_end_bound_catches_a_broken_weight_scale():
    from tests.quant.test_fp8_layouts import BOUND, rel_error

    assert rel_error([jobs.run("flux", {}, Fp8Config(gemm=True), break_scale=True)]) > BOUND["gemm"]


def test_param_bytes_of_quantized_blocks():
    """Block weights in FP8 (scales and biases included) against the same blocks in bfloat16."""
    transformer = tiny_pipeline("flux-wide").transformer.to(torch.bfloat16)
    before = jobs.block_bytes(transformer)
    quantize_block_lists(transformer, ["transformer_blocks", "single_transformer_blocks"])
    after = jobs.block_bytes(transformer)
    print(f"fp8-gemm block bytes / bf16: {after / before:.3f}")
    assert after <= 0.55 * before
    assert not any(isinstance(m, torch.nn.Linear) for m in transformer.transformer_blocks.modules())
    assert isinstance(transformer.proj_out, torch.nn.Linear)  # outside the blocks: working dtype


def test_cli_refuses_before_ranks_start(monkeypatch, capsys):
    from meshdit import cli

    assert cli.main(["generate", "--fp8-comm-k"]) == 2
    assert "needs --fp8-comm" in capsys.readouterr().err
    monkeypatch.setattr(formats, "fp8_gemm_problem", lambda device: "test device has no FP8 GEMM")
    launched = []
    monkeypatch.setattr("meshdit.distributed.launch.launch", lambda *a, **k: launched.append(a))
    assert cli.main(["generate", "--use_fp8_gemms", "--output", "/tmp/meshdit-fp8-never.png"]) == 2
    err = capsys.readouterr().err
    assert "--fp8-gemm cannot run here" in err and "Drop --fp8-gemm" in err
    assert not launched


def test_cli_flags_build_the_config():
    from meshdit.cli import build_parser
    from meshdit.flags import engine_settings_from_args

    args = build_parser().parse_args(["generate", "--use_fp8_gemms", "--attention-backend", "fp8", "--fp8-comm",
                                      "--fp8-comm-k"])
    assert engine_settings_from_args(args).fp8 == Fp8Config(gemm=True, attention="fp8", comm=True, comm_k=True)
    assert not engine_settings_from_args(build_parser().parse_args(["generate"])).fp8  # every option off


@pytest.mark.parametrize("name", ["flux2", "sd35", "pixart-sigma"])
def test_other_families_run_fp8_within_bound(name):
    """FP8 GEMMs and attention on the other families (PixArt's masked cross-attention stays on SDPA)."""
    ref = jobs.run(name, {}, None, size=(32, 32))["preds"]
    fp8 = jobs.run(name, {}, Fp8Config(gemm=True, attention="fp8"), size=(32, 32))["preds"]
    error = rel(fp8, ref)
    print(f"fp8 gemm+attn {name}: rel error {error:.4f}")
    assert 0 < error <= 0.05  # measured 0.0010 (flux2), 0.021 (sd35, pixart-sigma)
