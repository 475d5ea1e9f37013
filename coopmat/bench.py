"""`python -m coopmat.bench`: the entry point; the tool itself is coopmat.tools.bench."""

import sys

from coopmat.tools.bench import main

if __name__ == "__main__":
    sys.exit(main())
