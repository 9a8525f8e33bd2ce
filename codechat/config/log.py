"""Messages to the user: one line each on stderr, through the ``codechat`` logger.

Library code takes a child logger (``log = logging.getLogger(__name__)``, a name under
``codechat``) and says ``log.warning("...")`` or ``log.info("...")`` in one line. The ``codechat``
command calls :func:`setup_cli_logging` once: every record of the ``codechat`` loggers at INFO or
above is printed on stderr as ``codechat: TEXT`` (``codechat: warning: TEXT`` at WARNING and above)
— no source line, no Python warning category — and under ``torchrun`` records below WARNING only
on rank 0. Without it (codechat used as a library) Python's last-resort handler prints warnings and
errors as their bare text, and tests read the records with pytest's ``caplog``.
"""
from __future__ import annotations

import logging
import os
import sys

ROOT = "codechat"  #: the logger every codechat module's logger descends from


class _StderrHandler(logging.StreamHandler):
    """A handler writing to whatever ``sys.stderr`` is when a record arrives (so a redirected or
    captured stderr gets the line), one line per record."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self):  # noqa: D401 - the current stderr
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ assigns it; the property ignores it
        pass

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING and os.environ.get("RANK", "0") != "0":
            return False  # under torchrun every rank runs the same command: rank 0 says it once
        return super().filter(record)


class _OneLine(logging.Formatter):
    """``codechat: TEXT`` (INFO) or ``codechat: warning: TEXT`` (WARNING and above: the level's
    name in lower case), newlines in the text joined into one line; a record logged with an
    exception (``log.exception``: an unexpected error, not a message) keeps its traceback."""

    def format(self, record: logging.LogRecord) -> str:
        text = " ".join(record.getMessage().split("\n"))
        level = "" if record.levelno < logging.WARNING else f"{record.levelname.lower()}: "
        # an unexpected error logged with its exception (log.exception) keeps the traceback below
        tb = "\n" + self.formatException(record.exc_info) if record.exc_info else ""
        return f"codechat: {level}{text}{tb}"


def setup_cli_logging(level: int = logging.INFO) -> logging.Logger:
    """Print the ``codechat`` loggers' records at ``level`` and above on stderr, one line each
    (module docstring). Calling it again changes nothing. Returns the ``codechat`` logger."""
    root = logging.getLogger(ROOT)
    if not any(isinstance(h, _StderrHandler) for h in root.handlers):
        handler = _StderrHandler()
        handler.setFormatter(_OneLine())
        root.addHandler(handler)
    root.setLevel(level)
    return root
