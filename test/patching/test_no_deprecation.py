"""Using the package makes torch log no deprecation warning.

torch 2.14 renamed the opaque API and logs "<old name> is deprecated" each
time an old name is used (``_torch_compat``'s docstring has the table). A
user's log must not fill with those because of us: a fresh interpreter
imports the package, calls ``install()``, runs five compiled forward +
backward calls of ``MeshTensor`` (aot_eager) and ``uninstall()``. Every
record any logger emits (whatever its handlers and ``propagate``) and every
Python warning (DeprecationWarning included, from any module) is seen; of
those that say "deprecated", none may come from a call the package made
(the caller of the function that logged, or the importer of a module that
logs when imported, is in ``torch_subclass_rt``). A fresh interpreter
because some of them are logged once, at import.

Those torch makes itself are printed, not counted: stock torch 2.14.0 /
2.14.1's own partitioner calls ``is_opaque_value``
(``torch/_functorch/partitioners.py``), which logs "is_opaque_value is
deprecated" for a subclass with an opaque attr compiled forward+backward
(install() fixes that one in native+fixes:
test/points/test_partitioner_deprecated_name.py); some releases warn that
``torch.jit.script_method`` is deprecated when Inductor imports
``torch.utils.mkldnn``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import unittest

import harness

MODE = harness.current_mode()

_CHILD = textwrap.dedent(
    """
    import importlib, logging, os, sys, traceback, warnings

    _IMPORTLIB = os.path.dirname(importlib.__file__) + os.sep

    deprecations = []  # (whose, logger, message, call site)

    def _skipped(frame):
        return frame.filename.startswith("<frozen") or frame.filename in (
            logging.__file__, warnings.__file__
        )

    def call_site(stack):
        # the caller of the function that logged (or warned): skip the
        # logging / warnings machinery, then the deprecated function itself,
        # then the import machinery (a module that logs when imported)
        frames = [f for f in reversed(stack) if not _skipped(f)]
        emitter, rest = frames[0], frames[1:]
        if "torch_subclass_rt" in emitter.filename:
            return emitter
        return next(
            (
                f for f in rest
                if not (f.filename.startswith("<frozen") or f.filename.startswith(_IMPORTLIB))
            ),
            emitter,
        )

    _call_handlers = logging.Logger.callHandlers

    def call_handlers(self, record):
        # every record of every logger passes here, also those of loggers
        # that do not propagate to the root (torch's own)
        msg = record.getMessage()
        if "deprecated" in msg.lower():
            site = call_site(traceback.extract_stack()[:-1])
            # "<string>": this script, the package's user here
            whose = "ours" if (
                "torch_subclass_rt" in site.filename or site.filename == "<string>"
            ) else "torch"
            deprecations.append((whose, record.name, msg.splitlines()[0],
                                 f"{site.filename}:{site.lineno} {site.name}"))
        return _call_handlers(self, record)

    logging.Logger.callHandlers = call_handlers
    logging.captureWarnings(True)  # warnings -> the "py.warnings" logger
    warnings.simplefilter("always")  # DeprecationWarning too, from anywhere

    import torch
    import torch_subclass_rt as tsrt
    from torch_subclass_rt.examples.mesh_tensor import MeshHandle, MeshTensor

    st = tsrt.install(force=sys.argv[1] == "forced")
    print("installed:", st.mode, len(st.points), "point(s)")
    f = torch.compile(lambda x: (x.sin() * 2).cos().sum(), backend="aot_eager", fullgraph=True)
    for i in range(5):
        x = MeshTensor(torch.randn(4), MeshHandle(f"m{i}")).requires_grad_(True)
        f(x).backward()
        assert type(x.grad) is MeshTensor and x.grad.mesh is x.mesh
    tsrt.uninstall()
    assert tsrt.status().mode == "off"

    for whose, name, msg, site in dict.fromkeys(deprecations):
        print(f"DEPRECATION ({whose}) [{name}] {msg}  <- {site}")
    """
)


@unittest.skipIf(
    MODE == harness.Mode.PATCHED,
    "patched torch carries the feature in its sources; install() is not used there",
)
class TestNoDeprecation(unittest.TestCase):
    def test_install_compile_uninstall_log_no_deprecation(self):
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, MODE.value],
            capture_output=True, text=True, env=env, timeout=600,
        )
        out = proc.stdout + proc.stderr
        self.assertEqual(proc.returncode, 0, out)
        self.assertIn("installed:", proc.stdout)
        ours = [line for line in proc.stdout.splitlines() if line.startswith("DEPRECATION (ours)")]
        self.assertEqual(
            ours, [],
            f"torch {harness._torch_compat.torch_version()} logged deprecation warnings "
            "for calls the package made while it was imported, installed, used and "
            "uninstalled (use the release's own names, through _torch_compat):\n"
            + proc.stdout,
        )

if __name__ == "__main__":
    unittest.main()
