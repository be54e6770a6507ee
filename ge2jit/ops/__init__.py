"""Ops: each one owns its folder here and its templates under kernel_templates/<op>/. Importing
an op package registers its ops with the tools (``runtime.registry``); adding an op is one line
here."""

from . import (  # noqa: F401 - imported for their registrations
    gemm,
    norm,
    optim,
    softmax,
)
