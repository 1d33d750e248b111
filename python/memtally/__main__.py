"""python3 -m memtally: usage, ps, admit, release, watch."""
import sys

from .client import main

sys.exit(main())
