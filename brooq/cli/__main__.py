"""``python -m brooq.cli``: the brooq command."""

import sys

from brooq.cli import main

sys.exit(main())
