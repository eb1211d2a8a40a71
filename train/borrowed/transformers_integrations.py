"""What we borrow from transformers' integrations (transformers 5.25, ``transformers/integrations/``): a patch that
keeps TrainingArguments from importing the model code. Nothing here imports transformers until it is used."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

from train.borrowed.touch import borrows

INTEGRATIONS = "transformers.integrations"


@borrows("transformers", "5.25", "integrations/__init__.py is_kubeflow_available (lazy), training_args.py")
@contextlib.contextmanager
def kubeflow_check_answered_by(answer: Callable[[], bool]) -> Iterator[None]:
    """Inside this block, ``transformers.integrations.is_kubeflow_available`` is ``answer`` (transformers 5.25:
    ``TrainingArguments.__post_init__`` imports it from ``integrations/__init__.py``, a lazy module whose first
    lookup of the name imports ``integrations/integration_utils.py`` and with it ``modeling_utils`` and every
    model-loading integration, 1.6 s of the launcher's 3.5 s here). The patch sets the name on the lazy module, so
    the lookup finds it without that import, and pops it after, so that later lookups resolve through the lazy
    module again. Where integration_utils is loaded already nothing changes. There is no public way to build
    TrainingArguments without that import."""
    if f"{INTEGRATIONS}.integration_utils" in sys.modules:
        yield
        return
    import transformers.integrations as integrations  # the library's own import, paid only when used

    integrations.is_kubeflow_available = answer
    try:
        yield
    finally:
        vars(integrations).pop("is_kubeflow_available", None)
