#!/usr/bin/env python3
"""Can the test matrix skip Inductor's per-process CPU vector-ISA check?

    python tools/vec_isa_probe.py      # prints TORCHINDUCTOR_VEC_ISA_OK=1, or nothing

Before its first C++ kernel, every process that compiles with Inductor on
CPU decides which vector ISAs (AVX2, AVX-512, ...) it may use: for each one
the CPU flags list, it builds a small test library and loads it in a fresh
Python that imports torch (``torch._inductor.cpu_vec_isa.VecISA.check_build``).
The answer is cached in the process only, so every process pays it again:
about 10 s on the 2-core CI machine, and the matrix starts dozens of
Inductor processes (the suites, the two-rank tests, the cache tests'
children, the ablation's and the series check's pytest runs).

``TORCHINDUCTOR_VEC_ISA_OK=1`` makes Inductor trust the CPU flags without
the build. This probe runs the real check once, and prints the setting only
if it gives the very same ISAs as trusting the flags does: then the setting
changes nothing about the kernels Inductor builds on this machine, only how
often it asks. Where a compiler cannot build for an ISA the CPU has, it
prints nothing and every process checks for itself, as without the probe.
"""

from __future__ import annotations

import sys

SETTING = "TORCHINDUCTOR_VEC_ISA_OK=1"


def isa_names(trust_cpu_flags: bool) -> list[str]:
    """The vector ISAs Inductor would use, by its own check or by the CPU
    flags alone (``config.cpp.vec_isa_ok``)."""
    from torch._inductor import config, cpu_vec_isa

    _forget_answers(cpu_vec_isa)
    try:
        with config.patch({"cpp.vec_isa_ok": True if trust_cpu_flags else None}):
            return [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()]
    finally:
        _forget_answers(cpu_vec_isa)


def _forget_answers(cpu_vec_isa) -> None:
    """Inductor caches each answer per process, the list and (on several
    ISA classes) ``__bool__`` itself, without the setting in the key: the
    second way of asking would get the first one's answer."""
    cpu_vec_isa.valid_vec_isa_list.cache_clear()
    for cls in vars(cpu_vec_isa).values():
        if isinstance(cls, type) and issubclass(cls, cpu_vec_isa.VecISA):
            for attr in vars(cls).values():
                clear = getattr(attr, "cache_clear", None)
                if clear is not None:
                    clear()


def skipping_is_safe() -> bool:
    return isa_names(trust_cpu_flags=False) == isa_names(trust_cpu_flags=True)


def main() -> int:
    # asked once each: the check builds and loads libraries (seconds)
    checked, trusted = isa_names(trust_cpu_flags=False), isa_names(trust_cpu_flags=True)
    if checked == trusted:
        print(SETTING)
    else:
        print(f"the ISA check and the CPU flags disagree: {checked} vs {trusted}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
