"""Train a captioner: a thin shell over ``captioner.commands.train`` (see ``python train.py --help``).

    python train.py --config recipes/shapes-soft.toml --out runs/soft
"""

import sys

from captioner.commands.train import cli, config_from_args, get_args_parser, main  # noqa: F401

if __name__ == "__main__":
    sys.exit(cli())
