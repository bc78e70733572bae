"""The public name of autopar's exceptions (``autopar.errors``). They are
defined in the shared leaf package (common/errors.py, installed as
autopar.common.errors) so the lower layers raise them without importing the
API layer."""
from autopar.common.errors import (AutoparError, LaunchError, SpecError,  # noqa: F401
                                   UnsupportedGraphError, WorkerFailedError)
