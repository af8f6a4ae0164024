"""User-facing errors: the CLI prints their message as one line, never a traceback."""


class Seq2SeqError(Exception):
    """A problem the user can fix; the message names the problem and the fix."""


class ConfigError(Seq2SeqError):
    """A config value is wrong (unknown name, out-of-range number)."""


class DataError(Seq2SeqError):
    """A corpus is missing, unreadable or malformed."""


class CheckpointError(Seq2SeqError):
    """A checkpoint or run folder is missing or corrupt."""
