"""Exception types for bad user input; scripts turn them into one line and a non-zero exit."""


class CaptionerError(Exception):
    """Base class: the message is one sentence naming the input and what was expected."""


class DatasetError(CaptionerError):
    """A dataset file, folder or split that is missing or malformed."""


class CheckpointError(CaptionerError):
    """A checkpoint folder that is missing files, corrupt, or not a captioner checkpoint."""


class ImageError(CaptionerError):
    """An image file that cannot be decoded safely."""
