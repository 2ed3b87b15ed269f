"""``python -m rft.trainer --config F [key=value ...]``: the trainer (one process per rank)."""

import sys

from rft.trainer.loop import main

sys.exit(main())
