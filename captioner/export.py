"""``python -m captioner.export``: the documented name of the command in ``captioner.commands.export`` (the console scripts' code
lives in captioner/commands/; docs/ARCHITECTURE.md, "Entry names")."""

if __name__ == "__main__":
    from captioner.commands.export import cli

    raise SystemExit(cli())
