"""``python -m agentrl`` is the ``agentrl`` command."""

import sys

from agentrl.cli.main import main

sys.exit(main())
