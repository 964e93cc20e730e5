"""Gradio app: upload an image, get its caption and explore where the model looked (see docs/app.md).

    python app.py                                   # every checkpoint under ./checkpoints, soft attention first
    python app.py --checkpoint checkpoints/shapes-soft --checkpoints-dir runs --port 7860

The code lives in captioner/commands/app.py (so `captioner-app` works from a wheel); this file re-exports it.
Module state (MODELS, STORE, SERVED) lives there too: patch ``captioner.commands.app``, not this module.
"""

import sys

from captioner.commands.app import (MODELS, SERVED, STORE, CaptionerError, build_demo, cli,  # noqa: F401
                                    explain_json, get_args_parser, gr, launch, main, predict, reset_word_view,
                                    resolve, word_view)



if __name__ == "__main__":
    sys.exit(cli())
