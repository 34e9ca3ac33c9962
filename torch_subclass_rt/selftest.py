"""``python -m torch_subclass_rt selftest``: compile a subclass with an opaque
attr forward and backward, and check the properties the feature promises."""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch


def _checks() -> list[tuple[str, Callable[[], None]]]:
    from torch._dynamo.testing import CompileCounterWithBackend

    from .examples.mesh_tensor import MeshHandle, MeshTensor

    def run(backend: str, backward: bool) -> None:
        torch._dynamo.reset()
        counter = CompileCounterWithBackend(backend)

        @torch.compile(backend=counter, fullgraph=True)
        def f(x):
            return x.sin() * 2

        for name in ("mesh-a", "mesh-b"):
            mesh = MeshHandle(name)
            local = torch.randn(4)
            x = MeshTensor(local, mesh).requires_grad_(backward)
            out = f(x)
            if type(out) is not MeshTensor or out.mesh is not mesh:
                raise AssertionError(f"output carries {getattr(out, 'mesh', None)!r}, not {mesh!r}")
            torch.testing.assert_close(out._local, local.sin() * 2)
            if backward:
                out.sum().backward()
                grad = x.grad
                if type(grad) is not MeshTensor or grad.mesh is not mesh:
                    raise AssertionError(f"grad carries {getattr(grad, 'mesh', None)!r}, not {mesh!r}")
                torch.testing.assert_close(grad._local, local.cos() * 2)
        if counter.frame_count != 1:
            raise AssertionError(f"{counter.frame_count} compiles for two meshes, expected 1")

    return [
        ("eager backend, forward", lambda: run("eager", False)),
        ("aot_eager, forward (new mesh: no recompile, runtime object)", lambda: run("aot_eager", False)),
        ("aot_eager, forward+backward", lambda: run("aot_eager", True)),
        ("inductor, forward+backward", lambda: run("inductor", True)),
    ]


def main() -> int:
    import torch_subclass_rt as tsrt

    try:
        st = tsrt.install()
    except tsrt.UnsupportedTorchVersion as e:
        print(f"selftest: {e}")
        return 2
    print(f"selftest on {st!r}")
    failed = 0
    for name, check in _checks():
        try:
            check()
            print(f"  PASS  {name}")
        except Exception as e:  # noqa: BLE001 - report every check
            failed += 1
            print(f"  FAIL  {name}: {type(e).__name__}: {e}")
    print(f"selftest: {len(_checks()) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
