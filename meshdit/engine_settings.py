"""EngineSettings: everything that decides how an Engine is built on a rank, in one picklable value.

`meshdit generate` (runner.GenerateJob), `meshdit serve` (serve.server_state.ServeSettings) and the Python API
(Engine.from_pretrained) all hold one, and `rank.start_rank` / `Engine.from_settings` turn it into an engine:
a new engine setting (FP8, LoRA files) is a field here, its flag on the field's settings dataclass, and its use in
`Engine.from_settings`. No torch here: the CLI builds and checks it before any rank starts.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .config import ParallelConfig
from .errors import ConfigError
from .loading.options import LoadOptions
from .quant.settings import Fp8Config
from .vae.settings import VaeDecodeSettings

DTYPES = ("float32", "bfloat16", "float16")
"""--dtype's choices: torch dtype names."""


@dataclass
class EngineSettings:
    model: str
    """A diffusers pipeline folder or Hub id (the CLI puts the bundled model's folder here when --model is unset)."""
    config: ParallelConfig = field(default_factory=ParallelConfig)
    """The layout (degrees) and --compile."""
    dtype: str | None = None
    """One of DTYPES; None: bfloat16 on GPU, float32 on CPU."""
    vae: VaeDecodeSettings = field(default_factory=VaeDecodeSettings)
    loading: LoadOptions = field(default_factory=LoadOptions)
    fp8: Fp8Config | None = None
    """None (or a config with every option off): no FP8."""
    verbose: bool = False
    """Library logs and loading progress bars."""
    loras: tuple[tuple[str, str], ...] = ()
    """LoRA adapters every rank loads when the engine is built, (name, file): generate's --lora / --lora-2 files,
    serve's --lora-dir / --lora-2-dir (lora_files.lora_from_args, when these settings are built). The engine's, since
    loading one is a reload (under PipeFusion, of each stage's share); requests choose among them and set their
    weights (GenerateRequest.loras)."""
    lora_experts: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """(name, denoisers) for the adapters of `loras` that load elsewhere than into `transformer` alone: generate's
    --lora-2 files go into Wan 2.2's second expert, ("transformer_2",), or both when also given to --lora."""

    def validate(self) -> None:
        """The settings' own ranges (no model needed); ConfigError naming the flag. prelaunch adds the model's."""
        self.config.validate()
        self.vae.validate()
        self.loading.validate(self.config.world_size)
        if self.loading.offload and self.config.compile:
            raise ConfigError("--offload blocks with --compile: the compiled blocks would be traced with weights that "
                              "come and go; drop one of them.")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ConfigError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.fp8 is not None:
            self.fp8.validate(self.config.pipefusion_parallel_degree)
        check_lora_layout(self.loras, self.config)

    def torch_dtype(self):
        """The torch dtype of `dtype` (None stays None: the device decides). Imports torch."""
        if self.dtype is None:
            return None
        import torch

        return getattr(torch, self.dtype)

    @staticmethod
    def dtype_name(torch_dtype) -> str | None:
        """torch.bfloat16 -> "bfloat16" (the Python API passes torch dtypes)."""
        return None if torch_dtype is None else str(torch_dtype).removeprefix("torch.")


def check_lora_layout(loras, config: ParallelConfig) -> None:
    """Tensor parallelism splits the Linear layers' weights, not the adapters peft puts beside them (their shapes
    then disagree inside attention): refused until the adapters are split too (EngineSettings.validate, and Engine
    for a pipeline given directly)."""
    if loras and config.tensor_parallel_degree > 1:
        raise ConfigError("--lora with --tensor-parallel-degree: tensor parallelism splits the base weights but not "
                          "the adapters beside them; give the ranks to --ulysses-degree, --ring-degree, --cfg-degree "
                          "or --pipefusion-parallel-degree instead (docs/lora.md)")
