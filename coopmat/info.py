"""`python -m coopmat.info`: the entry point; the tool itself is coopmat.tools.info."""

import sys

from coopmat.tools.info import main

if __name__ == "__main__":
    sys.exit(main())
