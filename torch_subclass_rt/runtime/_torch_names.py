"""torch-internal names the runtime builds on, resolved once on first use.

These exist unchanged (same module, same meaning) in every torch the runtime
supports; resolving them lazily keeps ``import torch_subclass_rt`` from
importing AOTAutograd.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace


@functools.cache
def aot() -> SimpleNamespace:
    from torch._functorch._aot_autograd import descriptors, schemas
    from torch._functorch._aot_autograd.runtime_wrappers import (
        coerce_to_expected_memory_format,
    )

    return SimpleNamespace(
        PlainTensorMeta=schemas.PlainTensorMeta,
        SubclassCreationMeta=schemas.SubclassCreationMeta,
        MemoryFormatMeta=schemas.MemoryFormatMeta,
        AOTInput=descriptors.AOTInput,
        SubclassGetAttrAOTInput=descriptors.SubclassGetAttrAOTInput,
        SubclassGetAttrAOTOutput=descriptors.SubclassGetAttrAOTOutput,
        SubclassSizeAOTInput=descriptors.SubclassSizeAOTInput,
        SubclassSizeAOTOutput=descriptors.SubclassSizeAOTOutput,
        SubclassStrideAOTInput=descriptors.SubclassStrideAOTInput,
        SubclassStrideAOTOutput=descriptors.SubclassStrideAOTOutput,
        coerce_to_expected_memory_format=coerce_to_expected_memory_format,
    )
