"""The FP8 format a device computes in, and whether it can run FP8 GEMMs at all."""
from __future__ import annotations

import torch

from ..errors import ConfigError

E4M3FN = torch.float8_e4m3fn  # max 448: NVIDIA Ada/Hopper/Blackwell, AMD MI350 and RDNA 4, CPU
E4M3FNUZ = torch.float8_e4m3fnuz  # max 240: AMD MI300 (gfx94x)


def _rocm_arch(device: torch.device) -> str | None:
    if device.type != "cuda" or torch.version.hip is None:
        return None
    return torch.cuda.get_device_properties(device).gcnArchName.split(":")[0]


def fp8_dtype(device: torch.device) -> torch.dtype:
    """e4m3fnuz on MI300 (its hardware format), e4m3fn everywhere else."""
    arch = _rocm_arch(device)
    return E4M3FNUZ if arch is not None and arch.startswith("gfx94") else E4M3FN


def fp8_max(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).max)


def fp8_gemm_problem(device: torch.device) -> str | None:
    """Why `device` cannot run torch._scaled_mm, or None if it can."""
    if device.type == "cpu":
        return None  # torch >= 2.13 runs _scaled_mm on CPU
    if device.type != "cuda":
        return f"{device.type} has no FP8 GEMM in torch"
    arch = _rocm_arch(device)
    if arch is not None:
        if arch.startswith(("gfx94", "gfx95", "gfx12")):
            return None
        return f"AMD {arch} has no FP8 matrix cores (MI300/MI350 or RDNA 4 needed)"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        return f"NVIDIA compute capability {major}.{minor} has no FP8 tensor cores (Ada 8.9 or Hopper 9.0 needed)"
    return None


def check_fp8_gemm(device: torch.device) -> None:
    problem = fp8_gemm_problem(device)
    if problem:
        raise ConfigError(f"--fp8-gemm cannot run here: {problem}. Drop --fp8-gemm (use --dtype bfloat16), "
                          "or run on a device with FP8 GEMMs.")
