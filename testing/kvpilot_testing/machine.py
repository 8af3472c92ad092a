"""What an engine benchmark reports of the machine it ran on, beside its figures."""

import os
import platform
from typing import Any


def engine_machine() -> dict[str, Any]:
    import torch

    from kvpilot_server.engine.layers.half_matrices import amx_capable, bfloat16_capable

    return {
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "processor": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "amx": amx_capable(),
        "bfloat16_products": bfloat16_capable(),  # AMX or AVX-512 BF16
    }
