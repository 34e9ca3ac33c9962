"""pytest's entry to the suite: torch is put in the mode under test before
any test module is imported.

Note [The mode is set before a test module runs]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A test module's own code (an opaque registered with members, a custom op
whose schema names DeviceMesh, a subclass in :mod:`fixtures`) needs
``install()`` to have run on a backport torch. Under pytest this conftest
calls :func:`harness.setup_mode` before collection imports any module; a
test file run as a script (``PYTHONPATH=test python test/runtime/test_x.py``, its ``run_tests()``
entry point) has no conftest, so importing ``harness`` sets the mode there
(``harness._main_is_a_test_file``). A spawned rank is neither: the rank
entry point sets it (:func:`fixtures.run_ranks`).

pytest puts this folder on ``sys.path`` (it holds no ``__init__.py``), so a
test module anywhere below imports ``harness`` and ``fixtures``.
"""

import harness

harness.setup_mode()
