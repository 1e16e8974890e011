"""`python -m hetccl`: the `hetccl` command."""

import sys

from ._cli import main

sys.exit(main())
