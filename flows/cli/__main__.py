"""`python -m flows.cli`: the `slm-nightly` console script without installing the package."""

import sys

from flows.cli import main

sys.exit(main())
