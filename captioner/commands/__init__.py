"""The command-line programs, inside the package so that console scripts work without the repository.

Each module holds ``get_args_parser()``, ``main(args) -> int`` and ``cli()`` (the console script: parse,
call ``main``, turn errors into one line through ``captioner.commands.runner.run``). The top-level ``train.py``,
``caption.py`` and ``app.py`` are thin shells that call the same ``cli()``.
"""
