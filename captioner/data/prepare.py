"""``python -m captioner.data.prepare``: the documented name of the command in ``captioner.commands.prepare`` (the console scripts' code
lives in captioner/commands/; docs/ARCHITECTURE.md, "Entry names")."""

if __name__ == "__main__":
    from captioner.commands.prepare import cli

    raise SystemExit(cli())
