"""`python -m rtpo.compare ARGS` is `rtpo compare ARGS`."""

import sys

from rtpo.compare.command import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
