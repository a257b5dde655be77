"""`python -m adaptive_kl ...` is the `adaptive-kl` command."""

import sys

from .cli import main


sys.exit(main())
