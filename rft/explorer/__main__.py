"""``python -m rft.explorer --config F [key=value ...]``: one explorer task."""

import sys

from rft.explorer.loop import main

sys.exit(main())
