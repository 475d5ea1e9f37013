"""The environment a child process runs its kernels in under the Khronos validation
layer's GPU-assisted validation (GPU-AV), which checks every storage-buffer access of a
dispatch. GPU-AV is chosen when the instance is made, hence a child process."""

from __future__ import annotations

import os
from pathlib import Path

_GPU_AV = {
    "VK_KHRONOS_VALIDATION_VALIDATE_GPU_BASED": "GPU_BASED_GPU_ASSISTED",
    "VK_KHRONOS_VALIDATION_ENABLE_MESSAGE_LIMIT": "false",
}


def gpu_av_env(cache_dir: Path) -> dict[str, str]:
    """os.environ with validation on, GPU-AV chosen, kernels unspecialized (the variants
    the cases name) and coopmat's SPIR-V cache in `cache_dir`."""
    return dict(os.environ, COOPMAT_VALIDATION="1", COOPMAT_SPECIALIZE="0",
                COOPMAT_CACHE_DIR=str(cache_dir), **_GPU_AV)
