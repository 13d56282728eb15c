"""`python -m rtpo` is the `rtpo` command."""

from rtpo.commands.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
