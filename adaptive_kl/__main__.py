"""`python -m adaptive_kl ...` is the `adaptive-kl` command."""

import sys

from .console import main


sys.exit(main())
