"""Which flags a runner adds to mlx's kernel compiles (exod.runner.cpu.jit_flags): pure parts."""

from __future__ import annotations

from exod.runner.cpu.jit_flags import script, wanted

CPU = """processor\t: 0
vendor_id\t: GenuineIntel
flags\t\t: fpu vme sse sse2 ssse3 fma cx16 sse4_1 sse4_2 avx f16c avx2 avx512f
bugs\t\t: spectre_v1
"""


def test_all_three_on_a_cpu_that_has_them() -> None:
    assert wanted(CPU, "x86_64") == ("-mavx2", "-mfma", "-mf16c")


def test_none_when_one_is_missing_or_on_another_architecture() -> None:
    assert wanted(CPU.replace(" fma", ""), "x86_64") == ()
    assert wanted(CPU.replace(" f16c", ""), "x86_64") == ()
    assert wanted(CPU, "aarch64") == ()
    assert wanted("processor\t: 0\n", "x86_64") == ()  # no flags line at all


def test_a_flag_is_matched_whole_not_as_part_of_another() -> None:
    # avx512f holds "avx", fma4 holds "fma": neither stands for the flag itself.
    assert wanted("flags\t: sse2 avx512f fma4 f16c avx2\n", "x86_64") == ()


def test_the_shim_passes_the_flags_then_the_callers_options() -> None:
    text = script("/usr/bin/g++", ("-mavx2", "-mfma"))
    assert text.startswith("#!/bin/sh\n")
    assert 'exec "/usr/bin/g++" -mavx2 -mfma -ffp-contract=off "$@"\n' in text
