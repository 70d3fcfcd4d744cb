"""``python -m agentrl`` is the ``agentrl`` command."""

import sys

from agentrl.cli import main

sys.exit(main())
