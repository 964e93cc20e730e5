"""Caption image files, folders and glob patterns in batches: a thin shell over captioner.commands.caption.

    python caption.py photos/ "more/*.png" --output captions.jsonl --attention-dir figures/
    torchrun --standalone --nproc_per_node=2 caption.py photos/ --output captions.jsonl
"""

import sys

from captioner.commands.caption import (CSV_FIELDS, RECORD_PREFIX, OutputError, Writer, cli,  # noqa: F401
                                        get_args_parser, main, read_done)

if __name__ == "__main__":
    sys.exit(cli())
