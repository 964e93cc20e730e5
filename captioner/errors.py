"""Exception types for bad user input; scripts turn them into one line and a non-zero exit."""


class CaptionerError(Exception):
    """Base class: the message is one sentence naming the input and what was expected."""


class DatasetError(CaptionerError):
    """A dataset file, folder or split that is missing or malformed."""


class CheckpointError(CaptionerError):
    """A checkpoint folder that is missing files, corrupt, or not a captioner checkpoint."""


class ImageError(CaptionerError):
    """An image file that cannot be decoded safely."""


class ConfigError(CaptionerError, ValueError):
    """A configuration value of the wrong type, out of range or unknown; ``field``/``value`` name it."""

    def __init__(self, field: str, value: object, problem: str):
        self.field, self.value, self.problem = field, value, problem
        shown = repr(value) if isinstance(value, str) else str(value)
        super().__init__(f"{field} = {shown[:80]} {problem}")

    def __reduce__(self):  # DataLoader workers pickle exceptions: rebuild from the three parts
        return type(self), (self.field, self.value, self.problem)


class RegionError(CaptionerError, ValueError):
    """A region that is not a box inside the image (or a mask of its size), or more regions than a caption holds
    (``captioner.decoding.regions``; here so that requests can be checked where torch is not installed)."""
