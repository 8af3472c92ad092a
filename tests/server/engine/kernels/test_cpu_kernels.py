"""Which prebuilt kernel level a CPU gets: the best one present whose instruction sets the CPU
shows, and none (so a build for this CPU) when it shows too little."""

from kvpilot_server.engine.kernels import cpu_kernels
from kvpilot_server.engine.kernels.cpu_kernels import LEVELS, choose

AVX2, VNNI = (next(lv for lv in LEVELS if lv.name == name) for name in ("avx2", "avx512-vnni"))
EVERY = {lv.name for lv in LEVELS}


def test_the_best_level_the_cpu_can_run_is_chosen():
    assert choose(VNNI.needs | {"amx_tile"}, EVERY) == VNNI
    assert choose(AVX2.needs | {"avx512f"}, EVERY) == AVX2  # AVX-512 in part is not the level


def test_a_level_missing_from_the_directory_is_passed_over():
    assert choose(VNNI.needs, {"avx2"}) == AVX2
    assert choose(VNNI.needs, set()) is None


def test_a_cpu_below_the_floor_gets_none():
    assert choose(AVX2.needs - {"fma"}, EVERY) is None
    assert choose(frozenset(), EVERY) is None


def test_the_flags_are_read_from_this_cpu():
    flags = cpu_kernels.cpu_flags()
    assert "fpu" in flags  # every x86-64 CPU lists it; an empty set would mean a parse failure
