"""`python -m coopmat.codegen`: the entry point; the tool itself is coopmat.tools.codegen."""

import sys

from coopmat.tools.codegen import main

if __name__ == "__main__":
    sys.exit(main())
