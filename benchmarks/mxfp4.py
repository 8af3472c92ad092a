"""MXFP4 experts (gpt-oss's releases): what reading them costs at load, and what serving them
at each `--quantization` costs in memory and in error, on random expert matrices of
gpt-oss-20b's shapes. Prints JSON.

The engine dequantizes MXFP4 exactly into its float dtype (engine/models/mxfp4.py); int8 and
int4 then quantize those values again. Each row gives bits per weight (scales included) and
the relative RMS error against the MXFP4 values the checkpoint stores, beside the same
quantization applied to the float weights the MXFP4 copy was written from (the baseline: what
that quantization costs a model that was never MXFP4), all in the same run.
"""

import argparse
import json
import time

import torch

from kvpilot_common import precision
from kvpilot_server.engine.layers.quant import (
    dequantize_int4,
    quantize_int4,
    quantize_int8,
)
from kvpilot_server.engine.models.mxfp4 import BLOCK, dequantize
from kvpilot_testing import results
from kvpilot_testing.mxfp4 import quantize

# gpt-oss-20b: hidden 2880, expert width 2880; gate_up is [2 * width, hidden], down [hidden, width].
SHAPES = {"gate_up": (5760, 2880), "down": (2880, 2880)}
MXFP4_BITS = 4 + 8 / BLOCK  # a uint8 exponent per 32 weights
INT8_BITS = 8  # plus a float32 scale per row: negligible at 2880 inputs
INT4_SCALE_BITS = 32  # float16 scale and minimum per group


def _relative(approx: torch.Tensor, exact: torch.Tensor) -> float:
    return float((approx - exact).norm() / exact.norm())


def _int8(weight: torch.Tensor) -> torch.Tensor:
    q, scale = quantize_int8(weight)
    return q.float() * scale[:, None]


def _int4(weight: torch.Tensor, group: int) -> torch.Tensor:
    return dequantize_int4(*quantize_int4(weight, group), group).float()


def measure(experts: int, seed: int) -> dict:
    torch.manual_seed(seed)
    rows: dict[str, dict] = {}
    sources, stored = [], []
    dequantize_s = 0.0
    for out_features, in_features in SHAPES.values():
        for _ in range(experts):
            # Heavier tails than a Gaussian, as trained weights have: outliers set block scales.
            source = torch.distributions.StudentT(5.0).sample((out_features, in_features)) * 0.02
            blocks, scales = quantize(source)
            start = time.perf_counter()
            values = dequantize(blocks.unsqueeze(0), scales.unsqueeze(0), torch.float32)[0]
            dequantize_s += time.perf_counter() - start
            sources.append(source)
            stored.append(values)
    weights = sum(s.numel() for s in sources)
    rows["mxfp4 (as stored)"] = {
        "bits_per_weight": MXFP4_BITS,
        "error_vs_stored": 0.0,
        "float_source_error": _mean(_relative(v, s) for v, s in zip(stored, sources, strict=True)),
    }
    rows["bfloat16 (dequantized)"] = {
        "bits_per_weight": 16,
        "error_vs_stored": _mean(_relative(v.bfloat16().float(), v) for v in stored),
        "float_source_error": _mean(_relative(s.bfloat16().float(), s) for s in sources),
    }
    quantizers = {"int8": (_int8, INT8_BITS)}
    for group in precision.INT4_GROUP_SIZES:
        if any(shape[1] % group for shape in SHAPES.values()):
            continue  # 2880 inputs: group 128 does not divide them (the engine refuses it)
        quantizers[f"int4 group {group}"] = (
            lambda w, g=group: _int4(w, g),
            4 + INT4_SCALE_BITS / group,
        )
    for name, (apply, bits) in quantizers.items():
        rows[name] = {
            "bits_per_weight": round(bits, 2),
            "error_vs_stored": _mean(_relative(apply(v), v) for v in stored),
            "float_source_error": _mean(_relative(apply(s), s) for s in sources),
        }
    return {
        "shapes": SHAPES,
        "experts_per_shape": experts,
        "dequantize_ns_per_weight": round(dequantize_s / weights * 1e9, 3),
        "rows": rows,
    }


def _mean(values) -> float:
    values = list(values)
    return round(sum(values) / len(values), 5)


def main() -> None:
    run = results.Run.start("mxfp4")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experts", type=int, default=2, help="random experts per shape")
    parser.add_argument("--seed", type=int, default=0)
    results.add_argument(parser)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    result = measure(args.experts, args.seed)
    print(json.dumps(result, indent=2))
    if args.record:
        figures = [
            results.figure(
                f"{name}: relative error vs the stored MXFP4 (baseline: vs float source)",
                f"{row['bits_per_weight']} bits/weight",
                row["error_vs_stored"],
                row["float_source_error"],
            )
            for name, row in result["rows"].items()
        ]
        figures.append(
            results.figure("dequantize at load", "ns/weight", result["dequantize_ns_per_weight"])
        )
        run.record(figures, "the same quantization of the float source weights", result)


if __name__ == "__main__":
    main()
