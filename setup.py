from setuptools import find_packages, setup

setup(
    name="torch-subclass-rt",
    version="0.1.0",
    description=(
        "Opaque (non-tensor) attrs in a tensor subclass's __tensor_flatten__ "
        "under torch.compile, on torch 2.10 and 2.11 (backport) and >= 2.12 (native)"
    ),
    packages=find_packages(include=["torch_subclass_rt", "torch_subclass_rt.*"]),
    python_requires=">=3.10",
    # torch is not pinned here: the package supports 2.10.0 and 2.11.0
    # (backport) and >= 2.12 (native); install the torch you run first (see
    # README). The floor must admit every backport release, or installing
    # this package upgrades the torch a session installed first.
    install_requires=["torch>=2.10"],
    # numpy: torch.testing._internal (device-type test instantiation) imports it;
    # hypothesis: the property-based differential suite (test/differential)
    # bench: the plot of benchmarks/scaling.py (optional; skipped without it)
    extras_require={
        "test": ["pytest", "expecttest", "numpy", "hypothesis"],
        "bench": ["matplotlib"],
    },
)
