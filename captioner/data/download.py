"""``python -m captioner.data.download``: the documented name of the command in ``captioner.commands.download`` (the console scripts' code
lives in captioner/commands/; docs/ARCHITECTURE.md, "Entry names")."""

if __name__ == "__main__":
    from captioner.commands.download import cli

    raise SystemExit(cli())
