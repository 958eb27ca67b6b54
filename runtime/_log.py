"""Structured logging: one JSON object per line, bound to the node that wrote it.

The library only emits; entry points (``bin/``, node processes) call
``configure_logging`` once, so importing the runtime never reconfigures an
application's logging.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

LOGGER_NAME = "relaytrain"


def get_logger(**bound: object) -> structlog.typing.FilteringBoundLogger:
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(LOGGER_NAME)
    return logger.bind(**bound)


def configure_logging(level: str = "info", stream: TextIO | None = None) -> None:
    """Render every event as a JSON line with an ISO timestamp and its level."""
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(stream or sys.stderr),
        cache_logger_on_first_use=True,
    )
