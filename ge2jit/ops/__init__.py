"""Ops: each one owns its folder here and its templates under kernel_templates/<op>/. Importing
an op package registers its ops with the tools (``runtime.registry``), in the order of the
lines below (the tools list them so, the default op first); adding an op is one line here."""

from . import gemm  # noqa: F401, I001 - imported for their registrations
from . import optim  # noqa: F401
from . import softmax  # noqa: F401
from . import cross_entropy  # noqa: F401
from . import norm  # noqa: F401
from . import quantize  # noqa: F401
from . import rope  # noqa: F401
from . import attention  # noqa: F401
