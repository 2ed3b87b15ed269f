"""Trinity-RFT's ``get_logger`` (``trinity.utils.log``): the logger a workflow or reward module
writes through. rft has no Ray actors: every logger writes to the role's log file
(``<run>/log/explorer-<rank>.log``) through the root handlers the explorer sets up, so
``in_ray_actor`` has no effect and is accepted for Trinity's call shape."""

from __future__ import annotations

import logging
from typing import Optional


def get_logger(
    name: Optional[str] = None, level: Optional[int] = None, in_ray_actor: bool = False
) -> logging.Logger:
    """The logger ``name`` (the root logger's children write to the role's log), at ``level``
    when given."""
    logger = logging.getLogger(name)
    if level is not None:
        logger.setLevel(level)
    return logger
