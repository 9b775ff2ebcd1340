"""``python -m servefleet.sim.server --model Qwen2.5-7B --gpu H200-SXM ...``"""

import sys

from servefleet.sim.server.cli import main

if __name__ == "__main__":
    sys.exit(main())
