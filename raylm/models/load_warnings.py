"""What transformers logs while it loads a model, kept with the load's outcome.

transformers logs its load report (mismatched, missing and unexpected weights) as a warning and then, for a
mismatch, raises an error that ends "For details look at the above report!". In a scoring actor "above" is not
where the user looks: the error reaches the driver as one line with its traceback in raylm-error.log
(raylm.cluster.failures), while the report went to the actor's stderr, which Ray forwards to the driver's terminal
whenever its log monitor gets to it, often after the error line and the exit. So a failed load carries the
warnings it logged on its error (as notes, which a traceback prints), and a load that succeeds logs them as
transformers would have.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from logging.handlers import BufferingHandler

TRANSFORMERS_LOGGER = "transformers"  # the library's root logger: its own stderr handler, no propagation


@contextmanager
def held_transformers_warnings() -> Iterator[None]:
    """transformers' log records, held while the block runs: added to its exception as notes if it raises, else
    handed to transformers' handlers as they would have been. Loads in one process run one at a time (an actor
    loads its model(s) in turn), so records of another thread's load are not expected here."""
    logger = logging.getLogger(TRANSFORMERS_LOGGER)
    handlers = logger.handlers[:]
    held = _Held(capacity=0)
    logger.handlers[:] = [held]
    try:
        yield
    except BaseException as e:
        for record in held.buffer:
            e.add_note(f"transformers logged ({record.levelname}): {record.getMessage()}")
        raise
    finally:
        logger.handlers[:] = handlers
    for record in held.buffer:
        logger.callHandlers(record)


class _Held(BufferingHandler):
    """Holds every record until the block ends."""

    def shouldFlush(self, record: logging.LogRecord) -> bool:  # noqa: N802 - logging's name
        return False
