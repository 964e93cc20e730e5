"""``python -m captioner.evaluate``: the documented name of the command in ``captioner.commands.evaluate`` (the console scripts' code
lives in captioner/commands/; docs/ARCHITECTURE.md, "Entry names")."""

if __name__ == "__main__":
    from captioner.commands.evaluate import cli

    raise SystemExit(cli())
