"""What a runner does before mlx runs anything, whichever kind of model it serves: the import
table before mlx_lm imports transformers, the compiler's flags before any kernel is compiled,
OpenBLAS before mlx resolves its BLAS symbols, and the kernels' precompiled header
(exod.runner.cpu)."""

from __future__ import annotations

from exod.runner.link.log import INFO, WARNING, log
from exod.wire.specs import RunnerSpec


def prepare(spec: RunnerSpec) -> str:
    """Everything above, in its order; the line on OpenBLAS for the load's log."""
    from exod.runner.cpu import blas, jit_flags, jit_header
    from exod.runner.start import import_table

    import_table.install()  # before mlx_lm imports transformers
    flags = jit_flags.install()  # before any kernel, and the header, is compiled
    have_blas, blas_msg = blas.preload()
    if spec.group is not None and spec.group.blas_threads is not None:
        blas.set_threads(spec.group.blas_threads)  # loaded already in a forked runner
    if not have_blas and "not Linux" not in blas_msg:
        log(blas_msg, WARNING)
    built = jit_header.ensure()  # before the model's first kernels are compiled
    if built:
        log(built)
    flags = jit_flags.settle(flags)
    if flags is not None:
        log(flags.line, WARNING if flags.warning else INFO)
    return blas_msg
